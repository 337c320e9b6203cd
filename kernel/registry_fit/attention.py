"""Attention decode, fitted from ``generation_attention_perf`` rows (docs/decisions.md AC4).

Each row times one decode attention kernel over ``batch_size`` requests, each reading a KV
cache of ``step + 1`` tokens of ``num_key_value_heads × head_dim`` (keys and values). The law
is the kernel's decode read (model.md §3.2) plus a per-request term:

    t = floor + requests · per_request + KV bytes / rate

fitted by least squares on relative error with every coefficient non-negative. It is scored
held out by model shape: each (query heads, KV heads, head dim) is predicted by the law fitted
on the other shapes, so the score is what a model the tables never measured can expect.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from .tables import OperatorTable

COLUMNS = ("batch_size", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype",
           "window_size", "step", "latency")
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
SHAPE = ("num_heads", "num_key_value_heads", "head_dim")


@dataclass(frozen=True)
class AttentionDecodeFit:
    floor_us: float
    per_request_us: float
    rate_bytes_per_us: float
    rows: int
    shapes: int
    mape: float  # held out by shape
    bias: float
    worst: float


def design(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Columns (1, requests, KV bytes) and the measured µs of each row."""
    kv = df["kv_cache_dtype"].replace_strict(KV_BYTES, return_dtype=pl.Float64).to_numpy()
    tokens = df["step"].to_numpy().astype(np.float64) + 1.0
    nbytes = (df["batch_size"].to_numpy() * tokens * 2.0
              * df["num_key_value_heads"].to_numpy() * df["head_dim"].to_numpy() * kv)
    x = np.column_stack([np.ones(df.height), df["batch_size"].to_numpy().astype(np.float64),
                         nbytes])
    return x, df["latency"].to_numpy() * 1e3


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of relative error, every coefficient >= 0 (the best feasible subset)."""
    w = 1.0 / y
    best, best_err = np.zeros(x.shape[1]), np.inf
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            c, *_ = np.linalg.lstsq(x[:, cols] * w[:, None], np.ones_like(y), rcond=None)
            if np.any(c < 0):
                continue
            full = np.zeros(x.shape[1])
            full[list(cols)] = c
            err = float(np.sum((x @ full * w - 1.0) ** 2))
            if err < best_err:
                best, best_err = full, err
    return best


def rows(table: OperatorTable) -> pl.DataFrame:
    df = table.frame
    if "window_size" not in df.columns:  # older tables time full attention only
        df = df.with_columns(pl.lit(0).alias("window_size"))
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{table.path}: missing column(s) {missing}; a decode attention "
                         f"table has {list(COLUMNS)}")
    keep = df.filter((pl.col("window_size") == 0) & pl.col("kv_cache_dtype").is_in(list(KV_BYTES))
                     & (pl.col("latency") > 0))
    if keep.height == 0:
        raise ValueError(f"{table.path}: no full-attention (window_size 0) rows with a "
                         f"{sorted(KV_BYTES)} KV cache and a positive latency")
    # one kernel per shape as the engine picks one: the fastest the table timed
    return keep.group_by([*SHAPE, "batch_size", "step", "kv_cache_dtype"]).agg(
        pl.col("latency").min()).sort([*SHAPE, "kv_cache_dtype", "batch_size", "step"])


def held_out_by_shape(df: pl.DataFrame, x: np.ndarray, y: np.ndarray
                      ) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Relative errors of each head shape's rows under a fit of every other shape's rows
    (leave one shape out), and the shapes."""
    shapes = df.select(SHAPE).unique().rows()
    errs = []
    for shape in shapes:
        held = np.all(np.column_stack([df[n].to_numpy() == v for n, v in zip(SHAPE, shape,
                                                                             strict=True)]), 1)
        ch = nonnegative_fit(x[~held], y[~held])
        errs.append((x[held] @ ch - y[held]) / y[held])
    return np.concatenate(errs), shapes


