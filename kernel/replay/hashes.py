"""Chained 64-bit block hashes for prefix caching (contract §1: ``prefix_hashes``).

Entry ``i`` of a request's chain identifies the content of its prompt tokens
``[0, (i+1) * hash_block_tokens)``: it mixes entry ``i-1`` with an id for block ``i``'s own
content, so two requests share entry ``i`` exactly when they share every block up to ``i``
(up to 64-bit collisions). The mixer is SplitMix64's finaliser, on numpy ``uint64`` arrays
whose products wrap modulo 2**64 by design.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["chain", "mix", "HASH_TYPE"]

HASH_TYPE = pa.list_(pa.uint64())

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROOT = np.uint64(0x243F6A8885A308D3)  # the "empty prefix" every chain starts from


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection on uint64 that spreads every input bit."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


def chain(offsets: np.ndarray, block_ids: np.ndarray) -> np.ndarray:
    """Chain per-block content ids into prefix hashes, list by list.

    ``offsets`` (n+1, int64) delimits each request's run in the flat ``block_ids`` (uint64);
    the result has the same layout. Vectorised over requests, one pass per block position.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = np.asarray(block_ids, dtype=np.uint64)
    out = np.empty_like(ids)
    lengths = np.diff(offsets)
    prev = np.full(lengths.size, _ROOT, dtype=np.uint64)
    longest = int(lengths.max()) if lengths.size else 0
    with np.errstate(over="ignore"):
        for j in range(longest):
            rows = np.flatnonzero(lengths > j)
            at = offsets[rows] + j
            h = mix((prev[rows] * _GOLDEN) ^ mix(ids[at] + np.uint64(j + 1)))
            out[at] = h
            prev[rows] = h
    return out


def list_array(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """A ``list<uint64>`` Arrow array from offsets and flat values."""
    if offsets.size and int(offsets[-1]) >= 2**31:
        raise ValueError(f"{int(offsets[-1]):,} prefix hash entries in one table; at most "
                         f"{2**31 - 1:,} (split the request source)")
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int32)),
                                    pa.array(np.asarray(values, dtype=np.uint64)))
