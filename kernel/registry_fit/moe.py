"""vLLM's fused MoE operator, fitted from ``moe_perf`` rows (docs/decisions.md MF1).

Each row times one routed-expert layer on one rank (vLLM's ``FusedMoE``: routing, the w13 and
w2 grouped GEMMs and the combine) for ``num_tokens`` tokens of a model shape (hidden size,
intermediate size, experts, top k), sharded over ``moe_tp_size`` ranks. The law is the
kernel's routed term with its three inputs measured instead of taken from the dense GEMM ramp
and the derated HBM rate (model.md §4.2-4.3):

    t = floor + touched expert bytes / rate + routed FLOPs / (peak · eff)

by least squares on relative error with every coefficient non-negative, scored held out by
model shape: each shape is predicted by the law fitted on the other shapes. No ramp: the fused
kernel runs one small GEMM per touched expert, so a ramp would follow the tokens per touched
expert ``m = T·k / touched``; but ``FLOPs / m`` is ``touched × 6·h·i / tp``, the touched bytes
over the bytes per parameter, so a ``(m + m_half) / m`` factor only adds a multiple of the
weight read, which the rate already fits (decision MF1).

Rows used: bf16 weights, no expert parallelism (``moe_ep_size`` 1: the rows where every rank
holds a tp slice of every expert), ``balanced`` routing (each of the ``num_tokens · topk``
assignments to a distinct expert while any is untouched: ``min(E, T·k)`` experts touched,
the count the rows were timed at), the fastest kernel per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .attention import nonnegative_fit
from .tables import SYSTEMS, OperatorTable, choose_version, family_root

COLUMNS = ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
           "moe_tp_size", "moe_ep_size", "distribution", "latency")
SHAPE = ("hidden_size", "inter_size", "num_experts", "topk")
DTYPE, BYTES = "bfloat16", 2.0
# Held out by shape needs several shapes: a version whose bf16 rows hold fewer is passed over
# for an older one (vLLM 0.27.1 and 0.31.0 tables time one or no bf16 shape).
MIN_SHAPES = 4


@dataclass(frozen=True)
class MoeFit:
    floor_us: float
    rate_bytes_per_us: float  # 0: the weight read costs nothing beyond the floor
    efficiency: float  # of the chip's bf16 peak; 0: the FLOPs cost nothing beyond the read
    rows: int
    shapes: int
    mape: float  # held out by shape
    bias: float
    worst: float


def usable(frame: pl.DataFrame, path: Path | str = "table") -> pl.DataFrame:
    """The rows the law is fitted on (see the module docstring), fastest kernel per row."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; a MoE table has {list(COLUMNS)}")
    keep = frame.filter((pl.col("moe_dtype") == DTYPE) & (pl.col("moe_ep_size") == 1)
                        & (pl.col("distribution") == "balanced") & (pl.col("latency") > 0)
                        & (pl.col("num_tokens") > 0) & (pl.col("moe_tp_size") > 0))
    return keep.group_by([*SHAPE, "moe_tp_size", "num_tokens"]).agg(
        pl.col("latency").min()).sort([*SHAPE, "moe_tp_size", "num_tokens"])


def find_moe_table(root: str | Path, chip: str, engine: str) -> OperatorTable:
    """The ``moe_perf`` table for ``chip`` at the version nearest ``engine`` among those whose
    bf16 rows hold at least ``MIN_SHAPES`` shapes (the requested version when it does, else
    the newest below it, else the oldest above it)."""
    base, backend, version = family_root(root, chip, "moe", engine)
    frames: dict[str, pl.DataFrame] = {}
    for p in sorted(base.glob("*/moe_perf.parquet")) if base.is_dir() else []:
        frame = pl.read_parquet(p)
        if usable(frame, p).select(SHAPE).unique().height >= MIN_SHAPES:
            frames[p.parent.name] = frame
    if not frames:
        raise ValueError(f"{base}: no moe_perf.parquet with {DTYPE} rows of {MIN_SHAPES} or "
                         f"more shapes (moe_ep_size 1, balanced) at any {backend} version "
                         f"for {chip}")
    chosen = choose_version(list(frames), version)
    return OperatorTable(base / chosen / "moe_perf.parquet", SYSTEMS[chip], "moe", backend,
                         chosen, version, frames[chosen])