def fit_attention_decode(table: OperatorTable) -> AttentionDecodeFit:
    df = rows(table)
    x, y = design(df)
    c = nonnegative_fit(x, y)
    e, shapes = held_out_by_shape(df, x, y)
    rate = 1.0 / c[2] if c[2] > 0 else 0.0
    return AttentionDecodeFit(float(c[0]), float(c[1]), float(rate), df.height, len(shapes),
                              float(np.mean(np.abs(e))), float(np.mean(e)),
                              float(np.max(np.abs(e))))


def law_error(table: OperatorTable, floor_us: float, rate_bytes_per_us: float,
              per_request_us: float = 0.0) -> tuple[float, float]:
    """MAPE and bias of a (floor, rate, per-request) law on the table's rows."""
    x, y = design(rows(table))
    pred = floor_us + per_request_us * x[:, 1] + x[:, 2] / rate_bytes_per_us
    rel = (pred - y) / y
    return float(np.mean(np.abs(rel))), float(np.mean(rel))


# --- prefill (context) attention (decision AC9) ----------------------------------------------

PREFILL_COLUMNS = ("batch_size", "isl", "num_heads", "head_dim", "latency")


@dataclass(frozen=True)
class AttentionPrefillFit:
    floor_us: float
    work_scale: float
    rows: int
    shapes: int
    mape: float  # held out by shape
    bias: float


def prefill_design(df: pl.DataFrame, peak_flops: float, eps_max: float, m_half: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Columns (1, causal work at the ramp in µs at scale 1) and the measured µs: the
    kernel's prefill term (model.md §3.4) for ``batch_size`` prompts of ``isl`` tokens and no
    prefix, on one rank's ``num_heads``: causal work 4·(isl²/2) a prompt, at the dense ramp
    ``eps_max · T / (T + m_half)`` of the step's T = batch · isl tokens."""
    b = df["batch_size"].to_numpy().astype(np.float64)
    s = df["isl"].to_numpy().astype(np.float64)
    work = b * 4.0 * (s * s * 0.5) * df["num_heads"].to_numpy() * df["head_dim"].to_numpy()
    t = b * s
    ramp = eps_max * t / (t + m_half)
    x = np.column_stack([np.ones(df.height), work / (peak_flops * ramp) * 1e6])
    return x, df["latency"].to_numpy() * 1e3


def prefill_rows(table: OperatorTable) -> pl.DataFrame:
    df = table.frame
    missing = [c for c in PREFILL_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{table.path}: missing column(s) {missing}; a prefill attention "
                         f"table has {list(PREFILL_COLUMNS)}")
    keep = df.filter(pl.col("latency") > 0)
    if "window_size" in keep.columns:
        keep = keep.filter(pl.col("window_size") == 0)
    if "step" in keep.columns:
        keep = keep.filter(pl.col("step") == 0)
    if "kv_cache_dtype" in keep.columns:
        keep = keep.filter(pl.col("kv_cache_dtype") == "bfloat16")
    if keep.height == 0:
        raise ValueError(f"{table.path}: no full-attention bf16 rows without a prefix and with "
                         "a positive latency")
    return keep.group_by(["num_heads", "num_key_value_heads", "head_dim", "batch_size",
                          "isl"]).agg(pl.col("latency").min()).sort(
        ["num_heads", "num_key_value_heads", "head_dim", "batch_size", "isl"])


def fit_attention_prefill(table: OperatorTable, peak_flops: float, eps_max: float,
                          m_half: float) -> AttentionPrefillFit:
    df = prefill_rows(table)
    x, y = prefill_design(df, peak_flops, eps_max, m_half)
    c = nonnegative_fit(x, y)
    e, shapes = held_out_by_shape(df, x, y)
    scale = 1.0 / c[1] if c[1] > 0 else 0.0
    return AttentionPrefillFit(float(c[0]), float(scale), df.height, len(shapes),
                               float(np.mean(np.abs(e))), float(np.mean(e)))


def prefill_law_error(table: OperatorTable, peak_flops: float, eps_max: float, m_half: float,
                      floor_us: float, work_scale: float) -> tuple[float, float]:
    x, y = prefill_design(prefill_rows(table), peak_flops, eps_max, m_half)
    rel = (floor_us + x[:, 1] / work_scale - y) / y
    return float(np.mean(np.abs(rel))), float(np.mean(rel))
