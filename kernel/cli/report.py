"""``blis-kernel anatomy``, ``report`` and ``compare``: charts and reports.

* ``anatomy SCENARIO -o FILE``: step anatomy (per-resource time, Overlap/NoOverlap against
  decode batch size at a fixed context). ``.png``/``.svg``/``.pdf`` write the chart;
  ``.html`` writes a page with the anatomy, the bottleneck map, the resolved configuration
  and the provenance table.
* ``report PRICED.parquet [--scenario S] -o FILE``: the report of a priced trace (the output
  of ``blis-kernel price``). ``.html``: the full report (with ``--scenario``, also the
  anatomy, map, configuration and provenance); ``.png``/``.svg``: the step-time distribution.
* ``compare TRACE --scenario A --scenario B … [-o FILE]``: prices one trace under several
  deployments and prints total time, p50/p99 and the bottleneck shift against the first;
  ``-o`` writes the comparison chart (``.png``/``.svg``) or a page (``.html``).
"""

from __future__ import annotations

import dataclasses
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from kernel.cli.common import make_repos, with_repos
from kernel.cli.output import (
    TEXT_FORMATS,
    emit_rows,
    format_options,
    protect_key,
    resolve_format,
)
from kernel.cli.output import console as output_console
from kernel.report.compare import compare_lines, compare_rows, compare_summaries, open_kernel
from pipeline import safe_output

from .dialect import DialectCommand, complete_scenario

if TYPE_CHECKING:
    from kernel.bulk.summary import TraceSummary
    from kernel.facade.kernel import Kernel
    from pipeline.load import Repos

DEFAULT_SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
CHART_SUFFIXES = (".png", ".svg", ".pdf")


def open_for_cli(scenario: str, repos: Repos | None = None) -> Kernel:
    """:func:`open_kernel`, turning a document problem or a refusal into a one-line CLI
    error (exit 1) instead of a traceback."""
    from pipeline.errors import DocumentError, RefusalError

    try:
        return open_kernel(scenario, repos)
    except (DocumentError, RefusalError, FileNotFoundError) as exc:
        from kernel.cli.errors import describe

        where = f"{scenario}: " if isinstance(exc, RefusalError) else ""  # a document names its file
        raise click.ClickException(where + describe(exc)) from None


def _suffix(path: str | Path) -> str:
    return Path(path).suffix.lower()


def _check_output(path: str, allowed: tuple[str, ...]) -> None:
    if _suffix(path) not in allowed:
        raise click.BadParameter(f"{path}: the suffix must be one of {', '.join(allowed)}",
                                 param_hint="-o/--output")


