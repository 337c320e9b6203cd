"""The charts, drawn with matplotlib's object API on the Agg canvas (no pyplot, no display).

Each ``*_figure`` function takes plain data (see :mod:`kernel.facade.summary`) and returns a
:class:`matplotlib.figure.Figure`; :func:`save` writes it as PNG/SVG/PDF by suffix,
:func:`to_svg` returns it as an inline ``<svg>`` element (text kept as text, with an ``id``)
and :func:`to_png_data_uri` as a base64 ``data:`` URI. Each time axis has one unit (µs or ms),
named in its label.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

from ..io.extras import require_charts

require_charts()  # before matplotlib: a missing extra is one line (CF7)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # before anything touches a backend

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

from pipeline import safe_output  # noqa: E402

from ..bulk.summary import RESOURCES, TraceSummary, nearest_rank  # noqa: E402
from ..facade.summary import AnatomyPoint, BatchLimit, BottleneckGrid  # noqa: E402

__all__ = [
    "COLORS",
    "LABELS",
    "anatomy_figure",
    "bottleneck_map_figure",
    "compare_figure",
    "save",
    "step_time_histogram_figure",
    "time_by_bottleneck_figure",
    "to_png_data_uri",
    "to_svg",
]

COLORS: dict[str, str] = {
    "sm": "#1f77b4",
    "hbm": "#ff7f0e",
    "nvlink": "#2ca02c",
    "nic": "#d62728",
    "host": "#9467bd",
}
LABELS: dict[str, str] = {
    "sm": "SM (compute)",
    "hbm": "HBM (memory)",
    "nvlink": "NVLink",
    "nic": "NIC (network)",
    "host": "Host (CPU)",
}
_OTHER = "#7f7f7f"

_RC: dict[str, Any] = {
    "font.size": 10.0,
    "axes.titlesize": 12.0,
    "axes.labelsize": 10.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.fonttype": "none",  # keep text as text in SVG: small, searchable, no glyph ids
}


def _rc(extra: dict[str, Any] | None = None) -> AbstractContextManager[None]:
    """The charts' style (plus ``extra``) for the duration of a ``with`` block."""
    return matplotlib.rc_context(cast(Any, {**_RC, **(extra or {})}))


def _color(r: str) -> str:
    return COLORS.get(r, _OTHER)


def _label(r: str) -> str:
    return LABELS.get(r, r)


def _new(width: float = 9.0, height: float = 5.0) -> Figure:
    with _rc():
        fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
    return fig


# -- output ---------------------------------------------------------------------------------

