"""Chained 64-bit block hashes for prefix caching: the ``prefix_hashes`` column of a request set.

Entry ``i`` of a request's chain identifies the content of its prompt tokens
``[0, (i+1) * hash_block_tokens)``: it mixes entry ``i-1`` with an id for block ``i``'s own
content, so two requests share entry ``i`` exactly when they share every block up to ``i``
(up to 64-bit collisions). The mixer is SplitMix64's finaliser, on numpy ``uint64`` arrays
whose products wrap modulo 2**64 by design.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["chain", "chain_lengths", "mix", "HASH_TYPE"]

HASH_TYPE = pa.list_(pa.uint64())

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROOT = np.uint64(0x243F6A8885A308D3)  # the "empty prefix" every chain starts from


def chain_lengths(hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Entries of each request's chain in a ``prefix_hashes`` column (0 for a null)."""
    return np.asarray(pc.fill_null(pc.list_value_length(hashes), 0)
                      .to_numpy(zero_copy_only=False), np.int64)


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


def take_lists(a: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """``a.take(idx)`` for a ``list<uint64>`` array, gathered with numpy (Arrow's list take
    is several times slower on tens of millions of entries)."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    a = a.cast(HASH_TYPE)
    idx = np.asarray(idx, dtype=np.int64)
    offsets = np.asarray(a.offsets, dtype=np.int64)
    values = np.asarray(a.values.to_numpy(zero_copy_only=False), dtype=np.uint64)
    lens = np.diff(offsets)[idx]
    new_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    gather = np.repeat(offsets[:-1][idx] - new_off[:-1], lens) + np.arange(int(new_off[-1]))
    valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)[idx]
    out = list_array(new_off, values[gather])
    if valid.all():
        return out
    return pa.ListArray.from_arrays(pa.array(new_off.astype(np.int32)),
                                    pa.array(values[gather], pa.uint64()),
                                    mask=pa.array(~valid))
