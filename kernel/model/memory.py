"""Per-rank memory (model.md §7).

Decisions (the lead's, resolving the old goldens against the seed API):

* :func:`fixed_bytes` keeps five fields but ``comm_buffers`` is 0: the communicator
  reservation and the engine workspace are :func:`pre_snapshot_bytes` (model.md §7.2), held before
  vLLM measures its ``gpu_memory_utilization`` budget. The old golden "total 83.9 GiB"
  (case 96) is ``fixed.total() + pre_snapshot_bytes``.
* EPLB redundant experts are moved out of the weights (``W -= eplb``, model.md §7.1).
* A pool whose graph has a sliding-window ring or recurrent state *states its caches*
  (:mod:`kernel.model.caches`, issue 15): pages are whole pool blocks of vLLM's hybrid allocator and
  window rings are bounded. Other pools keep the legacy formulas, where SequenceFixed,
  Admission, Bounded and BoundedAt all equal the legacy SequenceFixedBytes (recurrent state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import caches, laws
from .resolved import ResolvedPool
from .types import MemoryBreakdown

GIB = 2**30
# vLLM's gpu_memory_utilization default at v0.29.0 and v0.31.0 (upstream's scenario generator
# notes it is 0.92, not 0.9), used when a pool states none. See docs/decisions.md.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "KVCapacity",
    "fixed_bytes",
    "kv_capacity",
    "pre_snapshot_bytes",
    "sequence_admission_bytes",
    "sequence_bounded_bytes",
    "sequence_bounded_bytes_at",
    "sequence_fixed_bytes",
    "sequence_variable_bytes",
]


def fixed_bytes(r: ResolvedPool) -> MemoryBreakdown:
    """Per-rank bytes inside the budget before any request (model.md §7.1; CommBuffers moved
    out)."""
    tp = max(r.layout.tp, 1)
    w = 0.0
    for layer in r.plan.layers:
        w += layer.count * layer.dense_weight_bytes / tp
        if layer.expert_weight_bytes_per_expert > 0:
            w += (layer.count * layer.expert_weight_bytes_per_expert * r.experts_per_rank
                  / r.expert_tensor_shards)
            w += layer.count * layer.shared_expert_weight_bytes / tp
    mem = r.memory
    w += (r.plan.head.dense_weight_bytes
          + mem.vocab_size * mem.hidden_size * mem.checkpoint_weight_bytes) / tp
    act = max(mem.activation_buffers * mem.batched_tokens * mem.activation_width * 2,
              mem.activation_floor)
    eplb = 0.0
    redundant = r.eplb_redundant_experts
    if redundant > 0 and r.layout.expert_width > 0:
        for layer in r.plan.layers:
            if layer.expert_weight_bytes_per_expert > 0:
                eplb += (layer.count * layer.expert_weight_bytes_per_expert * redundant
                         / r.layout.expert_width / r.expert_tensor_shards)
        w -= eplb  # moved out of the weights, so the total counts them once (model.md §7.1)
    return MemoryBreakdown(
        weights=int(w),
        activation_peak=int(act),
        cuda_graph=int(mem.capture_bytes),
        comm_buffers=0,  # the communicator and workspace are pre-snapshot (model.md §7.2) ...
        eplb_redundant=int(eplb),
        pre_snapshot=pre_snapshot_bytes(r),  # ... and shown here, outside total()
    )


def pre_snapshot_bytes(r: ResolvedPool) -> int:
    """Communicator reservation + engine workspace, held before vLLM's snapshot (model.md §7.2)."""
    return int(r.memory.comm_bytes) + int(r.memory.workspace_bytes)


def _spec(r: ResolvedPool) -> int:
    return max(r.num_spec_tokens, 0)


def _shard(r: ResolvedPool) -> int:
    """The DCP width a request's full KV is striped over (legacy: when every KV layer shards)."""
    return r.layout.dcp if r.layout.dcp > 1 and r.dcp_shards_all_kv_layers else 1


def sequence_variable_bytes(r: ResolvedPool, tokens: int) -> int:
    """One request's KV at ``tokens`` tokens in whole pages (model.md §7.4, legacy path)."""
    if tokens <= 0:
        return 0
    if r.caches is not None:
        return caches.variable_bytes(r.caches, tokens, _shard(r))
    dcp = r.layout.dcp
    # Known divergence (model.md §11 item 4): one non-sharding KV layer kind leaves capacity
    # unsharded, while the decode read is sharded per kind.
    t = laws.cdiv(tokens, dcp) if dcp > 1 and r.dcp_shards_all_kv_layers else tokens
    total = laws.paged_bytes(t, r.block_size, r.kv_bytes_per_token)
    if r.recurrent_cache_mode == "all":
        spec = _spec(r)
        for layer in r.plan.layers:
            if layer.recurrent_kind:
                total += int(laws.recurrent_state_bytes(
                    layer.recurrent_state_bytes, "all", tokens, r.block_size, spec, 0)
                    * layer.count)  # recurrent state is never DCP-sharded: unsharded tokens
    return int(total)


