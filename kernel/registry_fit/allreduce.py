"""vLLM's tensor-parallel all-reduce, fitted from ``custom_allreduce_perf`` rows.

The rows time vLLM's own ``tensor_model_parallel_all_reduce`` (whatever backend the engine
dispatches a message of that size to: the custom one-shot or two-shot kernel, or NCCL past
the custom kernel's size limit), in CUDA-graph and eager launch modes. The fitted law is a
monotone piecewise-linear curve of latency against message bytes, one knot per measured
size (docs/decisions.md AC2): a larger message never costs less, so the rows are first made
non-decreasing by pooling adjacent violators (least squares), which also absorbs the
occasional noisy row. Each interior row is scored held out: the curve is refitted without it
and read at its size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .tables import OperatorTable

# The columns the fit reads, and the launch mode it prices (the kernel's step is GPU time;
# an eager launch's extra is host dispatch and a copy into the registered buffer).
COLUMNS = ("num_gpus", "message_size", "latency", "backend")
GRAPH_MODE = "vllm_graph"
ELEMENT_BYTES = 2  # rows are bfloat16 (checked against allreduce_dtype when present)


@dataclass(frozen=True)
class AllReduceFit:
    """The fitted curve for one group width, and its held-out score."""

    ranks: int
    knot_bytes: tuple[int, ...]
    knot_us: tuple[float, ...]
    held_out: int  # rows scored held out
    mape: float  # mean |pred − measured| / measured over the held-out rows
    bias: float  # mean (pred − measured) / measured
    worst: float  # largest |pred − measured| / measured


def monotone(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return np.asarray(out, dtype=np.float64)


def curve_at(knot_bytes: np.ndarray, knot_us: np.ndarray, nbytes: float) -> float:
    """The fitted curve at ``nbytes``: the kernel's law (kernel.model.laws.knot_time) in µs."""
    if nbytes >= knot_bytes[-1] and len(knot_bytes) > 1:
        slope = (knot_us[-1] - knot_us[-2]) / (knot_bytes[-1] - knot_bytes[-2])
        return float(knot_us[-1] + (nbytes - knot_bytes[-1]) * slope)
    return float(np.interp(nbytes, knot_bytes, knot_us))


def _rows(table: OperatorTable) -> pl.DataFrame:
    df = table.frame
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{table.path}: missing column(s) {missing}; an all-reduce table has "
                         f"{list(COLUMNS)}")
    if "allreduce_dtype" in df.columns:
        bad = df.filter(pl.col("allreduce_dtype") != "bfloat16")
        if bad.height:
            raise ValueError(f"{table.path}: allreduce_dtype {bad['allreduce_dtype'][0]!r} "
                             "(row of its first); only bfloat16 rows are fitted")
    rows = df.filter(pl.col("backend") == GRAPH_MODE)
    if rows.height == 0:
        raise ValueError(f"{table.path}: no {GRAPH_MODE!r} rows (backend column holds "
                         f"{sorted(df['backend'].unique().to_list())})")
    bad = rows.filter((pl.col("latency") <= 0) | (pl.col("message_size") <= 0)
                      | pl.col("latency").is_null() | pl.col("latency").is_nan())
    if bad.height:
        raise ValueError(f"{table.path}: {bad.height} row(s) with a latency or message_size "
                         "that is not positive; both must be > 0")
    return rows


def fit_width(sizes: np.ndarray, latency_us: np.ndarray, ranks: int) -> AllReduceFit:
    """The curve through one width's rows (sizes in bytes, ascending) and its held-out score."""
    order = np.argsort(sizes, kind="stable")
    x, y = sizes[order].astype(np.float64), latency_us[order].astype(np.float64)
    # repeated sizes: their mean
    ux, inv = np.unique(x, return_inverse=True)
    uy = np.bincount(inv, weights=y) / np.bincount(inv)
    fitted = monotone(uy)
    errs = []
    for i in range(1, len(ux) - 1):
        keep = np.arange(len(ux)) != i
        pred = curve_at(ux[keep], monotone(uy[keep]), ux[i])
        errs.append((pred - uy[i]) / uy[i])
    e = np.asarray(errs) if errs else np.zeros(1)
    return AllReduceFit(ranks, tuple(int(b) for b in ux), tuple(float(v) for v in fitted),
                        len(errs), float(np.mean(np.abs(e))), float(np.mean(e)),
                        float(np.max(np.abs(e))))


def fit_all_reduce(table: OperatorTable) -> list[AllReduceFit]:
    """One fit per group width the table measured, narrowest first."""
    rows = _rows(table)
    fits = []
    for ranks in sorted(rows["num_gpus"].unique().to_list()):
        w = rows.filter(pl.col("num_gpus") == ranks)
        if w.height < 3:
            raise ValueError(f"{table.path}: {ranks}-rank graph rows: {w.height}; a curve needs "
                             "at least 3 message sizes")
        fits.append(fit_width(w["message_size"].to_numpy() * ELEMENT_BYTES,
                              w["latency"].to_numpy() * 1e3, int(ranks)))
    return fits
