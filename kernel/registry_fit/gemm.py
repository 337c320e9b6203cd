"""GEMM efficiency, scored and fitted from ``gemm_perf`` rows (docs/registry_fit.md).

The kernel prices a dense GEMM's SM time as ``2·M·N·K / (peak · eps_max · M / (M + m_half))``
(model.md §2.1). For one dtype, ``m_half`` is chosen on a grid and ``eps_max`` in closed form
(least squares of relative error), scored held out by (N, K) shape in five folds, over the
shapes a transformer layer has (N and K of 1,024 or more).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .tables import OperatorTable

COLUMNS = ("gemm_dtype", "m", "n", "k", "latency")
# Shapes a transformer layer has: the sweep's tiny N or K (8 to 512) time a kernel launch,
# which the kernel prices as host work, not as GEMM efficiency.
MIN_NK = 1024
M_HALF_GRID = np.unique(np.round(np.geomspace(1, 4096, 400)))


@dataclass(frozen=True)
class GemmFit:
    dtype: str
    eps_max: float
    m_half: float
    rows: int
    shapes: int
    mape: float  # held out by shape
    bias: float


def _best(flops_over_peak: np.ndarray, m: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    best = (0.0, 0.0, np.inf)
    for mh in M_HALF_GRID:
        r = flops_over_peak * (m + mh) / m / y  # prediction / measured at eps = 1
        inv = float(np.sum(r) / np.sum(r * r))  # 1/eps minimising sum((r/eps - 1)^2)
        err = float(np.sum((r * inv - 1.0) ** 2))
        if err < best[2]:
            best = (1.0 / inv, float(mh), err)
    return best[0], best[1]


def law_error(flops_over_peak: np.ndarray, m: np.ndarray, y: np.ndarray, eps: float,
              m_half: float) -> tuple[float, float]:
    rel = flops_over_peak / (eps * m / (m + m_half)) / y - 1.0
    return float(np.mean(np.abs(rel))), float(np.mean(rel))


def rows(table: OperatorTable, dtype: str, peak_flops: float) -> tuple[np.ndarray, ...]:
    df = table.frame
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{table.path}: missing column(s) {missing}; a GEMM table has "
                         f"{list(COLUMNS)}")
    d = df.filter((pl.col("gemm_dtype") == dtype) & (pl.col("latency") > 0)
                  & (pl.col("n") >= MIN_NK) & (pl.col("k") >= MIN_NK)).group_by(
        ["m", "n", "k"]).agg(pl.col("latency").min())
    if d.height == 0:
        raise ValueError(f"{table.path}: no {dtype!r} rows with a positive latency and N, K "
                         f">= {MIN_NK}")
    m, n, k = (d[c].to_numpy().astype(np.float64) for c in ("m", "n", "k"))
    return m, n, k, 2 * m * n * k / peak_flops * 1e6, d["latency"].to_numpy() * 1e3


def fit_gemm(table: OperatorTable, dtype: str, peak_flops: float, folds: int = 5) -> GemmFit:
    m, n, k, fp, y = rows(table, dtype, peak_flops)
    eps, mh = _best(fp, m, y)
    shape = (n * 1e6 + k).astype(np.int64)
    uniq = np.unique(shape)
    fold = {s: i % folds for i, s in enumerate(np.random.default_rng(0).permutation(uniq))}
    f = np.array([fold[s] for s in shape])
    errs = []
    for i in range(folds):
        e, h = _best(fp[f != i], m[f != i], y[f != i])
        errs.append(fp[f == i] / (e * m[f == i] / (m[f == i] + h)) / y[f == i] - 1.0)
    rel = np.concatenate(errs)
    return GemmFit(dtype, eps, mh, len(y), len(uniq), float(np.mean(np.abs(rel))),
                   float(np.mean(rel)))
