"""A self-contained HTML report: inline CSS, inline SVG (or base64 PNG) charts, no scripts,
no network. Open it from disk in any browser.

:func:`render` lays out plain data (:class:`Chart`, :class:`~kernel.bulk.summary.TraceSummary`,
a kernel's resolution and provenance); :func:`trace_report` and :func:`anatomy_report` gather
that data from a priced trace and/or a :class:`~kernel.facade.kernel.Kernel`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections import Counter
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline import safe_output

from ..bulk.summary import RESOURCES, TraceSummary, summarise
from ..facade.summary import anatomy_sweep, batch_limit, bottleneck_grid
from ..model.display import fmt_duration, fmt_span
from . import charts
from .accuracy import accuracy_charts, accuracy_section
from .blocks import CHART_IDS, Chart, chart_html
from .blocks import table as _table
from .sections import ReportContext, Section, build_sections

if TYPE_CHECKING:

    from kernel.facade.kernel import Kernel

__all__ = [
    "CHART_IDS",
    "Chart",
    "anatomy_report",
    "kernel_charts",
    "render",
    "trace_charts",
    "trace_report",
    "write",
]

_CSS = """
:root { --fg:#1d2430; --muted:#5b6573; --line:#dde2ea; --bg:#fff; --band:#f5f7fa;
  --sm:#1f77b4; --hbm:#ff7f0e; --nvlink:#2ca02c; --nic:#d62728; --host:#9467bd; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
  color:var(--fg); background:var(--bg); }
header { padding:24px 32px 12px; border-bottom:1px solid var(--line); background:var(--band); }
header h1 { margin:0 0 4px; font-size:24px; }
header p { margin:0; color:var(--muted); }
main { max-width:1180px; margin:0 auto; padding:8px 32px 48px; }
h2 { margin:32px 0 8px; font-size:19px; border-bottom:1px solid var(--line); padding-bottom:4px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(170px,1fr)); gap:12px;
  margin:16px 0; }
