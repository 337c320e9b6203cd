"""Figures of a priced trace along its length: throughput, step time, utilisation, KV, limits,
and the per-layer-kind anatomy of the median steps.

Every function takes already-reduced data (:mod:`kernel.report.trace_stats`), so the cost of
drawing does not grow with the trace. Each axis carries one unit, named in its label; point
clouds are rasterised inside the SVG, so a chart's size does not grow with its points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..io.extras import require_charts

require_charts()  # before matplotlib: a missing extra is one line (CF7)

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

from ..bulk.summary import RESOURCES  # noqa: E402
from ..model.display import fmt_duration  # noqa: E402
from .charts import COLORS, LABELS, _new, _plain, _rc  # noqa: E402
from .trace_stats import Windows  # noqa: E402

__all__ = [
    "kv_occupancy_figure",
    "layer_breakdown_figure",
    "layer_terms",
    "step_time_vs_tokens_figure",
    "step_timeline_figure",
    "throughput_figure",
    "utilisation_figure",
    "wall_unit",
]


def wall_unit(total_ns: float) -> tuple[str, float]:
    """The unit of a wall-time axis spanning ``total_ns``: s, min, h or d."""
    s = total_ns / 1e9
    if s >= 2 * 86_400:
        return "d", 86_400e9
    if s >= 2 * 3_600:
        return "h", 3_600e9
    if s >= 2 * 60:
        return "min", 60e9
    return "s", 1e9


def step_unit(ns: float) -> tuple[str, float]:
    """The unit of a step-time axis whose largest value is ``ns``: µs or ms."""
    return ("ms", 1e6) if ns >= 2e6 else ("µs", 1e3)


def _log_minor(v: float, _pos: object = None) -> str:
    """Label the 2× and 5× minor ticks of a log axis in plain digits; leave the rest blank."""
    if v <= 0:
        return ""
    lead = v / 10 ** np.floor(np.log10(v) + 1e-9)
    return _plain(v) if round(lead, 6) in (2.0, 5.0) else ""


def _wall_x(w: Windows) -> tuple[np.ndarray, str]:
    unit, scale = wall_unit(float(w.wall_end_ns[-1]) if w.n else 0.0)
    start = np.concatenate(([0], w.wall_end_ns[:-1])) if w.n else np.zeros(0)
    return (start + w.wall_end_ns) / 2 / scale, unit


def throughput_figure(w: Windows, tokens: Mapping[str, np.ndarray], requests_mean: np.ndarray,
                      requests_max: np.ndarray) -> Figure:
    """Tokens per second of wall time, by phase, and requests in flight, per window."""
    fig = _new(9.0, 5.6)
    with _rc():
        ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
        x, unit = _wall_x(w)
        secs = np.where(w.wall_ns > 0, w.wall_ns / 1e9, np.nan)
        colors = {"prefill": "#dd8452", "decode": "#4c72b0", "all": "#555555"}
        for phase, toks in tokens.items():
            ax.plot(x, toks / secs, lw=1.2, color=colors.get(phase, "#555555"),
                    label=f"{phase} tokens/s")
        ax.set_ylabel("tokens per second of wall time")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.legend(loc="upper right", frameon=False, ncols=3)
        ax.set_ylim(bottom=0)
        ax2.fill_between(x, 0, requests_max, color="#b3c7e6", lw=0, label="max in a step")
        ax2.plot(x, requests_mean, color="#2b5d9b", lw=1.2, label="mean per step")
        ax2.set_ylabel("requests in the step")
        ax2.set_ylim(bottom=0)
        ax2.legend(loc="upper right", frameon=False, ncols=2)
        ax2.set_xlabel(f"wall time into the trace ({unit}), steps back to back")
        fig.suptitle(f"Throughput: windows of {w.size:,} steps")
    return fig


def step_timeline_figure(w: Windows, over_limit: np.ndarray | None = None) -> Figure:
    """NoOverlap step time along the trace: p50, p99 and max of each window; windows holding a
    step over a limit are ticked in red along the top."""
    fig = _new(9.0, 4.6)
    with _rc():
        ax = fig.add_subplot()
        x, unit = _wall_x(w)
        tu, ts = step_unit(float(w.max_ns.max()) if w.n else 0.0)
        ax.fill_between(x, w.p99_ns / ts, w.max_ns / ts, color="#f2c4c4", lw=0,
                        label="p99 … max")
        ax.plot(x, w.p99_ns / ts, color="#c44e52", lw=1.2, label="p99")
        ax.plot(x, w.p50_ns / ts, color="#2b5d9b", lw=1.4, label="p50")
        if over_limit is not None and over_limit.any():
            ax.plot(x[over_limit], np.full(int(over_limit.sum()), 1.0), "|", ms=10,
                    color="#d62728", transform=ax.get_xaxis_transform(), clip_on=False,
                    label=f"window with a step over a limit ({int(over_limit.sum()):,})")
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        ax.set_ylabel(f"NoOverlap step time ({tu})")
        ax.set_xlabel(f"wall time into the trace ({unit}), steps back to back")
        ax.legend(loc="upper left", frameon=False, ncols=4, fontsize=9)
        ax.set_title(f"rolling quantiles over windows of {w.size:,} steps", fontsize=9,
                     color="#444")
        fig.suptitle("Step time along the trace")
    return fig


def step_time_vs_tokens_figure(tokens: np.ndarray, no_overlap_ns: np.ndarray,
                               bottleneck: np.ndarray, total: int) -> Figure:
    """Each (sampled) step's NoOverlap time against its batch tokens, coloured by the
    resource that binds it."""
    fig = _new(9.0, 5.0)
    with _rc():
        ax = fig.add_subplot()
        tu, ts = step_unit(float(no_overlap_ns.max()) if no_overlap_ns.size else 0.0)
        present = [r for r in RESOURCES if (bottleneck == r).any()]
        present += sorted(set(bottleneck.tolist()) - set(RESOURCES))
        for r in present:
            m = bottleneck == r
            ax.scatter(tokens[m], no_overlap_ns[m] / ts, s=4, lw=0, alpha=0.55,
                       color=COLORS.get(r, "#7f7f7f"), rasterized=True,
                       label=f"{LABELS.get(r, r)} ({int(m.sum()):,})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(_plain))
            axis.set_minor_formatter(FuncFormatter(_log_minor))
        ax.set_xlabel("tokens in the step (batch tokens)")
        ax.set_ylabel(f"NoOverlap step time ({tu})")
        shown = int(tokens.size)
        note = (f"all {total:,} steps with tokens" if shown == total
                else f"a uniform random sample of {shown:,} of {total:,} steps with tokens")
        ax.set_title(note, fontsize=9, color="#444")
        ax.legend(loc="upper left", frameon=False, title="binding resource", markerscale=3)
        fig.suptitle("Step time against batch tokens, by bottleneck")
    return fig


def utilisation_figure(mfu: np.ndarray, mbu: np.ndarray, no_overlap_ns: np.ndarray,
                       trace_mfu: float, trace_mbu: float) -> Figure:
    """Distribution of per-step MFU and MBU, weighted by each step's wall time."""
    fig = _new(9.0, 4.2)
    with _rc():
        axes = fig.subplots(1, 2, sharey=True)
        weights = no_overlap_ns.astype(np.float64)
        total = weights.sum() or 1.0
        for ax, vals, name, whole, color in ((axes[0], mfu, "MFU", trace_mfu, "#1f77b4"),
                                             (axes[1], mbu, "MBU", trace_mbu, "#ff7f0e")):
            hi = max(1.0, float(np.nanmax(vals)) if vals.size else 1.0)
            bins = np.linspace(0.0, hi, 51)
            ax.hist(np.clip(vals, 0.0, hi), bins=bins, weights=weights / total, color=color,
                    alpha=0.9)
            ax.axvline(whole, color="black", ls="--", lw=1.4)
            ax.annotate(f"whole trace {whole:.1%}", xy=(whole, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(4, -14),
                        textcoords="offset points", fontsize=9)
            ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.set_xlabel(f"{name} (% of the chip's peak)")
        axes[0].set_ylabel("share of wall time")
        fig.suptitle("Utilisation per step: MFU (FLOPs) and MBU (HBM bytes), NoOverlap time")
    return fig


def kv_occupancy_figure(w: Windows, mean_blocks: np.ndarray, max_blocks: np.ndarray,
                        capacity: int, capacity_note: str) -> Figure:
    """KV blocks the step's requests hold, per window, against the pool's KV capacity."""
    fig = _new(9.0, 4.2)
    with _rc():
        ax = fig.add_subplot()
        x, unit = _wall_x(w)
        cap = max(capacity, 1)
        ax.fill_between(x, 0, max_blocks / cap, color="#c9e3c9", lw=0, label="max in a step")
        ax.plot(x, mean_blocks / cap, color="#2ca02c", lw=1.3, label="mean per step")
        ax.axhline(1.0, color="#d62728", lw=1.4, ls="--", label=f"kv_capacity ({capacity_note})")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylim(0, max(1.1, float(max_blocks.max() / cap) * 1.05 if max_blocks.size else 1.1))
        ax.set_ylabel("KV blocks held (% of kv_capacity)")
        ax.set_xlabel(f"wall time into the trace ({unit}), steps back to back")
        ax.legend(loc="upper left", frameon=False, ncols=3, fontsize=9)
        fig.suptitle(f"KV occupancy along the trace: windows of {w.size:,} steps")
    return fig


def layer_terms(row: Mapping[str, Any]) -> dict[str, float]:
    """One layer-kind row of ``step.layer_breakdown`` as NoOverlap seconds per resource, for
    all ``count`` layers of that kind."""
    n = float(row["count"])
    return {"sm": n * (row["dense_sm"] + row["routed_sm"]),
            "hbm": n * (row["dense_hbm"] + row["routed_hbm"]),
            "nvlink": n * row["nvlink"], "nic": n * row["nic"]}


def layer_breakdown_figure(steps: Sequence[tuple[str, int, Sequence[Mapping[str, Any]]]]
                           ) -> Figure:
    """Per layer kind, the NoOverlap time its layers add to each median step, by resource;
    the rest of the step (head, host) is its own bar. ``steps`` = [(label, no_overlap_ns,
    rows of step.layer_breakdown)]."""
    rows_n = sum(len(rows) + 1 for _, _, rows in steps)
    fig = _new(9.0, 1.6 + 0.42 * rows_n)
    with _rc():
        ax = fig.add_subplot()
        bars: list[tuple[str, dict[str, float], str]] = []
        for name, ns, rows in steps:
            used = 0.0
            for row in rows:
                terms = layer_terms(row)
                used += sum(terms.values())
                t = sum(terms.values())
                bars.append((f"{name}: {row['kind']} × {row['count']}", terms,
                             f" {t * 1e9 / ns:.0%} of the step" if ns else ""))
            rest = max(ns / 1e9 - used, 0.0)
            bars.append((f"{name}: head, host", {"host": rest},
                         f" {rest * 1e9 / ns:.0%}; step {fmt_duration(ns)}" if ns else ""))
        worst = max((sum(t.values()) for _, t, _ in bars), default=0.0)
        tu, ts = step_unit(worst * 1e9)
        ys = np.arange(len(bars))
        left = np.zeros(len(bars))
        for r in ("sm", "hbm", "nvlink", "nic", "host"):
            vals = np.array([t.get(r, 0.0) * 1e9 / ts for _, t, _ in bars])
            if not vals.any():
                continue
            label = "head and host (rest of the step)" if r == "host" else LABELS[r]
            ax.barh(ys, vals, left=left, color=COLORS[r], label=label)
            left += vals
        for y, (_, _, note) in enumerate(bars):
            ax.annotate(note, xy=(left[y], y), va="center", fontsize=8.5)
        ax.set_yticks(ys, [b[0] for b in bars])
        ax.invert_yaxis()
        ax.set_xlim(0, (left.max() if left.size else 1.0) * 1.45 or 1.0)
        ax.set_xlabel(f"NoOverlap time in the step ({tu})")
        fig.legend(loc="outside lower center", frameon=False, fontsize=9, ncols=5)
        fig.suptitle("Per layer kind: the median decode step and the median prefill step")
    return fig
