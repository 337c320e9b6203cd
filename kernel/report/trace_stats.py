"""The numbers behind the along-the-trace sections of the report (pure numpy, no drawing).

A priced trace can hold tens of millions of steps; every function here reduces it to at most
a few thousand points (windows of consecutive steps), so that the charts stay small and the
page renders quickly whatever the trace length. Steps are taken back to back: the wall time
at a step is the sum of the NoOverlap times before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = [
    "LIMIT_COLUMNS",
    "Limits",
    "Windows",
    "limit_flags",
    "median_step",
    "sample_rows",
    "windows",
]

MAX_WINDOWS = 500


@dataclass(frozen=True)
class Windows:
    """A trace cut into ``n`` windows of ``size`` consecutive steps (the last may be short)."""

    size: int
    starts: np.ndarray  # first step of each window
    counts: np.ndarray  # steps in each window
    wall_end_ns: np.ndarray  # wall time at the end of each window (steps back to back)
    wall_ns: np.ndarray  # Σ NoOverlap of the window's steps
    p50_ns: np.ndarray  # nearest-rank quantiles of NoOverlap within each window
    p99_ns: np.ndarray
    max_ns: np.ndarray

    @property
    def n(self) -> int:
        return int(self.starts.size)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Σ ``values`` (one per step) over each window."""
        v = np.asarray(values)
        if v.size == 0:
            return np.zeros(0)
        return np.add.reduceat(v.astype(np.float64), self.starts)

    def maxes(self, values: np.ndarray) -> np.ndarray:
        v = np.asarray(values)
        if v.size == 0:
            return np.zeros(0)
        return np.maximum.reduceat(v, self.starts)

    def any(self, flags: np.ndarray) -> np.ndarray:
        return self.maxes(np.asarray(flags, dtype=np.int8)) > 0


def _window_quantiles(values: np.ndarray, size: int, qs: tuple[float, ...]
                      ) -> list[np.ndarray]:
    """Nearest-rank quantiles per window of ``size`` steps (a partition, not a full sort)."""
    n = values.size
    full = n // size
    out = [np.zeros(full + (1 if n % size else 0), dtype=values.dtype) for _ in qs]
    ranks = [min(max(math.ceil(q * size), 1), size) - 1 for q in qs]
    if full:
        block = values[:full * size].reshape(full, size).copy()
        block.partition(sorted(set(ranks)), axis=1)
        for o, rk in zip(out, ranks, strict=True):
            o[:full] = block[:, rk]
    if n % size:
        tail = np.sort(values[full * size:])
        for o, q in zip(out, qs, strict=True):
            rk = min(max(math.ceil(q * tail.size), 1), tail.size) - 1
            o[full] = tail[rk]
    return out


def windows(no_overlap_ns: np.ndarray | pl.Series, max_windows: int = MAX_WINDOWS) -> Windows:
    """Cut the trace into at most ``max_windows`` windows of equal step count."""
    v = np.asarray(no_overlap_ns, dtype=np.int64)
    n = v.size
    size = max(math.ceil(n / max_windows), 1) if n else 1
    starts = np.arange(0, n, size, dtype=np.int64)
    counts = np.diff(np.append(starts, n))
    wall = np.add.reduceat(v, starts) if n else np.zeros(0, np.int64)
    p50, p99, mx = (_window_quantiles(v, size, (0.5, 0.99, 1.0)) if n
                    else [np.zeros(0, np.int64)] * 3)
    return Windows(size, starts, counts, np.cumsum(wall), wall, p50, p99, mx)


def sample_rows(n: int, limit: int, seed: int = 0) -> np.ndarray:
    """At most ``limit`` step indices, uniformly at random without replacement, in order."""
    if n <= limit:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=limit, replace=False))


# -- limits --------------------------------------------------------------------------------

# A hardening column, when bulk pricing wrote one: per step, the limits it breaks.
LIMIT_COLUMNS: tuple[str, ...] = ("limits",)


