"""The report's sections about a priced trace.

A section builder takes a :class:`ReportContext` and returns a :class:`Section` (or None when
the data it needs is absent). :data:`SECTION_BUILDERS` lists them in page order. Sections degrade honestly: when a column is missing the
section says which one and how to get it, instead of drawing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kernel.model import step
from kernel.model.types import Batch

from ..bulk.summary import TraceSummary
from ..model.display import fmt_duration, fmt_si
from . import charts
from . import trace_figures as tf
from . import trace_stats as ts
from .blocks import Chart, table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kernel.facade.kernel import Kernel

__all__ = [
    "SECTION_BUILDERS",
    "SECTION_IDS",
    "ReportContext",
    "Section",
    "build_sections",
]

SECTION_IDS = {
    "throughput": "throughput",
    "timeline": "step-timeline",
    "tokens": "step-vs-tokens",
    "utilisation": "utilisation",
    "kv": "kv-occupancy",
    "limits": "limits",
    "layers": "layer-kinds",
}
SCATTER_POINTS = 40_000


@dataclass
class ReportContext:
    """Everything a section may read. ``trace`` is the request-level trace (optional)."""

    priced: pl.DataFrame
    summary: TraceSummary
    kernel: Kernel | None = None
    trace: Any = None  # a polars/Arrow table or a parquet/CSV/IPC path
    embed: str = "svg"
    png_dir: Path | None = None
    _windows: ts.Windows | None = None
    _limits: ts.Limits | None = None

    @property
    def windows(self) -> ts.Windows:
        if self._windows is None:
            self._windows = ts.windows(self.priced["no_overlap_ns"].to_numpy())
        return self._windows

    @property
    def limits(self) -> ts.Limits:
        if self._limits is None:
            r = self.kernel.resolved_pool if self.kernel is not None else None
            self._limits = ts.limit_flags(
                self.priced,
                max_num_batched_tokens=int(getattr(r, "max_num_batched_tokens", 0) or 0),
                max_num_seqs=int(getattr(r, "max_num_seqs", 0) or 0),
                kv_blocks_capacity=(int(cap.num_blocks) if self.has("kv_blocks")
                                    and (cap := self.kv_capacity()) is not None else 0))
        return self._limits

    def kv_capacity(self) -> Any:
        """The kernel's KV capacity, or None without a kernel that can say."""
        if self.kernel is None or not hasattr(self.kernel, "kv_capacity"):
            return None
        return self.kernel.kv_capacity()

    def has(self, *columns: str) -> bool:
        return all(c in self.priced.columns for c in columns)

    def column(self, name: str) -> np.ndarray:
        return self.priced[name].to_numpy()


@dataclass
class Section:
    """One ``<section>`` of the page: an id, a heading, text, charts (``Chart``) and HTML."""

    id: str
    title: str
    intro: str = ""
    charts: list[Any] = field(default_factory=list)
    html: str = ""  # trusted fragment after the charts (tables)

    def render(self, chart_html: Callable[[Any], str]) -> str:
        intro = f"<p>{escape(self.intro)}</p>" if self.intro else ""
        body = "".join(chart_html(c) for c in self.charts)
        return (f'<section id="{escape(self.id)}" class="trace-section">'
                f"<h2>{escape(self.title)}</h2>{intro}{body}{self.html}</section>")


SectionBuilder = Callable[[ReportContext], Section | None]


def _chart(ctx: ReportContext, fig: Figure, element_id: str, title: str, caption: str,
           png_name: str) -> Any:

    if ctx.png_dir is not None:
        charts.save(fig, ctx.png_dir / png_name)
    return Chart.of(fig, element_id, title, caption, ctx.embed)


def _table(header: list[str], rows: Any, *, numeric: tuple[int, ...] = (), cls: str = "") -> str:

    return table(header, rows, numeric=numeric, cls=cls)


