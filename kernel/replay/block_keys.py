"""Block keys: a request's prefix hash chain mapped onto the engine's block size.

The request source gives ``prefix_hashes``: entry i identifies prompt tokens [0, (i+1)·H)
(H = ``hash_block_tokens``). Engine block j covers [0, (j+1)·B). When B is a multiple of H,
block j's key is entry (j+1)·B/H − 1 itself (the chain is exact). Otherwise block j takes the
first entry covering it, mixed with j: equal entries imply equal prefixes up to the entry's end,
so equal keys still imply an equal block prefix (a key may miss a hit vLLM would see, never
invent one). Blocks beyond the chain have no key here: only the request itself (after a
preemption) can hit them, and the KV pool keeps them as one segment per request
(:mod:`kernel.replay.kv_cache`).

:func:`block_units` gives the same blocks in *units*: the blocks that take the same chain
entry, as one key (the first block's) and a count; block ``i`` of a unit has key
``unit key + i`` (mod 2**64), its :func:`block_keys` key. The KV pool keeps a unit as one
entry while its blocks share a state (:mod:`kernel.replay.kv_units`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["block_keys", "block_units"]

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def block_keys(hashes: Sequence[int] | None, hash_tokens: int | None, block_size: int,
               n_blocks: int) -> list[int]:
    """Keys of a request's leading blocks (at most ``n_blocks``) of ``block_size`` tokens
    that its hash chain identifies."""
    if not hashes or not hash_tokens:
        return []
    upto = min(len(hashes) * hash_tokens // block_size, n_blocks)
    if upto <= 0:
        return []
    h = np.asarray(hashes, np.uint64)
    j = np.arange(upto, dtype=np.int64)
    if block_size % hash_tokens == 0:
        return h[(j + 1) * (block_size // hash_tokens) - 1].tolist()
    first = -(-(j + 1) * block_size // hash_tokens) - 1  # the first entry covering block j
    # uint64 arithmetic wraps modulo 2^64, as (h * MIX + j) & (2^64 - 1) would
    return (h[first] * np.uint64(_MIX) + j.astype(np.uint64)).tolist()


def _entry_keys(hashes: Sequence[int], units: int, q: int) -> list[int]:
    """The unit keys of a chain's first ``units`` entries, ``q`` blocks each: entry e's
    hash × MIX + e·q, mod 2**64. A few entries in Python (numpy's per-call overhead costs
    more); a long chain in uint64 arithmetic, which wraps as the mask does (a hash outside
    [0, 2**64) cannot be held there: Python then)."""
    if units > 16:
        try:
            h = np.array(hashes[:units], np.uint64)
        except OverflowError:
            pass
        else:
            return (h * np.uint64(_MIX) + np.arange(0, units * q, q, dtype=np.uint64)).tolist()
    return [(int(x) * _MIX + e * q) & _MASK for e, x in enumerate(hashes[:units])]


def block_units(hashes: Sequence[int] | None, hash_tokens: int | None, block_size: int,
                n_blocks: int) -> tuple[list[int], list[int], list[int]]:
    """The blocks :func:`block_keys` names, as (unit keys, unit sizes in blocks, cumulative
    block ends): one unit per chain entry (a block taking the entry itself when B is a
    multiple of H)."""
    if not hashes or not hash_tokens:
        return [], [], []
    upto = min(len(hashes) * hash_tokens // block_size, n_blocks)
    if upto <= 0:
        return [], [], []
    if block_size % hash_tokens == 0:  # a unit per block: its entry, every q-th one
        q = block_size // hash_tokens
        return [int(x) for x in hashes[q - 1:upto * q:q]], [1] * upto, list(range(1, upto + 1))
    if hash_tokens % block_size == 0:  # q whole blocks per entry: the last unit may be cut
        q = hash_tokens // block_size
        units = -(-upto // q)
        keys = _entry_keys(hashes, units, q)
        sizes = [q] * units
        sizes[-1] = upto - (units - 1) * q
        return keys, sizes, [*range(q, units * q, q), upto]
    h = np.asarray(hashes, np.uint64)
    j = np.arange(upto, dtype=np.int64)
    first = -(-(j + 1) * block_size // hash_tokens) - 1  # the first entry covering block j
    starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])  # a unit per entry
    ends = np.r_[starts[1:], upto]
    with np.errstate(over="ignore"):
        unit_keys = h[first[starts]] * np.uint64(_MIX) + starts.astype(np.uint64)
    return unit_keys.tolist(), (ends - starts).tolist(), ends.tolist()
