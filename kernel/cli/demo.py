"""``blis-kernel demo``: the main job on the embedded defaults.

Synthesises a realistic continuous-batching trace (:mod:`kernel.io.synth`), prices it in bulk on
the default scenario (:mod:`kernel.bulk`), and writes into ``--out`` (default ``out/``):

* ``trace.parquet`` — the synthetic trace (one row per request per step);
* ``priced.parquet`` — one row per batch: Overlap, NoOverlap, bottleneck, per-resource ns,
  and the utilisation columns (FLOPs, bytes, MFU, MBU, prefill tokens, KV blocks);
* ``report.html`` — a self-contained report (summary, charts, configuration, provenance);
* ``anatomy.png``, ``bottleneck_map.png``, ``step_time.png``, ``by_bottleneck.png`` and one
  PNG per trace section (throughput, timeline, step_vs_tokens, utilisation, kv_occupancy,
  layer_kinds);
* ``summary.json`` — the printed numbers;

then prints a short summary (batches, wall time, GPU time, bottleneck shares, p50/p99 step
time, evidence ratio). ``--all-scenarios`` also loads, validates and resolves every embedded
scenario (every pool) and prints what each one is and how much of it rests on evidence.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import polars as pl
from rich.console import Console
from rich.table import Table

from pipeline import safe_output
from pipeline.errors import DocumentError, RefusalError
from pipeline.load import Repos, open_inputs

from .common import make_repos, with_repos
from .dialect import DialectCommand, complete_scenario


def _scenario_names(repos: Repos) -> list[str]:
    return sorted(p.stem for p in repos.scenarios_root().glob("*.yaml"))


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def summarise_scenarios(repos: Repos) -> tuple[Table, int]:
    """A table row per scenario pool; returns the table and the number of pools refused."""
    table = Table(title=f"Embedded scenarios ({repos.scenarios_root()})")
    for col in ("scenario", "pool", "role", "model", "chip", "tp×dp (ep)", "status", "evidence"):
        table.add_column(col)
    can_validate = _has("pipeline.validate")
    can_build = _has("kernel.pool.build")
    failures = 0
    for name in _scenario_names(repos):
        try:
            first = open_inputs(name, repos, 0)
        except DocumentError as exc:
            failures += 1
            table.add_row(name, "-", "-", "-", "-", "-", f"[red]not loaded[/]: {exc.problems[0]}", "")
            continue
        for i, pool in enumerate(first.deployment.pools):
            inputs = first if i == 0 else open_inputs(name, repos, i)
            par = pool.parallel
            status, evidence = "[green]loaded[/]", ""
            try:
                if can_validate:
                    from pipeline.validate import check_inputs

                    report = check_inputs(inputs)
                    warnings = len(report.warnings())
                    status = ("[green]valid[/]" if report.ok() else "[red]invalid[/]") + (
                        f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")
                if can_build:
                    from kernel.facade.factory import new

                    k = new(inputs)
                    ev, total, _ = k.evidence()
                    evidence = f"{ev}/{total}"
                    status += ", [green]priced[/]"
            except (DocumentError, RefusalError) as exc:
                failures += 1
                status = f"[red]refused[/]: {str(exc).splitlines()[0]}"
            table.add_row(name, str(i), pool.role, inputs.model.name, inputs.chip.name,
                          f"{par.tp}×{max(par.dp, 1)} ({par.expert_parallel_width()})", status,
                          evidence)
    return table, failures


DEFAULT_SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
# A chat-like workload: ~64 requests in flight, long-tailed prompts (mean 2048 tokens, at most
# half of max_model_len) and outputs (mean 384, at most a quarter), prompts prefilled in chunks
# of up to 2048 tokens (or the scenario's max_num_batched_tokens, if smaller).
WORKLOAD: dict[str, Any] = {"requests_per_batch": 64.0, "prompt": "lognormal:2048:1.0",
                            "output": "lognormal:384:0.9"}
PREFILL_CHUNK = 2048


def run_demo(out: Path, batches: int, scenario: str = DEFAULT_SCENARIO,
             repos: Repos | None = None, seed: int = 0, *,
             echo: Callable[[str], None] = click.echo) -> dict[str, Any]:
    """The main job; returns the summary dict written to ``summary.json``."""
    from kernel import bulk
    from kernel.bulk.summary import summarise
    from kernel.bulk.utilisation import column_producer
    from kernel.cli.report import open_for_cli
    from kernel.io import stamp
    from kernel.io.synth import Lengths, write_synth
    from kernel.report import html
    from kernel.report.compare import decode_width

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    k = open_for_cli(scenario, repos)
    t_open = time.perf_counter()
    trace = out / "trace.parquet"
    budget = int(k.resolved_pool.max_num_batched_tokens)
    limit = max(int(k.resolved_pool.max_model_len), 64)
    stats = write_synth(trace, batches, seed=seed, max_num_batched_tokens=budget,
                        chunk=min(PREFILL_CHUNK, budget),
                        requests_per_batch=WORKLOAD["requests_per_batch"],
                        prompt=Lengths.parse(WORKLOAD["prompt"], hi=limit // 2),
                        output=Lengths.parse(WORKLOAD["output"], hi=limit // 4))
    t_synth = time.perf_counter()
    priced_path = out / "priced.parquet"
    made = stamp.for_kernel(k, trace=trace, decode_threshold=decode_width(k), sm_budget=0)
    counts = bulk.price_file(k, trace, priced_path, progress=False,
                             decode_threshold=decode_width(k),
                             metadata=made.to_metadata(), producers=[column_producer()])
    priced = pl.read_parquet(priced_path)
    t_price = time.perf_counter()
    summary = summarise(priced, k, scenario=scenario)
    r = k.resolved_pool
    subtitle = (f"{batches:,} steps of a synthetic chat-like trace ({stats.requests:,} requests, "
                f"~{stats.requests_per_batch:.0f} in flight, prefill chunks of up to "
                f"{stats.chunk:,} tokens) priced on {scenario}: {r.model_name} on "
                f"{r.chip_name}, tp={k.resolved().tensor_parallel()}")
    page = html.trace_report(priced, k, summary=summary, png_dir=out, subtitle=subtitle,
                             title="blis-kernel demo: a synthetic trace, priced", trace=trace)
    html.write(page, out / "report.html")
    t_report = time.perf_counter()
    result = summary.as_dict() | {
        "trace_rows": stats.rows, "chunk": stats.chunk, "workload": WORKLOAD,
        "over_budget_steps": stats.over_budget_steps,
        "rows_rejected": counts.rows_rejected,
        "seconds": {"open": round(t_open - t0, 3), "synth": round(t_synth - t_open, 3),
                    "price": round(t_price - t_synth, 3),
                    "report": round(t_report - t_price, 3),
                    "total": round(t_report - t0, 3)},
    }
    safe_output.write_text(out / "summary.json", json.dumps(result, indent=2) + "\n")
    echo(f"Synthesised a chat-like trace: {batches:,} batches, {stats.requests:,} requests, "
         f"~{stats.requests_per_batch:.0f} in flight per batch, prefill chunks of up to "
         f"{stats.chunk:,} tokens; priced on {scenario}.")
    echo("")
    for line in summary.lines():
        echo("  " + line)
    echo("")
    echo(f"Wrote {out / 'priced.parquet'}, {out / 'report.html'} and charts (*.png) "
         f"in {t_report - t0:.1f} s (pricing {counts.steps_per_second:,.0f} batches/s).")
    return result


def register(group: click.Group) -> None:
    @group.command("demo", cls=DialectCommand, renamed={"--out": "--output"})
    @click.option("-o", "--output", "out_dir", default="out", show_default=True,
                  type=click.Path(file_okay=False), help="Directory for the outputs.")
    @click.option("-n", "--batches", default=50000, show_default=True, type=click.IntRange(1),
                  help="Batches (steps) in the synthetic trace.")
    @click.option("-s", "--scenario", default=DEFAULT_SCENARIO, shell_complete=complete_scenario, show_default=True,
                  help="The scenario to price on (name or path).")
    @click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1))
    @click.option("--all-scenarios", is_flag=True,
                  help="Also load, validate and resolve every embedded scenario and print a "
                       "table.")
    @with_repos
    def demo(out_dir: str, batches: int, scenario: str, seed: int, all_scenarios: bool,
             scenarios_root: str | None, catalog_root: str | None,
             registry_root: str | None) -> None:
        """Run the main job: synthesise a trace, price it, write a report."""
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        failures = 0
        if all_scenarios:
            table, failures = summarise_scenarios(repos)
            Console().print(table)
        run_demo(Path(out_dir), batches, scenario, repos, seed,
                 echo=lambda line: click.echo(line, err=True))  # a summary: stderr (CF3)
        if failures:
            raise SystemExit(1)