def _batch_rows(trace: Any, batch_id: int) -> pl.DataFrame:
    """The rows of one batch, in trace order, from a table or (lazily) from a file."""
    want = pl.col("batch_id") == batch_id
    if isinstance(trace, pl.DataFrame):
        return trace.filter(want)
    if isinstance(trace, str | Path):
        p = Path(trace)
        if p.suffix.lower() == ".csv":
            return pl.scan_csv(p).filter(want).collect()
        if p.suffix.lower() in (".arrow", ".ipc", ".feather"):
            return pl.scan_ipc(p).filter(want).collect()
        return pl.scan_parquet(p).filter(want).collect()
    frame = pl.from_arrow(trace)
    assert isinstance(frame, pl.DataFrame)
    return frame.filter(want)


def _missing(sid: str, title: str, what: str) -> Section:
    return Section(sid, title, html=f'<p class="missing">{escape(what)}</p>')


# -- the sections ---------------------------------------------------------------------------

def throughput_section(ctx: ReportContext) -> Section | None:
    if ctx.priced.height == 0 or not ctx.has("tokens", "requests"):
        return None
    w = ctx.windows
    toks = ctx.column("tokens").astype(np.float64)
    if ctx.has("prefill_tokens"):
        pre = ctx.column("prefill_tokens").astype(np.float64)
        series = {"prefill": w.sums(pre), "decode": w.sums(toks - pre)}
        split = "prefill and decode separately"
    else:
        series = {"all": w.sums(toks)}
        split = ("all tokens (the priced trace has no prefill_tokens column; price with "
                 "--utilisation to split by phase)")
    reqs = ctx.column("requests")
    fig = tf.throughput_figure(w, series, w.sums(reqs) / w.counts, w.maxes(reqs))
    wall = ctx.summary.total_no_overlap_ns / 1e9
    rates = ", ".join(f"{k} {v.sum() / wall:,.0f} tokens/s" for k, v in series.items()) \
        if wall else "-"
    cid = "chart-throughput"
    return Section(SECTION_IDS["throughput"], "Throughput",
                   f"Tokens per second of wall time, {split}; whole trace: {rates}. Requests "
                   "in flight are the requests scheduled in each step.",
                   [_chart(ctx, fig, cid, "Tokens per second and requests in flight",
                           f"Windows of {w.size:,} consecutive steps; wall time is the sum of "
                           "NoOverlap step times (steps back to back).", "throughput.png")])


def timeline_section(ctx: ReportContext) -> Section | None:
    if ctx.priced.height == 0:
        return None
    w = ctx.windows
    lim = ctx.limits
    over = w.any(lim.any) if lim.flags else None
    fig = tf.step_timeline_figure(w, over)
    return Section(SECTION_IDS["timeline"], "Step time along the trace",
                   "Warm-up, bursts and drain: the p50, p99 and max NoOverlap step time of each "
                   f"window of {w.size:,} steps ({w.n:,} windows, so a trace of any length "
                   "draws the same number of points).",
                   [_chart(ctx, fig, "chart-step-timeline", "Rolling p50 / p99 step time",
                           "Quantiles are nearest-rank within each window.", "timeline.png")])


def tokens_section(ctx: ReportContext) -> Section | None:
    if ctx.priced.height == 0 or not ctx.has("tokens"):
        return None
    toks = ctx.column("tokens")
    keep = np.flatnonzero(toks > 0)
    pick = keep[ts.sample_rows(keep.size, SCATTER_POINTS)]
    bott = ctx.priced["bottleneck"].gather(pick).cast(pl.String).to_numpy()
    fig = tf.step_time_vs_tokens_figure(toks[pick], ctx.column("no_overlap_ns")[pick], bott,
                                        keep.size)
    return Section(SECTION_IDS["tokens"], "Step time against batch tokens",
                   "Where the binding resource changes with the batch: each point is a step "
                   "with tokens (empty steps are left out), coloured by its bottleneck.",
                   [_chart(ctx, fig, "chart-step-vs-tokens", "Step time vs batch tokens",
                           f"Up to {SCATTER_POINTS:,} steps, drawn as one raster layer.",
                           "step_vs_tokens.png")])