@dataclass(frozen=True)
class Limits:
    """Steps over a deployment limit: per limit, the steps that break it."""

    source: str  # "limits column" or "derived from tokens/requests/KV against the pool"
    flags: dict[str, np.ndarray]  # limit name -> bool per step
    any: np.ndarray  # bool per step: over at least one limit
    checked: bool = True  # False: nothing to check against (no column, no pool limits)

    @property
    def count(self) -> int:
        return int(self.any.sum())


def _limits_from_column(col: pl.Series) -> dict[str, np.ndarray]:
    """Per limit name, the steps whose ``limits`` value names it. The column may be a list of
    names, a comma-separated string, or a bit mask (named ``bit<i>``)."""
    dtype = col.dtype
    out: dict[str, np.ndarray] = {}
    if dtype == pl.List(pl.String) or isinstance(dtype, pl.List):
        names = col.explode().drop_nulls().unique().to_list()
        for name in sorted(str(x) for x in names if str(x)):
            out[name] = col.list.contains(name).fill_null(False).to_numpy()
        return out
    if dtype == pl.String:
        # Names come from the few distinct values; each flag is one literal search.
        text = col.fill_null("").str.replace_all(" ", "", literal=True)
        found = {n for v in text.unique().to_list() for n in str(v).split(",") if n}
        wrapped = ("," + text + ",")
        for name in sorted(found):
            out[name] = wrapped.str.contains(f",{name},", literal=True).to_numpy()
        return out
    if dtype.is_integer():
        bits = col.fill_null(0).to_numpy().astype(np.int64)
        for i in range(63):
            hit = (bits >> i) & 1 == 1
            if hit.any():
                out[f"bit{i}"] = hit
        return out
    raise ValueError(f"column 'limits' has type {dtype}; expected a list of names, a "
                     "comma-separated string or an integer bit mask")


def limit_flags(priced: pl.DataFrame, *, max_num_batched_tokens: int = 0,
                max_num_seqs: int = 0, kv_blocks_capacity: int = 0) -> Limits:
    """Which steps break a limit. The ``limits`` column of bulk pricing wins where present;
    otherwise the limits are checked here from the columns the priced trace has."""
    n = priced.height
    if "limits" in priced.columns:
        flags = _limits_from_column(priced["limits"])
        source = "the priced trace's limits column"
    else:
        flags = {}
        if max_num_batched_tokens > 0 and "tokens" in priced.columns:
            flags["max_num_batched_tokens"] = (priced["tokens"] > max_num_batched_tokens) \
                .to_numpy()
        if max_num_seqs > 0 and "requests" in priced.columns:
            flags["max_num_seqs"] = (priced["requests"] > max_num_seqs).to_numpy()
        if kv_blocks_capacity > 0 and "kv_blocks" in priced.columns:
            flags["kv_capacity"] = (priced["kv_blocks"] > kv_blocks_capacity).to_numpy()
        source = "checked against the pool's engine limits"
    anyf = np.zeros(n, dtype=bool)
    for f in flags.values():
        anyf |= f
    return Limits(source, flags, anyf, checked="limits" in priced.columns or bool(flags))


# -- the median steps ---------------------------------------------------------------------------

def median_step(priced: pl.DataFrame, prefill: bool) -> int | None:
    """The row of the nearest-rank median step among decode-only steps (``prefill=False``) or
    steps with prefill work; None when there is none."""
    if "prefill_requests" not in priced.columns or priced.height == 0:
        return None
    pre = priced["prefill_requests"].to_numpy() > 0
    tok = priced["tokens"].to_numpy() > 0 if "tokens" in priced.columns else np.ones_like(pre)
    mask = (pre if prefill else ~pre) & tok
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return None
    times = priced["no_overlap_ns"].to_numpy()[idx]
    rank = max(math.ceil(0.5 * idx.size), 1) - 1
    v = np.partition(times, rank)[rank]
    # The step a stable sort would put at ``rank``: among the steps that took exactly v, the
    # (rank − #faster)-th in trace order. Linear, where a sort of 10M steps is not.
    faster = int((times < v).sum())
    return int(idx[np.flatnonzero(times == v)[rank - faster]])
