"""Accuracy of an estimate against measured step times: relative errors and their summary.

The relative error of an estimate is ``(estimate − measured) / measured`` (positive: the
estimate is too slow). A summary gives the count, MAPE (mean |error|), the signed bias (mean
error) and the 50th/90th/99th percentiles of |error|; :func:`accuracy_table` breaks it down
by phase class, by batch-token bucket and by bottleneck.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from ..model.calibration_law import PHASES, phase_code

__all__ = ["ESTIMATES", "Summary", "accuracy_table", "relative_error", "summarise",
           "token_bucket"]

# estimate name -> priced column
ESTIMATES = {"no_overlap": "no_overlap_ns", "overlap": "overlap_ns",
             "calibrated": "calibrated_ns"}
TOKEN_EDGES = (1, 16, 64, 256, 1024, 4096, 16384)


@dataclass(frozen=True)
class Summary:
    rows: int
    mape: float
    bias: float
    p50: float
    p90: float
    p99: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def relative_error(estimate: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """(estimate − measured) / measured, float64; ``measured`` must be > 0."""
    m = np.asarray(measured, np.float64)
    return (np.asarray(estimate, np.float64) - m) / m


def summarise(rel: np.ndarray) -> Summary:
    """Count, MAPE, signed bias and |error| percentiles (NaN when there are no rows)."""
    rel = np.asarray(rel, np.float64)
    if rel.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan)
    a = np.abs(rel)
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    return Summary(int(rel.size), float(a.mean()), float(rel.mean()), p50, p90, p99)


def token_bucket(tokens: np.ndarray) -> np.ndarray:
    """Labels ``"<1"``, ``"1-15"``, … ``"16384+"`` for batch-token counts."""
    t = np.asarray(tokens, np.int64)
    edges = np.asarray(TOKEN_EDGES)
    labels = ["0"] + [f"{lo}-{hi - 1}" for lo, hi in zip(TOKEN_EDGES, TOKEN_EDGES[1:],
                                                           strict=False)] + \
        [f"{TOKEN_EDGES[-1]}+"]
    idx = np.searchsorted(edges, t, side="right")
    return np.asarray(labels, dtype=object)[idx]


def accuracy_table(priced: pl.DataFrame, measured: str = "measured_ns",
                   estimates: Sequence[str] | None = None) -> pl.DataFrame:
    """One row per (estimate, breakdown, group): rows, mape, bias, p50, p90, p99.

    ``breakdown`` is ``all``, ``phase`` (prefill / decode / mixed), ``tokens`` (batch-token
    bucket) or ``bottleneck``. Estimates default to those present among
    no_overlap, overlap, calibrated.
    """
    if measured not in priced.columns:
        raise ValueError(f"the priced table has no {measured!r} column")
    names = [e for e in (estimates or ESTIMATES) if ESTIMATES[e] in priced.columns]
    y = priced[measured].to_numpy().astype(np.float64)
    groups: dict[str, np.ndarray] = {"all": np.full(len(priced), "all", dtype=object)}
    if {"prefill_requests", "decode_requests"} <= set(priced.columns):
        code = phase_code(priced["prefill_requests"].to_numpy(),
                          priced["decode_requests"].to_numpy())
        groups["phase"] = np.asarray(PHASES, dtype=object)[code]
    if "tokens" in priced.columns:
        groups["tokens"] = token_bucket(priced["tokens"].to_numpy())
    if "bottleneck" in priced.columns:
        groups["bottleneck"] = np.asarray(priced["bottleneck"].to_list(), dtype=object)
    rows: list[dict[str, Any]] = []
    for est in names:
        rel = relative_error(priced[ESTIMATES[est]].to_numpy(), y)
        for kind, labels in groups.items():
            for label in _ordered(labels, kind):
                s = summarise(rel[labels == label])
                rows.append({"estimate": est, "breakdown": kind, "group": str(label),
                             **s.as_dict()})
    return pl.DataFrame(rows, schema={"estimate": pl.String, "breakdown": pl.String,
                                      "group": pl.String, "rows": pl.Int64,
                                      "mape": pl.Float64, "bias": pl.Float64,
                                      "p50": pl.Float64, "p90": pl.Float64, "p99": pl.Float64})


def _ordered(labels: np.ndarray, kind: str) -> list[Any]:
    present = set(labels.tolist())
    if kind == "phase":
        return [p for p in PHASES if p in present]
    if kind == "tokens":
        order = ["0"] + [f"{lo}-{hi - 1}" for lo, hi in zip(TOKEN_EDGES, TOKEN_EDGES[1:],
                                                            strict=False)] + \
            [f"{TOKEN_EDGES[-1]}+"]
        return [o for o in order if o in present]
    return sorted(present)


def format_table(table: pl.DataFrame, breakdowns: Sequence[str] = ("all", "phase")) -> str:
    """A plain-text rendering of :func:`accuracy_table` (percentages)."""
    lines = [f"{'estimate':<11} {'group':<12} {'rows':>8} {'MAPE':>7} {'bias':>8} "
             f"{'p50':>7} {'p90':>7} {'p99':>7}"]
    for r in table.filter(pl.col("breakdown").is_in(list(breakdowns))).iter_rows(named=True):
        group = r["group"] if r["breakdown"] == "all" else f"{r['group']}"
        lines.append(f"{r['estimate']:<11} {group:<12} {r['rows']:>8,} {_pct(r['mape']):>7} "
                     f"{_pct(r['bias'], signed=True):>8} {_pct(r['p50']):>7} "
                     f"{_pct(r['p90']):>7} {_pct(r['p99']):>7}")
    return "\n".join(lines)


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"