def utilisation_section(ctx: ReportContext) -> Section | None:
    sid, title = SECTION_IDS["utilisation"], "Utilisation: MFU and MBU"
    if ctx.priced.height == 0:
        return None
    if not ctx.has("mfu", "mbu", "flops", "hbm_bytes"):
        return _missing(sid, title, "The priced trace has no utilisation columns (flops, "
                        "hbm_bytes, mfu, mbu): price it with `blis-kernel price --utilisation`.")
    t = ctx.column("no_overlap_ns").astype(np.float64)
    total = t.sum() or 1.0
    mfu, mbu = ctx.column("mfu"), ctx.column("mbu")
    # The wall-time-weighted mean of per-step MFU is Σ FLOPs / (Σ time × peak): the trace's MFU.
    whole_mfu, whole_mbu = float((mfu * t).sum() / total), float((mbu * t).sum() / total)
    fig = tf.utilisation_figure(mfu, mbu, ctx.column("no_overlap_ns"), whole_mfu, whole_mbu)
    flops = float(ctx.column("flops").sum())
    hbm = float(ctx.column("hbm_bytes").sum())
    net = sum(float(ctx.column(c).sum()) for c in ("nvlink_bytes", "nic_bytes") if ctx.has(c))
    rows = [("MFU (whole trace)", f"{whole_mfu:.1%}"), ("MBU (whole trace)", f"{whole_mbu:.1%}"),
            ("FLOPs per rank", fmt_si(flops, "FLOP")), ("HBM bytes per rank", fmt_si(hbm, "B")),
            ("network bytes per rank (NVLink + NIC)", fmt_si(net, "B"))]
    table = _table(["whole trace", "value"], rows, numeric=(1,), cls="utilisation")
    return Section(sid, title,
                   "How busy the GPU is, per rank, from the kernel's own FLOP and byte counts: "
                   "MFU = FLOPs / (NoOverlap time × the chip's dense peak for the served dtype), "
                   "MBU = HBM bytes / (NoOverlap time × the chip's catalog HBM bandwidth).",
                   [_chart(ctx, fig, "chart-utilisation", "MFU / MBU distribution",
                           "Bars: share of wall time spent in steps at that utilisation; "
                           "dashed: the whole trace.", "utilisation.png")], table)


def kv_section(ctx: ReportContext) -> Section | None:
    sid, title = SECTION_IDS["kv"], "KV occupancy"
    if ctx.priced.height == 0:
        return None
    if not ctx.has("kv_blocks"):
        return _missing(sid, title, "The priced trace has no kv_blocks column: price it with "
                        "`blis-kernel price --utilisation`.")
    cap = ctx.kv_capacity()
    if ctx.kernel is None or cap is None:
        return _missing(sid, title, "KV capacity needs the scenario: pass --scenario.")
    w = ctx.windows
    blocks = ctx.column("kv_blocks")
    note = f"{cap.num_blocks:,} blocks, {cap.tokens:,} tokens"
    fig = tf.kv_occupancy_figure(w, w.sums(blocks) / w.counts, w.maxes(blocks),
                                 int(cap.num_blocks), note)
    over = int((blocks > cap.num_blocks).sum())
    return Section(sid, title,
                   "KV blocks held by the requests scheduled in each step (block_size "
                   f"{ctx.kernel.resolved_pool.block_size}; requests waiting outside the step "
                   f"are not in a trace, so this is a lower bound) against kv_capacity ({note}"
                   f"{', utilization assumed' if cap.utilization_assumed else ''}). "
                   f"{over:,} steps exceed it.",
                   [_chart(ctx, fig, "chart-kv-occupancy", "KV occupancy vs kv_capacity",
                           f"Windows of {w.size:,} steps.", "kv_occupancy.png")])


