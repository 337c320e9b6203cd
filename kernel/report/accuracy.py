"""The report's accuracy part, when the priced table carries ``measured_ns``: predicted
against measured (log–log, by phase class), the relative error against batch tokens, and
the accuracy table (:func:`kernel.calibration.accuracy.accuracy_table`)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ..io.extras import require_charts

require_charts()  # before matplotlib: a missing extra is one line (CF7)

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from ..calibration.accuracy import ESTIMATES, accuracy_table  # noqa: E402
from ..model.calibration_law import PHASES, phase_code  # noqa: E402
from . import charts  # noqa: E402
from .blocks import Chart  # noqa: E402

if TYPE_CHECKING:
    from .blocks import Chart

__all__ = ["accuracy_charts", "accuracy_section", "error_vs_tokens_figure",
           "predicted_vs_measured_figure"]

PHASE_COLORS = {"prefill": "#d62728", "decode": "#1f77b4", "mixed": "#2ca02c"}
ESTIMATE_STYLE = {"no_overlap": ("NoOverlap", "o"), "overlap": ("Overlap", "^"),
                  "calibrated": ("calibrated", "s")}
_MAX_POINTS = 20_000  # per panel: evenly strided, so a million steps stay a light SVG


def _present(priced: pl.DataFrame) -> list[str]:
    return [e for e, c in ESTIMATES.items() if c in priced.columns]


def _phase(priced: pl.DataFrame) -> np.ndarray:
    code = phase_code(priced["prefill_requests"].to_numpy(), priced["decode_requests"].to_numpy())
    return np.asarray(PHASES, dtype=object)[code]


def _stride(n: int) -> slice:
    return slice(None, None, max(1, -(-n // _MAX_POINTS)))


def predicted_vs_measured_figure(priced: pl.DataFrame) -> Figure:
    """One log–log panel per estimate: predicted against measured step time, coloured by
    phase class, with the y = x line."""
    ests = _present(priced)
    fig = charts._new(4.2 * len(ests) + 0.6, 4.4)
    axes = fig.subplots(1, len(ests), squeeze=False)[0]
    m = priced["measured_ns"].to_numpy().astype(np.float64) / 1e3
    ph = _phase(priced)
    s = _stride(m.size)
    lo_hi = [m.min(), m.max()]
    for ax, est in zip(axes, ests, strict=True):
        p = priced[ESTIMATES[est]].to_numpy().astype(np.float64) / 1e3
        lo_hi += [p[p > 0].min() if (p > 0).any() else m.min(), p.max()]
        for name in PHASES:
            sel = ph[s] == name
            if sel.any():
                ax.scatter(m[s][sel], np.maximum(p[s][sel], 1e-3), s=6, alpha=0.5,
                           color=PHASE_COLORS[name], label=name, rasterized=False)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(ESTIMATE_STYLE[est][0])
        ax.set_xlabel("measured step time (µs)")
    lo, hi = float(min(lo_hi)) * 0.8, float(max(lo_hi)) * 1.25
    for ax in axes:
        ax.plot([lo, hi], [lo, hi], color="#444", lw=1, ls="--", label="predicted = measured")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    axes[0].set_ylabel("predicted step time (µs)")
    axes[0].legend(loc="upper left", fontsize=8, frameon=False)
    return fig


def error_vs_tokens_figure(priced: pl.DataFrame) -> Figure:
    """Relative error of each estimate against the batch's tokens (log x), with the median
    per token bucket."""
    ests = _present(priced)
    fig = charts._new(9.0, 4.6)
    ax = fig.subplots()
    t = np.maximum(priced["tokens"].to_numpy().astype(np.float64), 1.0)
    m = priced["measured_ns"].to_numpy().astype(np.float64)
    s = _stride(t.size)
    colors = {"no_overlap": "#7f7f7f", "overlap": "#ff7f0e", "calibrated": "#1f77b4"}
    edges = np.unique(np.geomspace(1, max(t.max(), 2), 24).round())
    for est in ests:
        rel = (priced[ESTIMATES[est]].to_numpy().astype(np.float64) - m) / m
        ax.scatter(t[s], rel[s], s=5, alpha=0.25, color=colors[est],
                   marker=ESTIMATE_STYLE[est][1])
        idx = np.digitize(t, edges)
        xs, ys = [], []
        for b in np.unique(idx):
            sel = idx == b
            if sel.sum() >= 3:
                xs.append(float(np.median(t[sel])))
                ys.append(float(np.median(rel[sel])))
        ax.plot(xs, ys, color=colors[est], lw=2, label=f"{ESTIMATE_STYLE[est][0]} (median)")
    ax.axhline(0.0, color="#444", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("batch tokens")
    ax.set_ylabel("(predicted − measured) / measured")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:+.0%}"))
    ax.legend(loc="best", fontsize=8, frameon=False)
    return fig


def _table_html(table: pl.DataFrame) -> str:
    head = ("<tr><th>estimate</th><th>breakdown</th><th>group</th><th>steps</th><th>MAPE</th>"
            "<th>bias</th><th>p50</th><th>p90</th><th>p99</th></tr>")

    def pct(x: float | None, signed: bool = False) -> str:
        if x is None or not np.isfinite(x):
            return "–"
        return f"{x:+.1%}" if signed else f"{x:.1%}"

    rows = []
    for r in table.iter_rows(named=True):
        rows.append(f"<tr><td>{escape(r['estimate'])}</td><td>{escape(r['breakdown'])}</td>"
                    f"<td>{escape(r['group'])}</td><td>{r['rows']:,}</td>"
                    f"<td>{pct(r['mape'])}</td><td>{pct(r['bias'], True)}</td>"
                    f"<td>{pct(r['p50'])}</td><td>{pct(r['p90'])}</td><td>{pct(r['p99'])}</td>"
                    "</tr>")
    return f'<table id="accuracy-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def accuracy_section(priced: pl.DataFrame) -> str:
    """The accuracy table as a report section (trusted HTML)."""
    table = accuracy_table(priced.with_columns(pl.col("bottleneck").cast(pl.String))
                           if "bottleneck" in priced.columns else priced)
    overall = table.filter(pl.col("breakdown") == "all")
    lead = "; ".join(f"{r['estimate']} MAPE {r['mape']:.1%} (bias {r['bias']:+.1%})"
                     for r in overall.iter_rows(named=True))
    return (f'<section id="accuracy"><h2>Accuracy against measured step times</h2>'
            f"<p>{priced.height:,} steps with a measured time: {escape(lead)}. Relative error "
            "= (predicted − measured) / measured; MAPE is its mean absolute value, bias its "
            "mean; p50/p90/p99 are of the absolute error. By phase class, batch-token bucket "
            f"and bottleneck:</p>{_table_html(table)}</section>")


def accuracy_charts(priced: pl.DataFrame, *, embed: str = "svg",
                    png_dir: Path | None = None) -> list[Chart]:

    fig = predicted_vs_measured_figure(priced)
    out = [Chart.of(fig, "predicted-vs-measured", "Predicted against measured",
                    "Each step's estimate against its measured time, log–log, coloured by "
                    "phase class; on the dashed line the estimate is exact.", embed)]
    if png_dir is not None:
        charts.save(fig, png_dir / "predicted_vs_measured.png")
    fig = error_vs_tokens_figure(priced)
    out.append(Chart.of(fig, "error-vs-tokens", "Relative error against batch tokens",
                        "Each step's relative error against the tokens in its batch; the lines "
                        "are the medians per token bucket.", embed))
    if png_dir is not None:
        charts.save(fig, png_dir / "error_vs_tokens.png")
    return out