def _compare_table(summaries: list[TraceSummary], names: list[str]) -> Table:
    from kernel.model.display import fmt_duration

    table = Table(title="One trace, several deployments (NoOverlap; shares are of wall time)")
    table.add_column("scenario", no_wrap=True)
    for col in ("wall", "Δ wall", "GPU-s", "p50", "p99", "Δ p99"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("binds most", no_wrap=True)
    base = summaries[0]
    for i, (s, name) in enumerate(zip(summaries, names, strict=True)):
        shares = s.bottleneck_share("time")
        top = max(shares, key=lambda r: shares[r]) if shares else "-"
        rel = (s.total_no_overlap_ns / base.total_no_overlap_ns - 1
               if base.total_no_overlap_ns else 0.0)
        rel99 = (s.p99_no_overlap_ns / base.p99_no_overlap_ns - 1
                 if base.p99_no_overlap_ns else 0.0)
        gpu = s.gpu_ns()
        table.add_row(name, fmt_duration(s.total_no_overlap_ns), "-" if i == 0 else f"{rel:+.1%}",
                      "-" if gpu is None else f"{gpu / 1e9:,.0f}",
                      fmt_duration(s.p50_no_overlap_ns), fmt_duration(s.p99_no_overlap_ns),
                      "-" if i == 0 else f"{rel99:+.1%}",
                      f"{top} ({shares.get(top, 0.0):.0%})" if shares else "-")
    return table


def _serving_report(directory: str, output: str, scenario: str | None,
                    trace_path: str | None) -> None:
    """``report OUT_DIR -o FILE.html``: the serving section of a replay's directory."""
    from kernel.report import html
    from kernel.report.serving import is_serving_dir, read_serving, serving_report

    if not is_serving_dir(directory):
        raise click.BadParameter(f"{directory} is a directory but not a replay's output (no "
                                 "requests.parquet from `blis-kernel replay`, no curve.parquet "
                                 "from `replay --rates`)", param_hint="PRICED")
    if scenario is not None or trace_path is not None:
        raise click.UsageError("--scenario and --trace apply to a priced trace; a replay's "
                               "directory names its own scenario: drop them")
    _check_output(output, (".html",))
    safe_output.check_outputs([], [("-o", output)])
    try:
        data = read_serving(directory)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    html.write(serving_report(data), output)
    click.echo(f"wrote {output}")


def register(group: click.Group) -> None:
    @group.command("anatomy", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
                  help="Output file: .png, .svg, .pdf (the chart) or .html (a page).")
    @click.option("--context", default=4096, show_default=True, type=click.IntRange(1),
                  help="Context length of every decode request (tokens).")
    @click.option("--max-batch", default=256, show_default=True, type=click.IntRange(1, 4096),
                  help="Largest decode batch size.")
    @with_repos
    def anatomy(scenario: str, output: str, context: int, max_batch: int,
                scenarios_root: str | None, catalog_root: str | None,
                registry_root: str | None) -> None:
        """Step anatomy of SCENARIO: where the time of a decode step goes, by batch size."""
        from kernel.facade.summary import anatomy_sweep, batch_limit
        from kernel.report import charts, html

        _check_output(output, (*CHART_SUFFIXES, ".html"))
        safe_output.check_outputs([], [("-o", output)])
        ctx = click.get_current_context()
        if _suffix(output) == ".html" and ctx.get_parameter_source("max_batch") \
                is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--max-batch sets the chart's sweep (.png/.svg/.pdf); the "
                                   ".html page draws its own: drop the option or write a chart")
        k = open_for_cli(scenario, make_repos(scenarios_root, catalog_root, registry_root))
        if _suffix(output) == ".html":
            html.write(html.anatomy_report(k, context=context), output)
        else:
            points = anatomy_sweep(k, context, range(1, max_batch + 1))
            fig = charts.anatomy_figure(points, context=context,
                                        title=f"Step anatomy: {k.resolved_pool.scenario}",
                                        limit=batch_limit(k, context))
            charts.save(fig, output)
        click.echo(f"wrote {output}")

    @group.command("report", cls=DialectCommand)
    @click.argument("priced", type=click.Path(exists=True))
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
                  help="Output file: .html (the report) or .png/.svg/.pdf (the distribution).")
    @click.option("-s", "--scenario", default=None, shell_complete=complete_scenario,
                  help="The scenario the trace was priced on (default: the one the file's "
                       "stamp names; a different one is refused): adds the anatomy, "
                       "bottleneck map, KV capacity, limits, resolved configuration and "
                       "provenance.")
    @click.option("--trace", "trace_path", default=None,
                  type=click.Path(exists=True, dir_okay=False),
                  help="The request-level trace that was priced: adds the per-layer-kind "
                       "breakdown of the median decode and prefill steps.")
    @with_repos
    def report(priced: str, output: str, scenario: str | None, trace_path: str | None,
               scenarios_root: str | None,
               catalog_root: str | None, registry_root: str | None) -> None:
        """Report on a priced trace (PRICED.parquet from `blis-kernel price`), or on a
        replay's output directory (`blis-kernel replay`, with or without --rates)."""
        from kernel.bulk.summary import summarise
        from kernel.cli.stamped import kernel_for
        from kernel.io.priced import read_priced
        from kernel.report import charts, html

        if Path(priced).is_dir():  # a replay's outputs: the serving report (issue 29)
            _serving_report(priced, output, scenario, trace_path)
            return
        _check_output(output, (*CHART_SUFFIXES, ".html"))
        safe_output.check_outputs([("PRICED", priced), ("--trace", trace_path)],
                                  [("-o", output)])
        pf = read_priced(priced)
        frame = pf.frame
        missing = {"batch_id", "overlap_ns", "no_overlap_ns", "bottleneck"} - set(frame.columns)
        if missing:
            raise click.BadParameter(f"{priced} is not a priced trace: missing "
                                     f"{', '.join(sorted(missing))}", param_hint="PRICED")
        k = kernel_for(pf, scenario, make_repos(scenarios_root, catalog_root, registry_root))
        summary = summarise(frame, k, scenario=scenario or pf.scenario)
        if _suffix(output) == ".html":
            html.write(html.trace_report(frame, k, summary=summary, trace=trace_path,
                                         title=f"blis-kernel: {Path(priced).name}"), output)
        else:
            mask = frame["prefill_requests"] > 0 if "prefill_requests" in frame.columns else None
            charts.save(charts.step_time_histogram_figure(frame["no_overlap_ns"],
                                                          with_prefill=mask), output)
        for line in summary.lines():
            click.echo(line)
        click.echo(f"wrote {output}")

    @group.command("compare", cls=DialectCommand)
    @click.argument("traces", nargs=-1, required=True,
                    type=click.Path(exists=True, dir_okay=False))
    @click.option("-s", "--scenario", "scenarios", multiple=True, shell_complete=complete_scenario,
                  help="A deployment to price the trace on (repeat; the first is the base). "
                       "Priced files name their own; given for them, each must agree.")
    @click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
                  help="Also write the comparison: .png/.svg/.pdf (chart) or .html (page).")
    @click.option("--decode-threshold", default=None, type=click.IntRange(0),
                  help="scheduled > threshold is a prefill (default: each scenario's "
                       "decode width).")
    @format_options(TEXT_FORMATS, output=False)
    @with_repos
    def compare(traces: tuple[str, ...], scenarios: tuple[str, ...], output: str | None,
                decode_threshold: int | None, fmt: str | None, scenarios_root: str | None,
                catalog_root: str | None, registry_root: str | None) -> None:
        """Price one TRACE under several deployments and show the differences; or compare
        priced files (from `price` or a sweep), each on the scenario its stamp names."""
        from kernel.bulk.summary import summarise
        from kernel.cli.stamped import is_priced, priced_files
        from kernel.report import charts, html

        if output is not None:
            _check_output(output, (*CHART_SUFFIXES, ".html"))
            safe_output.check_outputs([("TRACE", t) for t in traces], [("-o", output)])
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        trace = traces[0]
        priced = [is_priced(t) for t in traces]
        if all(priced):
            if decode_threshold is not None:
                raise click.UsageError("--decode-threshold prices a trace; priced files were "
                                       "priced already: drop it")
            files, kernels_, names = priced_files(list(traces), list(scenarios), repos)
            summaries = [dataclasses.replace(summarise(pf.frame, k), scenario=n)
                         for pf, k, n in zip(files, kernels_, names, strict=True)]
        elif len(traces) > 1:
            raise click.UsageError("give one trace to price, or priced files only: "
                                   f"{', '.join(t for t, p in zip(traces, priced, strict=True) if not p)} "
                                   "carry no priced stamp")
        else:
            if not scenarios:
                raise click.UsageError(f"{trace} is a trace, not a priced file: give "
                                       "--scenario (repeat) to price it on")
            names = list(scenarios)
            kernels = [open_for_cli(n, repos) for n in names]
            summaries, _ = compare_summaries(Path(trace), kernels, repos, decode_threshold)
            summaries = [dataclasses.replace(s, scenario=n) for s, n in zip(summaries, names,
                                                                              strict=True)]
        if resolve_format(fmt, None, TEXT_FORMATS) != "table":
            emit_rows(compare_rows(summaries, names), fmt, None)
        else:
            output_console().print(protect_key(_compare_table(summaries, names)))
            for line in compare_lines(summaries, names):
                click.echo(line)
        for s, n in zip(summaries, names, strict=True):
            if s.rows_rejected:  # the trace's bad rows: priced nowhere, said everywhere
                why = ", ".join(f"{r} {c:,}" for r, c in s.reject_reasons.items())
                click.echo(f"{n}: {s.rows_rejected:,} trace rows rejected, not priced"
                           + (f" ({why})" if why else ""), err=True)
        if output is None:
            return
        fig = charts.compare_figure(summaries, names, title=f"{Path(trace).name} on "
                                    f"{len(names)} deployment{'s' if len(names) > 1 else ''}")
        if _suffix(output) == ".html":
            chart = html.Chart.of(fig, html.CHART_IDS["compare"], "Comparison",
                                  "Wall time (NoOverlap, steps back to back) split by binding "
                                  "resource — shares of time, as sweep reports them — and "
                                  "p50/p99 step time, per deployment.")
            rows = "".join(
                f"<tr><td>{n}</td><td class='n'>{s.batches:,}</td>"
                f"<td class='n'>{s.total_no_overlap_ns:,}</td>"
                f"<td class='n'>{'-' if s.gpu_ns() is None else f'{s.gpu_ns():,}'}</td>"
                f"<td class='n'>{s.p50_no_overlap_ns:,}</td>"
                f"<td class='n'>{s.p99_no_overlap_ns:,}</td></tr>"
                for n, s in zip((escape(x) for x in names), summaries, strict=True))
            table = ("<section id='compare'><h2>Totals (ns)</h2><table><thead><tr>"
                     "<th>scenario</th><th>batches</th><th>wall time (NoOverlap)</th>"
                     "<th>GPU time (GPU-ns)</th><th>p50</th>"
                     f"<th>p99</th></tr></thead><tbody>{rows}</tbody></table></section>")
            html.write(html.render(title=f"blis-kernel: {Path(trace).name} compared",
                                   subtitle=", ".join(names), charts_=[chart],
                                   extra_sections=[table]), output)
        else:
            charts.save(fig, output)
        click.echo(f"wrote {output}")