.card { border:1px solid var(--line); border-radius:8px; padding:10px 14px; background:var(--bg); }
.card .k { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.card .v { font-size:21px; font-weight:600; }
.card .s { color:var(--muted); font-size:12px; }
.shares { display:flex; height:22px; border-radius:5px; overflow:hidden; margin:8px 0 4px;
  border:1px solid var(--line); }
.shares span { display:block; height:100%; }
.legend span { display:inline-block; margin-right:14px; font-size:13px; }
.legend i { display:inline-block; width:11px; height:11px; border-radius:2px; margin-right:5px;
  vertical-align:-1px; }
figure { margin:18px 0; }
figure svg, figure img { width:auto; height:auto; max-width:100%; display:block; }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
table { border-collapse:collapse; font-size:13px; margin:8px 0; }
th, td { border-bottom:1px solid var(--line); padding:4px 10px; text-align:left;
  vertical-align:top; }
th { background:var(--band); font-weight:600; }
td.n { text-align:right; font-variant-numeric:tabular-nums; }
code { font-size:12.5px; }
.m-measured,.m-literature,.m-vendor_spec { color:#1a7f37; }
.m-assumed { color:#b35900; }
details summary { cursor:pointer; color:var(--muted); margin:6px 0; }
footer { color:var(--muted); font-size:12px; margin-top:40px; }
"""


def _card(key: str, value: str, sub: str = "") -> str:
    return (f'<div class="card"><div class="k">{escape(key)}</div>'
            f'<div class="v">{escape(value)}</div>'
            + (f'<div class="s">{escape(sub)}</div>' if sub else "") + "</div>")


def _summary_html(s: TraceSummary) -> str:
    ratio = s.evidence_ratio
    cards = [
        _card("batches", f"{s.batches:,}", f"{s.requests:,} request-steps, {s.tokens:,} tokens"),
        _card("wall time", fmt_span(s.total_no_overlap_ns),
              f"{fmt_duration(s.total_no_overlap_ns)} NoOverlap, steps back to back; "
              f"Overlap {fmt_duration(s.total_overlap_ns)}"),
        _card("p50 step", fmt_duration(s.p50_no_overlap_ns),
              f"Overlap {fmt_duration(s.p50_overlap_ns)}"),
        _card("p99 step", fmt_duration(s.p99_no_overlap_ns),
              f"max {fmt_duration(s.max_no_overlap_ns)}"),
    ]
    gpu = s.gpu_ns()
    if gpu is not None:
        cards.insert(2, _card("GPU time", f"{gpu / 1e9:,.0f} GPU-s",
                              f"wall time × {s.gpus} GPUs of the pool (NoOverlap)"))
    if s.over_limit is not None:
        which = ", ".join(f"{name} {n:,}" for name, n in s.over_limit.items() if n)
        cards.append(_card("over a deployment limit", f"{s.over_limit_batches:,}",
                           which or "no batch breaks a limit"))
    if s.evidence is not None:
        cards.append(_card("evidence", f"{ratio:.0%}" if ratio is not None else "-",
                           f"{s.evidence[0]}/{s.evidence[1]} provenance entries"))
    shares = s.bottleneck_share("time")
    bar = "".join(
        f'<span style="width:{100 * v:.3f}%;background:{charts.COLORS.get(r, "#7f7f7f")}" '
        f'title="{escape(r)} {v:.1%}"></span>' for r, v in shares.items() if v > 0)
    legend = "".join(
        f'<span><i style="background:{charts.COLORS.get(r, "#7f7f7f")}"></i>'
        f"{escape(charts.LABELS.get(r, r))}: {shares[r]:.1%} of time, "
        f"{s.bottleneck_batches.get(r, 0):,} batches</span>" for r in shares)
    rows = [(r, f"{s.bottleneck_batches.get(r, 0):,}",
             f"{s.bottleneck_share('batches').get(r, 0.0):.1%}",
             fmt_duration(s.bottleneck_time_ns.get(r, 0)), f"{shares.get(r, 0.0):.1%}",
             fmt_duration(s.resource_time_ns.get(r, 0)) if r in s.resource_time_ns else "-")
            for r in [*shares, *[x for x in RESOURCES if x not in shares
                                 and s.resource_time_ns.get(x)]]]
    table = _table(["resource", "binds (batches)", "share of batches", "time when binding",
                    "share of time", "busy time (all batches)"], rows,
                   numeric=(1, 2, 3, 4, 5), cls="bottlenecks")
    return (f'<section id="summary"><h2>Trace summary</h2><div class="cards">{"".join(cards)}'
            f'</div><div class="shares" id="bottleneck-shares">{bar}</div>'
            f'<div class="legend">{legend}</div>{table}</section>')


def _config_html(k: Kernel) -> str:
    r = k.resolved_pool
    facts = [("scenario", getattr(r, "scenario", "")), ("pool", getattr(r, "pool_index", "")),
             ("role", getattr(r, "role", "")), ("model", getattr(r, "model_name", "")),
             ("chip", getattr(r, "chip_name", "")),
             ("served dtype", getattr(r, "served_dtype", ""))]
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size",
                 "num_spec_tokens", "uniform_decode_width", "cudagraph_mode", "cache_layout"):
        if hasattr(r, name):
            facts.append((name, getattr(r, name)))
    try:
        modes = k.graph_modes()
        facts.append(("graph modes (decode, other)", f"{modes[0]}, {modes[1]}"))
    except Exception:  # noqa: BLE001 - optional detail
        pass
    res = k.resolved()
    for f in dataclasses.fields(res):
        if f.name != "overrides":
            facts.append((f.name, getattr(res, f.name)))
    out = ['<section id="configuration"><h2>Resolved configuration</h2>',
           _table(["setting", "value"], facts, cls="config")]
    overrides = list(res.overrides)
    out.append(f"<h3>Overrides ({len(overrides)})</h3>")
    if overrides:
        out.append(_table(["field", "requested", "resolved", "reason"],
                          [(o.field, o.requested, o.resolved, o.reason) for o in overrides],
                          cls="overrides"))
    else:
        out.append("<p>None: every stated setting was used as stated.</p>")
    out.append("</section>")
    return "".join(out)


def _provenance_html(k: Kernel) -> str:
    rows = k.provenance()
    ev, total, assumed = k.evidence()
    by_method = Counter(o.method for o in rows)
    ratio = f"{ev / total:.0%}" if total else "-"
    out = ['<section id="provenance"><h2>Provenance and evidence</h2>',
           f"<p><strong>{ev}/{total}</strong> provenance entries ({ratio}) rest on evidence "
           "(measured, literature or vendor specification); "
           f"{len(assumed)} are assumed.</p>",
           _table(["method", "entries", "share"],
                  [(m, n, f"{n / total:.1%}" if total else "-")
                   for m, n in sorted(by_method.items(), key=lambda kv: (-kv[1], kv[0]))],
                  numeric=(1, 2), cls="methods")]
    out.append(f'<details open><summary>All {len(rows)} entries</summary>')
    out.append(_table(["name", "set", "method", "scope"],
                      [(o.name, o.set, o.method, o.scope) for o in rows],
                      row_class=[f"m-{o.method}" for o in rows], cls="provenance"))
    out.append("</details></section>")
    return "".join(out)


def render(*, title: str, subtitle: str = "", summary: TraceSummary | None = None,
           charts_: Sequence[Chart] = (), kernel: Kernel | None = None,
           extra_sections: Sequence[str] = (), sections: Sequence[Section] = ()) -> str:
    """The whole page as one string: summary, ``extra_sections`` (trusted HTML fragments),
    the trace ``sections`` (:mod:`kernel.report.sections`), the charts, configuration and
    provenance."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
             f"<header><h1>{escape(title)}</h1>"
             + (f"<p>{escape(subtitle)}</p>" if subtitle else "") + "</header><main>"]
    if summary is not None:
        parts.append(_summary_html(summary))
    parts.extend(extra_sections)
    parts.extend(sec.render(chart_html) for sec in sections)
    if charts_:
        parts.append('<section id="charts"><h2>Charts</h2>')
        parts.extend(chart_html(c) for c in charts_)
        parts.append("</section>")
    if kernel is not None:
        parts.append(_config_html(kernel))
        parts.append(_provenance_html(kernel))
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<footer>Generated by blis-kernel on {stamp}. Times are integer nanoseconds "
                 "in the data, shown in µs/ms/s. NoOverlap sums the resources a step uses; "
                 "Overlap lets them run concurrently. Wall time is the sum of step times "
                 "(steps back to back); GPU time is wall time × the pool's GPUs."
                 "</footer></main></body></html>")
    return "\n".join(parts)


# -- gathering the data -----------------------------------------------------------------------

def kernel_charts(k: Kernel, *, context: int = 4096, embed: str = "svg",
                  png_dir: Path | None = None) -> list[Chart]:
    """The step-anatomy chart and the bottleneck map of one kernel."""
    name = getattr(k.resolved_pool, "scenario", "")
    points = anatomy_sweep(k, context)
    limit = batch_limit(k, context)
    fig = charts.anatomy_figure(points, context=context, title=f"Step anatomy: {name}",
                                limit=limit)
    held = f" The pool holds at most {limit.size:,} ({limit.reason})." if limit else ""
    out = [Chart.of(fig, CHART_IDS["anatomy"], "Step anatomy",
                    f"Per-resource time and Overlap/NoOverlap of a uniform decode step at "
                    f"context {context:,}, batch size 1…{points[-1].batch_size if points else 0}."
                    + held, embed)]
    if png_dir is not None:
        charts.save(fig, png_dir / "anatomy.png")
    grid = bottleneck_grid(k)
    holds = {c: lim.size for c in grid.contexts if (lim := batch_limit(k, c)) is not None}
    fig = charts.bottleneck_map_figure(grid, title=f"Binding resource: {name}", limits=holds)
    out.append(Chart.of(fig, CHART_IDS["bottleneck_map"], "Bottleneck map",
                        "The resource that binds a uniform decode step at each batch size and "
                        "context length; hatched: batches beyond max_num_seqs or the KV "
                        "capacity at that context.", embed))
    if png_dir is not None:
        charts.save(fig, png_dir / "bottleneck_map.png")
    return out


def _with_prefill(priced: pl.DataFrame) -> pl.Series | None:
    """Per batch: does it carry prefill work (None when the frame cannot say)."""
    if "prefill_requests" not in priced.columns:
        return None
    return priced["prefill_requests"] > 0


def trace_charts(priced: pl.DataFrame, summary: TraceSummary, *, embed: str = "svg",
                 png_dir: Path | None = None) -> list[Chart]:
    """The step-time distribution and the time-by-bottleneck charts of a priced trace."""
    fig = charts.step_time_histogram_figure(priced["no_overlap_ns"],
                                            with_prefill=_with_prefill(priced))
    out = [Chart.of(fig, CHART_IDS["step_time"], "Step-time distribution",
                    f"NoOverlap time of each of the {summary.batches:,} batches; "
                    f"p50 {fmt_duration(summary.p50_no_overlap_ns)}, "
                    f"p99 {fmt_duration(summary.p99_no_overlap_ns)}.", embed)]
    if png_dir is not None:
        charts.save(fig, png_dir / "step_time.png")
    fig = charts.time_by_bottleneck_figure(summary)
    out.append(Chart.of(fig, CHART_IDS["by_bottleneck"], "Time by bottleneck",
                        "Wall time (Σ NoOverlap) of the steps each resource binds: the shares "
                        "of time that compare and sweep report.", embed))
    if png_dir is not None:
        charts.save(fig, png_dir / "by_bottleneck.png")
    return out


def trace_report(priced: pl.DataFrame, k: Kernel | None = None, *,
                 title: str = "blis-kernel: priced trace", subtitle: str = "",
                 context: int = 4096, embed: str = "svg", png_dir: Path | None = None,
                 summary: TraceSummary | None = None, trace: Any = None) -> str:
    """The full report: summary, the trace sections (throughput, step time along the trace,
    step time vs tokens, utilisation, KV occupancy, limits, layer kinds), the distribution
    charts, (with a kernel) anatomy, map, configuration and provenance. ``trace`` (the
    request-level trace) adds the per-layer-kind breakdown of the median steps."""
    summary = summary or summarise(priced, k)
    ctx = ReportContext(priced, summary, k, trace, embed, png_dir)
    secs = build_sections(ctx)
    cs = trace_charts(priced, summary, embed=embed, png_dir=png_dir)
    sections: list[str] = []
    if "measured_ns" in priced.columns:  # measured step times: the accuracy part (issue 11)
        sections.append(accuracy_section(priced))
        cs += accuracy_charts(priced, embed=embed, png_dir=png_dir)
    if k is not None:
        cs += kernel_charts(k, context=context, embed=embed, png_dir=png_dir)
        if not subtitle:
            r = k.resolved_pool
            subtitle = (f"{r.scenario}: {r.model_name} on {r.chip_name}, "
                        f"tp={k.resolved().tensor_parallel()}")
    return render(title=title, subtitle=subtitle, summary=summary, charts_=cs, kernel=k,
                  extra_sections=sections, sections=secs)


def anatomy_report(k: Kernel, *, context: int = 4096, embed: str = "svg") -> str:
    """Anatomy and bottleneck map of one scenario, with its configuration and provenance."""
    r = k.resolved_pool
    return render(title=f"Step anatomy: {r.scenario}",
                  subtitle=f"{r.model_name} on {r.chip_name}",
                  charts_=kernel_charts(k, context=context, embed=embed), kernel=k)


def write(text: str, path: str | Path) -> Path:

    path = Path(path)
    with safe_output.atomic(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
