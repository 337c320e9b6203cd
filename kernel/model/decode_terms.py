"""A decode step's attention and collective terms, one by one (diagnosis, not pricing).

``decode_terms(r, contexts)`` restates, straight from model.md §1.3 and §3.7, the
terms of a decode-only step (every request schedules one token) that depend on the context
or on decode-context parallelism, per layer kind and per single layer, in seconds:

* ``kv_read``: the KV-holding attention's HBM read, ``floor + n·perLayerKV/rate`` with ``n``
  the selected (sparse top-k / compressed) and DCP-sharded tokens;
* ``secondary_read``: the non-KV attentions (e.g. a DSA indexer's block scores);
* ``dcp_query_gather``, ``dcp_lse_gather``, ``dcp_combine``: the DCP decode collectives;
* ``graph_collectives``: the graph's own (TP / EP) collectives.

It shares no code with :mod:`kernel.model.step` beyond the pure laws, so agreement with
:func:`kernel.model.step.layer_breakdown` checks the pricing path against the reference's procedure
term by term (``tests/test_dcp_terms.py``); the differences between two deployments say
which term moved (docs/decisions.md F3, F4).
"""

from __future__ import annotations

from . import laws
from .resolved import CollectiveKey, PlannedLayer, ResolvedPool

__all__ = ["TERMS", "decode_terms"]

TERMS = ("kv_read", "secondary_read", "dcp_query_gather", "dcp_lse_gather", "dcp_combine",
         "graph_collectives")

_DCP_KINDS = ("gqa", "mla", "sparse_mla")


def _latent(kind: str) -> bool:
    return kind in ("mla", "sparse_mla")


def _floor_rate(r: ResolvedPool, kind: str) -> tuple[float, float]:
    c = r.coefficients
    floor_ns, rate = c.attention_floor_ns, c.attention_rate_bps
    if kind in c.attention_by_kind:
        floor_ns, rate = c.attention_by_kind[kind]
    return laws.duration_seconds(floor_ns), rate


def _coll_seconds(key: CollectiveKey | None, nbytes: float) -> float:
    if key is None or key.peak_bps <= 0:
        return float("inf")
    b = nbytes * key.span if key.crosses_nodes else nbytes
    if len(key.knot_bytes) > 1:  # vLLM's all-reduce from measured knots (decision AC1)
        return float(laws.knot_time(b, key.knot_bytes,
                                    [laws.duration_seconds(ns) for ns in key.knot_ns]))
    return float(laws.collective_time(b, key.transition_bps, key.peak_bps,
                                      laws.duration_seconds(key.floor_ns)))


def _layer_terms(r: ResolvedPool, pl: PlannedLayer, contexts: list[int]) -> dict[str, float]:
    lay = r.layout
    dcp, inter = lay.dcp, r.dcp_interleave
    tokens = float(len(contexts))  # one scheduled token per request
    per_layer_kv = r.kv_bytes_per_token / r.kv_layers if r.kv_layers > 0 else 0.0
    terms = dict.fromkeys(TERMS, 0.0)
    if pl.attn_q_heads > 0:
        floor, rate = _floor_rate(r, pl.attn_kind)
        if rate > 0:
            topk = laws.sparse_top_k(pl.attn_kind, pl.attn_index_top_k, pl.attn_window)
            shards = dcp > 1 and pl.attn_kind in _DCP_KINDS
            n = float(sum(contexts))
            if topk > 0 or shards:
                n = laws.dcp_decode_tokens(contexts, topk, pl.attn_compress_ratio, dcp, inter,
                                           pl.attn_kind in _DCP_KINDS)
            terms["kv_read"] = floor + n * per_layer_kv / rate
            per_req = r.coefficients.attention_per_request_ns
            if per_req > 0 and pl.attn_kind not in r.coefficients.attention_by_kind:
                terms["kv_read"] += tokens * laws.duration_seconds(per_req)  # decision AC4
        primary = pl.attn_kv_heads * pl.attn_head_dim
        for a in pl.attentions:
            if a.role == "" or primary <= 0:
                continue
            floor2, rate2 = _floor_rate(r, a.kind)
            if rate2 <= 0:
                continue
            per_tok = per_layer_kv * (a.kv_heads * a.head_dim / primary)
            n2 = float(sum(contexts))
            if a.window > 0:
                n2 = min(n2, float(a.window * len(contexts)))
            if a.compress_ratio > 1:
                n2 = n2 / a.compress_ratio
            if dcp > 1 and a.kind in _DCP_KINDS:
                n2 = float(laws.dcp_local_tokens([laws.round_half(n2)], dcp, inter))
            terms["secondary_read"] += floor2 + n2 * per_tok / rate2
        if dcp > 1 and pl.attn_kind in _DCP_KINDS:
            rows = tokens if _latent(pl.attn_kind) else (tokens if contexts else 0.0)
            terms.update(_dcp_collectives(r, pl, rows))
    for col in pl.collectives:
        nbytes = tokens * col.bytes_per_token
        if col.routed_by_top_k and pl.top_k > 0 and r.layout.all2all_backend not in (
                "", "naive", "allgather_reducescatter") and r.layout.enable_expert_parallel:
            nbytes *= pl.top_k
        terms["graph_collectives"] += _coll_seconds(r.collectives.get((col.op, col.group)),
                                                    nbytes)
    return terms


def _dcp_collectives(r: ResolvedPool, pl: PlannedLayer, rows: float) -> dict[str, float]:
    """dcpDecodeCollectives (model.md §3.7), without PCP (the cases diagnosed here have pcp 1)."""
    if rows <= 0 or r.layout.pcp > 1:
        return {}
    tp, dcp = max(r.layout.tp, 1), r.layout.dcp
    q_w = pl.attn_head_dim
    o_w = pl.attn_kv_lora_rank if _latent(pl.attn_kind) and pl.attn_kv_lora_rank > 0 else q_w
    heads = pl.attn_q_heads / tp * dcp
    coll = r.collectives.get
    out = {"dcp_query_gather": _coll_seconds(coll(("all_gather", "dcp")), rows * heads * q_w * 2)}
    if r.dcp_comm_backend == "a2a":
        out["dcp_combine"] = _coll_seconds(coll(("all2all", "dcp")), rows * heads * (o_w + 2) * 2)
        return out
    out["dcp_lse_gather"] = _coll_seconds(coll(("all_gather", "dcp")), dcp * rows * heads * 4)
    out["dcp_combine"] = _coll_seconds(coll(("reduce_scatter", "dcp")), rows * heads * o_w * 2)
    return out


def decode_terms(r: ResolvedPool, contexts: list[int]) -> dict[str, dict[str, float]]:
    """Per layer kind (``kind_id``): one layer's terms, in seconds, for a decode step of one
    token per request at the given contexts (``computed + 1``), plus ``count``."""
    return {pl.kind_id: {**_layer_terms(r, pl, contexts), "count": float(pl.count)}
            for pl in r.plan.layers}