def features(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per row: touched expert bytes and routed FLOPs per rank, the measured µs."""
    t, h, i, e, k, tp = (df[c].to_numpy().astype(np.float64) for c in (
        "num_tokens", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size"))
    touched = np.minimum(e, t * k)
    per_expert = 3.0 * h * i  # w1, w3 (gate, up) and w2 (down) parameters of one expert
    return {"bytes": touched * per_expert * BYTES / tp,
            "flops": t * k * 2.0 * per_expert / tp,
            "us": df["latency"].to_numpy() * 1e3}


def _columns(f: dict[str, np.ndarray], peak_flops: float) -> np.ndarray:
    return np.column_stack([np.ones_like(f["us"]), f["bytes"], f["flops"] / peak_flops * 1e6])


def predict(f: dict[str, np.ndarray], peak_flops: float, c: np.ndarray) -> np.ndarray:
    """µs of each row under coefficients ``c`` = (floor µs, 1/rate, 1/efficiency)."""
    return _columns(f, peak_flops) @ c


def fit_moe(table: OperatorTable, peak_flops: float) -> MoeFit:
    df = usable(table.frame, table.path)
    shapes = df.select(SHAPE).unique().rows()
    if len(shapes) < 2:
        raise ValueError(f"{table.path}: {len(shapes)} {DTYPE} shape(s); held out by shape "
                         "needs two or more")
    f = features(df)
    y = f["us"]
    x = _columns(f, peak_flops)
    c = nonnegative_fit(x, y)
    errs = []
    for shape in shapes:
        held = np.all(np.column_stack([df[n].to_numpy() == v for n, v in zip(
            SHAPE, shape, strict=True)]), 1)
        ch = nonnegative_fit(x[~held], y[~held])
        errs.append((x[held] @ ch - y[held]) / y[held])
    e = np.concatenate(errs)
    return MoeFit(float(c[0]), float(1.0 / c[1]) if c[1] > 0 else 0.0,
                  float(1.0 / c[2]) if c[2] > 0 else 0.0, df.height, len(shapes),
                  float(np.mean(np.abs(e))), float(np.mean(e)), float(np.max(np.abs(e))))


def kernel_law_error(table: OperatorTable, peak_flops: float, eps_max: float, m_half: float,
                     hbm_bps: float) -> tuple[float, float]:
    """MAPE and bias of the routed term the kernel prices without the fitted set (MO1: FLOPs
    split over tp on the dense ramp at the step's tokens, plus touched bytes at the derated
    HBM rate), on the same rows."""
    df = usable(table.frame, table.path)
    f = features(df)
    t = df["num_tokens"].to_numpy().astype(np.float64)
    pred = (f["flops"] / (peak_flops * eps_max * t / (t + m_half))
            + f["bytes"] / hbm_bps) * 1e6
    rel = (pred - f["us"]) / f["us"]
    return float(np.mean(np.abs(rel))), float(np.mean(rel))


def shape_errors(table: OperatorTable, peak_flops: float, fit: MoeFit, hidden: int,
                 inter: int, experts: int, topk: int) -> dict[int, float]:
    """Signed relative error per tp width of the fitted law on one shape's rows (in sample)."""
    df = usable(table.frame, table.path).filter(
        (pl.col("hidden_size") == hidden) & (pl.col("inter_size") == inter)
        & (pl.col("num_experts") == experts) & (pl.col("topk") == topk))
    f = features(df)
    c = np.array([fit.floor_us, 1.0 / fit.rate_bytes_per_us if fit.rate_bytes_per_us else 0.0,
                  1.0 / fit.efficiency if fit.efficiency else 0.0])
    rel = (predict(f, peak_flops, c) - f["us"]) / f["us"]
    tp = df["moe_tp_size"].to_numpy()
    return {int(w): float(np.mean(rel[tp == w])) for w in np.unique(tp)}


def report(chip: str, table: OperatorTable, f: MoeFit) -> dict[str, Any]:
    return {"chip": chip, "family": "moe", "group": f"{f.shapes}shapes",
            "table": table.cite(), "version": table.version, "requested": table.requested,
            "held_out_rows": f.rows, "mape": round(f.mape, 5), "bias": round(f.bias, 5),
            "worst": round(f.worst, 5)}