def sequence_fixed_bytes(r: ResolvedPool) -> int:
    """Length-independent per-request bytes: recurrent state (model.md §7.6, legacy path)."""
    if r.caches is not None:
        return caches.bounded_bytes(r.caches, 1 + _spec(r), _spec(r), r.max_model_len)
    mode = r.recurrent_cache_mode
    if mode == "all":
        return 0
    spec = _spec(r)
    total = 0.0
    for layer in r.plan.layers:
        if layer.recurrent_kind:
            total += laws.recurrent_state_bytes(
                layer.recurrent_state_bytes, mode, r.max_model_len, r.block_size, spec,
                0) * layer.count
    return int(total)


def sequence_admission_bytes(r: ResolvedPool) -> int:
    """What admission reserves whatever the length: rings at max_num_batched_tokens (model.md §7.5);
    legacy graphs have no rings."""
    if r.caches is not None:
        return sequence_bounded_bytes(r, r.max_num_batched_tokens)
    return sequence_fixed_bytes(r)


def sequence_bounded_bytes(r: ResolvedPool, in_flight: int) -> int:
    """Bounded state at ``in_flight`` tokens; legacy: SequenceFixedBytes for every f
    (model.md §7.5)."""
    if r.caches is not None:
        return caches.bounded_bytes(r.caches, max(in_flight, 0), _spec(r), r.max_model_len)
    return sequence_fixed_bytes(r)


def sequence_bounded_bytes_at(r: ResolvedPool, computed: int, in_flight: int) -> int:
    """Bounded state after ``computed`` tokens; legacy: SequenceFixedBytes (model.md §7.5)."""
    if r.caches is not None:
        return caches.bounded_bytes_at(r.caches, max(computed, 0), max(in_flight, 0), _spec(r),
                                       r.max_model_len)
    return sequence_fixed_bytes(r)


@dataclass(frozen=True)
class KVCapacity:
    """The KV budget per rank and what it holds (vLLM's startup report)."""

    budget_bytes: int  # MemoryGiB·2^30·utilization − FixedBytes().Total()
    page_bytes: int  # legacy: SVB(block_size); stated caches: one pool block G·P
    num_blocks: int
    tokens: int  # num_blocks·block_size (×DCP when every KV layer shards)
    # num_blocks·page / (SVB(max_model_len) + SequenceAdmissionBytes); None when the pool states
    # no max_model_len (vLLM takes it from the model config, which the catalog does not carry).
    max_concurrency: float | None
    utilization: float
    utilization_assumed: bool


def kv_capacity(r: ResolvedPool, fixed: MemoryBreakdown,
                utilization: float | None = None) -> KVCapacity:
    """KV blocks in the budget and concurrency at max_model_len (model.md §7.7, §14.5 item 9).

    ``utilization``: the pool's stated gpu_memory_utilization; None or 0 means unstated, and
    vLLM's default applies.
    """
    assumed = utilization is None or utilization <= 0
    util = DEFAULT_GPU_MEMORY_UTILIZATION if assumed else float(utilization)  # type: ignore[arg-type]
    budget = int(r.chip_memory_gib * GIB * util) - fixed.total()
    block = max(r.block_size, 1)
    shard = _shard(r)
    if r.caches is not None:
        # vLLM: G shared tensors of P x num_blocks, num_blocks = available // P // G; the
        # reported size is num_blocks // num_groups blocks of B tokens (model.md §7.7).
        block = min(t.block for t in r.caches.types)  # vLLM reports min_block_size
        page = r.caches.pool_block_bytes
        blocks = budget // page if budget > 0 else 0
        held = blocks // max(r.caches.groups, 1) * block * shard
    else:
        page = sequence_variable_bytes(r, block)
        blocks = budget // page if page > 0 and budget > 0 else 0
        held = blocks * block * shard
    per_request = sequence_variable_bytes(r, r.max_model_len) + sequence_admission_bytes(r)
    concurrency: float | None = None
    if r.max_model_len > 0:
        concurrency = (blocks * page / per_request) if per_request > 0 else math.inf
    return KVCapacity(budget_bytes=budget, page_bytes=page, num_blocks=blocks,
                      tokens=held, max_concurrency=concurrency,
                      utilization=util, utilization_assumed=assumed)