def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path``; the format follows the suffix (.png, .svg, .pdf)."""

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with _rc({"svg.hashsalt": path.stem}), safe_output.atomic(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=_metadata(fmt))
    return path


def _metadata(fmt: str) -> dict[str, str | None] | None:
    # Drop the creation date so the same data gives the same file.
    if fmt == "svg":
        return {"Date": None}
    if fmt == "pdf":
        return {"CreationDate": None}
    return None


def to_svg(fig: Figure, element_id: str) -> str:
    """``fig`` as an inline ``<svg id=element_id>`` element (no XML prolog, no DOCTYPE)."""
    buf = io.StringIO()
    with _rc({"svg.hashsalt": element_id}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    text = text[start:]
    # One id per chart; also make the internal ids (clip paths) unique within the page.
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{element_id}-{m.group(1)}"', text)
    text = re.sub(r'url\(#([^)]+)\)', lambda m: f"url(#{element_id}-{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{element_id}-{m.group(1)}"',
                  text)
    text = text.replace("<svg", f'<svg id="{element_id}" role="img" class="chart"', 1)
    return text


def to_png_data_uri(fig: Figure) -> str:
    """``fig`` as a ``data:image/png;base64,…`` URI for an ``<img src>``."""
    buf = io.BytesIO()
    with _rc():
        fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# -- step anatomy ------------------------------------------------------------------------------

def anatomy_figure(points: Sequence[AnatomyPoint], *, context: int, title: str = "",
                   limit: BatchLimit | None = None) -> Figure:
    """Per-resource time and Overlap/NoOverlap (µs, or ms past 10 ms) against decode batch
    size.

    The band along the bottom shows which resource binds at each batch size; batch sizes
    beyond ``limit`` (max_num_seqs, or the requests whose KV fits) are greyed out.
    """
    fig = _new(9.0, 5.4)
    with _rc():
        ax = fig.add_subplot()
        xs = np.array([p.batch_size for p in points])
        worst = max((p.no_overlap_ns for p in points), default=0)
        unit, scale = ("ms", 1e6) if worst >= 10e6 else ("µs", 1e3)

        def t(ns: Sequence[int]) -> np.ndarray:
            return np.asarray(ns, dtype=np.float64) / scale

        present = [r for r in RESOURCES if any(p.per_resource.get(r, 0) for p in points)]
        extra = sorted({r for p in points for r in p.per_resource} - set(RESOURCES))
        for r in present + [r for r in extra if any(p.per_resource.get(r, 0) for p in points)]:
            ax.plot(xs, t([p.per_resource.get(r, 0) for p in points]), color=_color(r),
                    lw=1.6, label=_label(r))
        ax.plot(xs, t([p.no_overlap_ns for p in points]), color="black", lw=2.6,
                label="NoOverlap (sum)")
        ax.plot(xs, t([p.overlap_ns for p in points]), color="black", lw=2.0, ls="--",
                label="Overlap")
        # The binding resource as a coloured strip under the curves (one span per run).
        edges = _edges(xs) if len(xs) else np.zeros(0)
        if len(points):
            top = max(worst, 1) / scale
            ax.set_ylim(-0.07 * top, top * 1.08)
            start = 0
            for i in range(1, len(points) + 1):
                if i == len(points) or points[i].bottleneck != points[start].bottleneck:
                    ax.axvspan(edges[start], edges[i], ymin=0.0, ymax=0.04, lw=0, alpha=0.9,
                               color=_color(points[start].bottleneck))
                    start = i
        if len(xs) and limit is not None and limit.size < xs.max():
            lo = max(limit.size + 0.5, edges[0])
            ax.axvspan(lo, edges[-1], color="#9a9a9a", alpha=0.35, lw=0, zorder=3,
                       label=f"beyond {limit.reason}:\nthe pool cannot hold these batches")
        if len(xs):
            ax.set_xlim(edges[0], edges[-1])
            ticks = _batch_ticks(int(xs.min()), int(xs.max()))
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("decode batch size (requests)")
        ax.set_ylabel(f"time per step ({unit})")
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        fig.suptitle(title or "Step anatomy")
        ax.set_title(f"uniform decode at context {context:,} tokens; the strip along the "
                     "bottom shows the binding resource", fontsize=9, color="#444")
        ax.legend(loc="upper left", frameon=False, ncols=2)
    return fig


def _edges(xs: np.ndarray) -> np.ndarray:
    """Cell edges (midpoints) around sorted x values."""
    x = xs.astype(np.float64)
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    mids = (x[:-1] + x[1:]) / 2
    return np.concatenate([[2 * x[0] - mids[0]], mids, [2 * x[-1] - mids[-1]]])


def _batch_ticks(lo: int, hi: int) -> list[int]:
    """1 and round multiples (of 8, 16, 32, …) across [lo, hi], about eight of them."""
    step = 8
    while (hi - lo) / step > 8:
        step *= 2
    ticks = [t for t in range(step, hi + 1, step) if t >= lo]
    return ([lo] if not ticks or ticks[0] - lo >= step / 2 else []) + ticks


# -- bottleneck map -------------------------------------------------------------------------

def bottleneck_map_figure(grid: BottleneckGrid, *, title: str = "",
                          limits: Mapping[int, int] | None = None) -> Figure:
    """A categorical heatmap: which resource binds at each batch size × context length.

    ``limits`` (context → the largest batch the pool holds there) hatches the cells beyond."""
    fig = _new(9.0, 5.4)
    with _rc({"axes.grid": False}):
        ax = fig.add_subplot()
        cats = grid.resources() or list(RESOURCES[:1])
        index = {r: i for i, r in enumerate(cats)}
        data = np.array([[index[c] for c in row] for row in grid.cells], dtype=float)
        cmap = ListedColormap([_color(r) for r in cats])
        norm = BoundaryNorm(np.arange(len(cats) + 1) - 0.5, len(cats))
        ax.imshow(data if data.size else np.zeros((1, 1)), cmap=cmap, norm=norm,
                  aspect="auto", origin="lower", interpolation="nearest")
        ax.set_xticks(range(len(grid.sizes)), [str(s) for s in grid.sizes])
        ax.set_yticks(range(len(grid.contexts)), [_ctx(c) for c in grid.contexts])
        ax.set_xlabel("decode batch size (requests)")
        ax.set_ylabel("context length (tokens)")
        fig.suptitle(title or "Which resource binds")
        worst = max((t for row in grid.no_overlap_ns for t in row), default=0)
        unit, scale = ("ms", 1e6) if worst >= 10e6 else ("µs", 1e3)
        if grid.no_overlap_ns and len(grid.sizes) * len(grid.contexts) <= 200:
            for i, row in enumerate(grid.no_overlap_ns):
                for j, t in enumerate(row):
                    ax.text(j, i, _short(t / scale), ha="center", va="center", fontsize=7.5,
                            color="white")
        handles = [Patch(color=_color(r), label=_label(r)) for r in cats]
        beyond = [(i, j) for i, c in enumerate(grid.contexts) for j, n in enumerate(grid.sizes)
                  if limits is not None and c in limits and n > limits[c]]
        for i, j in beyond:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#9a9a9a", alpha=0.75,
                                   hatch="///", edgecolor="white", lw=0))
        if beyond:
            handles.append(Patch(facecolor="#9a9a9a", hatch="///", edgecolor="white",
                                 label="beyond what the pool holds"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title="binding resource")
        ax.set_title(f"uniform decode steps; cell text: NoOverlap step time ({unit})", fontsize=9,
                     color="#444")
    return fig


def _ctx(c: int) -> str:
    return f"{c // 1024}K" if c >= 1024 and c % 1024 == 0 else str(c)


def _short(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


# -- a priced trace ------------------------------------------------------------------------------

def step_time_histogram_figure(no_overlap_ns: Sequence[int] | np.ndarray | pl.Series, *,
                               with_prefill: Sequence[bool] | np.ndarray | pl.Series | None = None,
                               title: str = "") -> Figure:
    """Histogram of per-step NoOverlap time with p50 and p99 marked, in one unit (µs or ms)
    on the axis and in the labels.

    ``with_prefill`` (one flag per step) draws decode-only steps and steps that carry prefill
    work as two outlined series side by side — never stacked, so each bar height is read
    directly. A wide spread gets a log time axis; a tall peak a log count axis.
    """
    values = np.asarray(no_overlap_ns, dtype=np.int64)
    fig = _new(9.0, 4.8)
    unit, scale = ("ms", 1e6) if values.size and values.max() >= 2e6 else ("µs", 1e3)
    with _rc():
        ax = fig.add_subplot()
        t = values / scale
        if t.size:
            lo, hi = float(t.min()), float(t.max())
            bins: Any = np.linspace(lo, hi if hi > lo else lo + 1.0, 61)
            if lo > 0 and hi / lo > 4:
                bins = np.geomspace(lo, hi * 1.0001, 61)
                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            if with_prefill is not None:
                mask = np.asarray(with_prefill, dtype=bool)
                heights = []
                for sel, color, label in ((~mask, "#4c72b0", "decode-only steps"),
                                          (mask, "#dd8452", "steps with prefill")):
                    h, _, _ = ax.hist(t[sel], bins=bins, histtype="step", lw=1.8, color=color,
                                      label=f"{label} ({int(sel.sum()):,})")
                    heights.append(np.asarray(h))
                allh = np.concatenate(heights)
            else:
                h, _, _ = ax.hist(t, bins=bins, color="#4c72b0", alpha=0.9)
                allh = np.asarray(h)
            nonzero = allh[allh > 0]
            if nonzero.size and nonzero.max() > 20 * np.median(nonzero):
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.xaxis.set_major_formatter(FuncFormatter(_plain))
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            for q, style in ((0.50, "-"), (0.99, "--")):
                ns = nearest_rank(values, q)
                ax.axvline(ns / scale, color="#c44e52", ls=style, lw=1.8)
                ax.annotate(f"p{int(q * 100)} = {ns / scale:,.3g} {unit}", xy=(ns / scale, 1.0),
                            xycoords=("data", "axes fraction"), xytext=(4, -14),
                            textcoords="offset points", color="#c44e52", fontsize=9.5)
            if with_prefill is not None:
                fig.legend(loc="outside lower center", ncols=2, frameon=False)
        ax.set_xlabel(f"NoOverlap step time ({unit})")
        ax.set_ylabel("steps")
        ax.set_title(title or f"Step-time distribution ({values.size:,} steps)")
    return fig


def _plain(v: float, _pos: object = None) -> str:
    """A tick label without scientific notation: 20,000 / 1.5 / 0.2."""
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:g}"


def time_by_bottleneck_figure(summary: TraceSummary | Mapping[str, int], *,
                              title: str = "") -> Figure:
    """Total NoOverlap time of the batches each resource binds (bars, with shares)."""
    times = summary.bottleneck_time_ns if isinstance(summary, TraceSummary) else dict(summary)
    order = [r for r in RESOURCES if r in times] + sorted(set(times) - set(RESOURCES))
    total = sum(times.values())
    fig = _new(7.0, 4.2)
    with _rc():
        ax = fig.add_subplot()
        unit, scale = _time_unit(max(times.values(), default=0))
        vals = [times[r] / scale for r in order]
        bars = ax.bar([_label(r) for r in order], vals, color=[_color(r) for r in order])
        for b, r in zip(bars, order, strict=True):
            share = times[r] / total if total else 0.0
            ax.annotate(f"{share:.1%}", xy=(b.get_x() + b.get_width() / 2, b.get_height()),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
        ax.set_ylabel(f"wall time ({unit}, NoOverlap)")
        ax.set_title(title or "Time by binding resource")
        if vals:
            ax.set_ylim(0, max(vals) * 1.15 or 1)
    return fig


def _time_unit(ns: float) -> tuple[str, float]:
    if ns >= 10e9:
        return "s", 1e9
    if ns >= 10e6:
        return "ms", 1e6
    return "µs", 1e3


# -- comparing deployments -----------------------------------------------------------------------

def compare_figure(summaries: Sequence[TraceSummary], names: Sequence[str], *,
                   title: str = "") -> Figure:
    """One trace under several deployments: wall time split by binding resource (shares of
    time, as ``sweep`` reports them), GPU time alongside, and p50/p99 step time."""
    fig = _new(10.0, max(3.2, 1.6 + 0.6 * len(names)))
    with _rc():
        ax, ax2 = fig.subplots(1, 2, sharey=True, width_ratios=[3, 2])
        ys = np.arange(len(names))
        worst = max((s.total_no_overlap_ns for s in summaries), default=0)
        unit, scale = _time_unit(worst)
        left = np.zeros(len(names))
        cats = [r for r in RESOURCES if any(r in s.bottleneck_time_ns for s in summaries)]
        for r in cats:
            w = np.array([s.bottleneck_time_ns.get(r, 0) / scale for s in summaries])
            ax.barh(ys, w, left=left, color=_color(r), label=_label(r))
            left += w
        for y, s in zip(ys, summaries, strict=True):
            gpu = s.gpu_ns()
            note = f" {s.total_no_overlap_ns / scale:,.4g} {unit}" + (
                f" × {s.gpus} GPUs = {gpu / 1e9:,.0f} GPU-s" if gpu is not None else "")
            ax.annotate(note, xy=(left[y], y), va="center", fontsize=9)
        ax.set_yticks(ys, list(names))
        ax.invert_yaxis()
        ax.set_xlabel(f"wall time ({unit}, NoOverlap), split by binding resource")
        ax.set_xlim(0, (left.max() if left.size else 1) * 1.6 or 1)
        h = 0.38
        unit2, scale2 = _time_unit(max((s.p99_no_overlap_ns for s in summaries), default=0))
        ax2.barh(ys - h / 2, [s.p50_no_overlap_ns / scale2 for s in summaries], h,
                 color="#8da0cb", label="p50 step")
        ax2.barh(ys + h / 2, [s.p99_no_overlap_ns / scale2 for s in summaries], h,
                 color="#e78ac3", label="p99 step")
        ax2.xaxis.set_major_formatter(FuncFormatter(_plain))
        ax2.set_xlabel(f"step time ({unit2}, NoOverlap)")
        handles, labels = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        fig.legend(handles + h2, labels + l2, loc="outside lower center",
                   ncols=len(labels) + len(l2), frameon=False, fontsize=9)
        fig.suptitle(title or "One trace, several deployments")
    return fig