def limits_section(ctx: ReportContext) -> Section | None:
    if ctx.priced.height == 0:
        return None
    lim = ctx.limits
    n = ctx.priced.height
    if not lim.checked:
        return _missing(SECTION_IDS["limits"], "Steps over a limit",
                        "No limit could be checked: the trace has no limits column and no "
                        "scenario was given (--scenario).")
    ids = ctx.column("batch_id")
    rows = [(name, f"{int(f.sum()):,}", f"{f.sum() / n:.2%}",
             ", ".join(f"{int(b):,}" for b in ids[f][:5]) or "-")
            for name, f in lim.flags.items()]
    rows.append(("any limit", f"{lim.count:,}", f"{lim.count / n:.2%}", ""))
    table = _table(["limit", "steps over", "share of steps", "first batch ids"], rows,
                   numeric=(1, 2), cls="limits")
    return Section(SECTION_IDS["limits"], "Steps over a limit",
                   f"{lim.count:,} of {n:,} steps break a deployment limit ({lim.source}); "
                   "their windows are ticked in red on the step-time chart above.",
                   html=table)


def layers_section(ctx: ReportContext) -> Section | None:
    sid, title = SECTION_IDS["layers"], "Per layer kind: median decode and prefill steps"
    if ctx.priced.height == 0:
        return None
    if ctx.kernel is None or ctx.trace is None:
        return _missing(sid, title, "The per-layer breakdown re-prices the median steps: it "
                        "needs the scenario and the request-level trace (--scenario, --trace).")

    r = ctx.kernel.resolved_pool
    width = max(int(getattr(r, "uniform_decode_width", 1) or 1), 1)
    steps = []
    for label, prefill in (("decode", False), ("prefill", True)):
        row = ts.median_step(ctx.priced, prefill)
        if row is None:
            continue
        bid = int(ctx.priced["batch_id"][row])
        reqs = _batch_rows(ctx.trace, bid)
        thr = (int(reqs["decode_threshold"][0]) if "decode_threshold" in reqs.columns
               else width)
        batch = Batch(list(zip(reqs["scheduled"].to_list(), reqs["computed"].to_list(),
                               strict=True)), decode_threshold=thr)
        est = ctx.kernel.step_time(batch)
        steps.append((f"{label} (batch {bid:,})", int(est.no_overlap),
                      step.layer_breakdown(r, batch)))
    if not steps:
        return None
    fig = tf.layer_breakdown_figure(steps)
    body = []
    for name, ns, layer_rows in steps:
        for lr in layer_rows:
            terms = tf.layer_terms(lr)
            body.append((name, lr["kind"], lr["count"],
                         *(fmt_duration(v * 1e9) for v in terms.values()),
                         f"{sum(terms.values()) * 1e9 / ns:.1%}",
                         max(terms, key=lambda t: terms[t])))
    table = _table(["step", "kind", "layers", "SM", "HBM", "NVLink", "NIC", "share of step",
                    "largest resource"], body, numeric=(2, 3, 4, 5, 6, 7), cls="layer-kinds")
    return Section(sid, title,
                   "The median decode-only step and the median step with prefill work "
                   "(nearest-rank, by NoOverlap), re-priced layer by layer: what each layer "
                   "kind adds to the step's NoOverlap time, by resource.",
                   [_chart(ctx, fig, "chart-layer-kinds", "Layer kinds of the median steps",
                           "Per-resource time summed over the layers of each kind.",
                           "layer_kinds.png")], table)


SECTION_BUILDERS: list[SectionBuilder] = [
    throughput_section, timeline_section, tokens_section, utilisation_section, kv_section,
    limits_section, layers_section,
]


def build_sections(ctx: ReportContext) -> list[Section]:
    out = []
    for b in SECTION_BUILDERS:
        s = b(ctx)
        if s is not None:
            out.append(s)
    return out
