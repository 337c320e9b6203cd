"""Deployment limits: is a step something the deployment could ever schedule?

The kernel prices any batch it is given, exactly as the reference does; this module only
*flags* a step that breaks one of the deployment's limits, so an impossible step is never
priced silently:

* ``max_num_seqs``: more requests than the scheduler runs at once;
* ``max_num_batched_tokens``: more scheduled tokens than the step's token budget;
* ``max_model_len``: a request whose context (computed + scheduled) exceeds the model length
  (not checked when the pool states no ``max_model_len``);
* ``kv_capacity``: the batch holds more KV blocks than the pool's KV cache has — each request
  holds ``ceil(context / (block_size × DCP shards))`` blocks (docs/decisions.md);
* ``duration``: the step's NoOverlap time saturated at 2^63−1 ns.

:func:`check` is the scalar form (one batch, a list of :class:`Breach`); :func:`check_batches`
the array form (per-batch totals → one bit mask per batch; bulk pricing takes the totals
where the rows are, :mod:`kernel.bulk.over_limit`), and :func:`label_array` turns masks into
the ``limits`` column. Both read the same :class:`Limits`, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import numpy as np

from .types import MAX_DURATION_NS, Batch

if TYPE_CHECKING:
    import pyarrow as pa

    from .pricer import Pricer
    from .resolved import ResolvedPool

# The limits in a fixed order: bit i of a mask is NAMES[i].
NAMES = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_capacity", "duration")
BIT = {name: 1 << i for i, name in enumerate(NAMES)}


@dataclass(frozen=True)
class Limits:
    """What one pool can schedule in one step (0 = not stated, not checked)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_blocks: int
    block_tokens: int  # tokens one KV block holds for one request (block_size × DCP shards)

    @classmethod
    def of(cls, k: Pricer) -> Limits:
        r = k.resolved_pool
        cap = k.kv_capacity()
        return cls(max_num_seqs=int(r.max_num_seqs),
                   max_num_batched_tokens=int(r.max_num_batched_tokens),
                   max_model_len=int(r.max_model_len), kv_blocks=int(cap.num_blocks),
                   block_tokens=block_tokens(r))


def block_tokens(r: ResolvedPool) -> int:
    """Tokens one KV block holds for one request: block_size × the DCP shards of its KV."""
    shard = r.layout.dcp if r.layout.dcp > 1 and r.dcp_shards_all_kv_layers else 1
    return max(int(r.block_size), 1) * shard


@dataclass(frozen=True)
class Breach:
    """One limit a step breaks: the limit, the deployment's value and the step's."""

    limit: str
    allowed: int
    value: int
    unit: str

    def __str__(self) -> str:
        if self.limit == "duration":
            return f"duration: the step time saturated at 2^63-1 ns ({self.value:,} ns)"
        return f"{self.limit} {self.allowed:,} < {self.value:,} {self.unit}"


@overload
def blocks_held(context: int, block_tokens: int) -> int: ...
@overload
def blocks_held(context: np.ndarray, block_tokens: int) -> np.ndarray: ...
def blocks_held(context: int | np.ndarray, block_tokens: int) -> int | np.ndarray:
    """KV blocks one request holds at ``context`` tokens (per element of an array)."""
    return -(-context // block_tokens)


def check(limits: Limits, batch: Batch, no_overlap_ns: int) -> list[Breach]:
    """Every limit ``batch`` breaks, in :data:`NAMES` order (empty: the step is possible)."""
    contexts = [q.computed + q.scheduled for q in batch.requests]
    return _breaches(limits, len(batch.requests), batch.tokens(), max(contexts, default=0),
                     sum(blocks_held(c, limits.block_tokens) for c in contexts), no_overlap_ns)


def check_slice(limits: Limits, scheduled: np.ndarray, computed: np.ndarray,
                no_overlap_ns: int) -> list[Breach]:
    """:func:`check` for one batch given as its rows' columns (exact Python integers)."""
    s = [int(x) for x in scheduled.tolist()]
    contexts = [a + int(b) for a, b in zip(s, computed.tolist(), strict=True)]
    return _breaches(limits, len(s), sum(s), max(contexts, default=0),
                     sum(blocks_held(c, limits.block_tokens) for c in contexts), no_overlap_ns)


def _breaches(limits: Limits, n: int, tokens: int, longest: int, held: int,
              no_overlap_ns: int) -> list[Breach]:
    out: list[Breach] = []
    if limits.max_num_seqs and n > limits.max_num_seqs:
        out.append(Breach("max_num_seqs", limits.max_num_seqs, n, "requests"))
    if limits.max_num_batched_tokens and tokens > limits.max_num_batched_tokens:
        out.append(Breach("max_num_batched_tokens", limits.max_num_batched_tokens, tokens,
                          "scheduled tokens"))
    if limits.max_model_len and longest > limits.max_model_len:
        out.append(Breach("max_model_len", limits.max_model_len, longest,
                          "tokens of context in one request"))
    if held > limits.kv_blocks:
        out.append(Breach("kv_capacity", limits.kv_blocks, held, "KV blocks held"))
    if no_overlap_ns >= MAX_DURATION_NS:
        out.append(Breach("duration", MAX_DURATION_NS - 1, no_overlap_ns, "ns"))
    return out


def check_batches(limits: Limits, requests: np.ndarray, tokens: np.ndarray,
                  longest: np.ndarray, held: np.ndarray, no_overlap_ns: np.ndarray
                  ) -> np.ndarray:
    """:func:`check` for many batches from their per-batch totals (requests, scheduled
    tokens, the longest context, KV blocks held): one ``uint8`` mask per batch."""
    mask = np.zeros(np.shape(requests), np.uint8)
    if limits.max_num_seqs:
        mask |= np.where(requests > limits.max_num_seqs, BIT["max_num_seqs"], 0).astype(np.uint8)
    if limits.max_num_batched_tokens:
        mask |= np.where(tokens > limits.max_num_batched_tokens,
                         BIT["max_num_batched_tokens"], 0).astype(np.uint8)
    if limits.max_model_len:
        mask |= np.where(longest > limits.max_model_len, BIT["max_model_len"], 0).astype(np.uint8)
    mask |= np.where(held > limits.kv_blocks, BIT["kv_capacity"], 0).astype(np.uint8)
    mask |= np.where(np.asarray(no_overlap_ns) >= MAX_DURATION_NS, BIT["duration"],
                     0).astype(np.uint8)
    return mask


def names(mask: int) -> list[str]:
    """The limit names set in one mask, in :data:`NAMES` order."""
    return [name for name in NAMES if mask & BIT[name]]


def label_array(masks: np.ndarray) -> pa.Array:
    """The ``limits`` column: the names each mask sets, comma-separated ("" for none), as an
    Arrow string array built without a Python loop per mask."""
    import pyarrow as pa  # (only bulk pricing needs Arrow)

    found, at = np.unique(masks, return_inverse=True)
    table = pa.array([",".join(names(m)) for m in found.tolist()], pa.string())
    return table.take(pa.array(at.reshape(-1).astype(np.int32)))
