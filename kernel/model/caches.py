"""Caches as vLLM's hybrid allocator holds them (model.md §7.3–§7.5; issue 15).

A pool *states its caches* when its graph has a sliding-window ring or recurrent state: then
every KV-holding layer is a ``full`` or ``window`` cache and every recurrent layer a ``state``
cache, and vLLM's grouping sets one page size ``P`` (attention block raised and Mamba pages
padded, model.md §7.3), the group size ``G`` and ``k_c`` groups per cache type (§7.3). Every page of
any group costs one pool block ``PB = G·P``. A graph with neither keeps the legacy formulas (one
uniform group, identical numbers; decisions.md).

Pure functions of small integers, so the ring identities are property-tested directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import laws
from .resolved import Plan, PlannedAttention

FULL, WINDOW, STATE = "full", "window", "state"
# FlashAttention's kernel block alignment: vLLM raises a Mamba hybrid's attention block to a
# multiple of it (model.md §7.3).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class CacheType:
    kind: str  # full | window | state
    layers: int  # layers of this type
    groups: int  # k_c
    window: int = 0  # window caches only
    block: int = 0  # B_c: tokens per page (a smaller per-token page gets a longer block)


@dataclass(frozen=True)
class StatedCaches:
    types: tuple[CacheType, ...]
    block: int  # B: tokens per block of every attention group
    page_bytes: int  # P: one layer's page (attention page; state pages padded to it)
    group_size: int  # G
    state_mode: str  # mamba cache mode ("" without state caches)

    @property
    def pool_block_bytes(self) -> int:
        return self.group_size * self.page_bytes

    @property
    def groups(self) -> int:
        return sum(t.groups for t in self.types)


def group_size(counts: list[int]) -> int:
    """vLLM's G: the smallest layer count, or the largest if largest < 1.5 x smallest."""
    lo, hi = min(counts), max(counts)
    return hi if hi < 1.5 * lo else lo


def attention_block(block: int, state_page: float, per_token: float, mode: str) -> int:
    """The attention block of a Mamba hybrid in mode none/align: raised to
    ``A·cdiv(state_page, A·per_token)`` when that is larger than the stated block
    (model.md §7.3)."""
    if state_page <= 0 or per_token <= 0 or mode == "all":
        return block
    a = KERNEL_BLOCK_ALIGNMENT
    return max(block, a * math.ceil(state_page / (a * per_token)))


def layer_kv_bytes(a: PlannedAttention, tp: int, cache_bytes: float,
                   latent_per_token: float) -> float:
    """One KV layer's bytes per token on this rank (the SQL KVBytesPerToken, per layer)."""
    if a.kind in ("mla", "sparse_mla"):
        return latent_per_token
    return 2 * max(a.kv_heads // max(tp, 1), 1) * a.head_dim * cache_bytes


def state_caches(plan: Plan, kv_bytes_per_token: float, kv_layers: int, block: int,
                 mode: str, tp: int = 1, cache_bytes: float = 0.0) -> StatedCaches | None:
    """The caches a pool states, or None for a legacy pool (no window ring, no state, a
    mamba mode ``all`` whose chunk-aligned block the graph cannot give, or pages vLLM could
    not unify).

    ``kv_bytes_per_token`` is already per rank; a recurrent layer's state is divided by ``tp``
    here, as vLLM's state-shape calculator splits the heads (and groups) over TP ranks. Layers
    whose per-token page differs get vLLM's page unification: one page size ``P`` (the largest)
    and a block ``B·P/page`` for the smaller ones, which must divide exactly."""
    if kv_layers <= 0 or kv_bytes_per_token <= 0:
        return None
    uniform = kv_bytes_per_token / kv_layers
    types: dict[tuple[str, int, float], int] = {}
    state_layers, state_page = 0, 0.0
    for layer in plan.layers:
        scored = any(a.role == "block_index_scores" for a in layer.attentions)
        for a in (a for a in layer.attentions if a.holds_kv):
            per_token = layer_kv_bytes(a, tp, cache_bytes, uniform) if cache_bytes else uniform
            # A window the layer *selects from* (an index scorer beside it, MiniMax-M3) or a
            # latent window (DeepSeek-V4's compressed stream) is not a ring vLLM frees.
            ring = a.kind == "swa" and a.window > 0 and not scored
            key = (WINDOW if ring else FULL, a.window if ring else 0, per_token)
            types[key] = types.get(key, 0) + layer.count
        if layer.recurrent_kind:
            state_layers += layer.count
            state_page = max(state_page, layer.recurrent_state_bytes / max(tp, 1))
    if not state_layers and not any(kind_ == WINDOW for kind_, _, _ in types):
        return None
    if (state_layers and mode == "all") or sum(types.values()) != kv_layers:
        return None
    widest = max(per_token for _, _, per_token in types)
    b = attention_block(max(block, 1), state_page if state_layers else 0.0, widest, mode)
    page = int(b * widest)
    counts = [*types.values(), *([state_layers] if state_layers else [])]
    g = group_size(counts)
    out = []
    for (kind_, window, per_token), n in sorted(types.items(), key=lambda t: (t[0][0] != FULL,
                                                                              t[0][1])):
        own = b * per_token
        if own <= 0 or page % own:
            return None  # vLLM asserts the page ratio divides
        out.append(CacheType(kind_, n, laws.cdiv(n, g), window, int(b * page // own)))
    if state_layers:
        out.append(CacheType(STATE, state_layers, laws.cdiv(state_layers, g), 0, b))
    return StatedCaches(tuple(out), b, page, g, mode if state_layers else "")


def state_pages(mode: str, spec: int) -> int:
    """Pages a state cache holds per request: none 1+K, align 2+K (model.md §7.3)."""
    return (2 if mode == "align" else 1) + max(spec, 0)


def full_pages(c: StatedCaches, tokens: int, shard: int) -> int:
    """Pages of every full group at ``tokens`` (DCP/PCP shard the full caches only)."""
    if tokens <= 0:
        return 0
    t = laws.cdiv(tokens, shard) if shard > 1 else tokens
    return sum(ct.groups * laws.cdiv(t, ct.block) for ct in c.types if ct.kind == FULL)


def variable_bytes(c: StatedCaches, tokens: int, shard: int) -> int:
    return c.pool_block_bytes * full_pages(c, tokens, shard)


def bounded_bytes(c: StatedCaches, in_flight: int, spec: int, max_model_len: int) -> int:
    """State pages plus each window ring at ``in_flight`` tokens (model.md §7.5)."""
    pages = 0
    for ct in c.types:
        if ct.kind == STATE:
            pages += ct.groups * state_pages(c.state_mode, spec)
        elif ct.kind == WINDOW:
            pages += ct.groups * laws.ring_pages(ct.window, ct.block, in_flight, max_model_len)
    return c.pool_block_bytes * pages


def bounded_bytes_at(c: StatedCaches, computed: int, in_flight: int, spec: int,
                     max_model_len: int) -> int:
    """The same once ``computed`` tokens are held: a ring holds only what it has seen
    (model.md §7.5)."""
    pages = 0
    for ct in c.types:
        if ct.kind == STATE:
            pages += ct.groups * state_pages(c.state_mode, spec)
        elif ct.kind == WINDOW:
            pages += ct.groups * laws.ring_pages_at(computed, in_flight, ct.window, ct.block,
                                                    max_model_len)
    return c.pool_block_bytes * pages
