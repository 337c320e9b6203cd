"""The scalar fast path of StepTime for batches with prefill (prefill-only and mixed).

:mod:`kernel.model.step_fast` prices all-decode batches; any prefill used to send a batch through the
shared, polymorphic :func:`kernel.model.step._compose`, which pays for its generality (every branch a
selection, attribute reads, a trace hook) on every call. On the same pools (no DCP, no
decode-read signature, a non-degenerate ramp) this module prices any non-empty
:class:`kernel.model.step.BatchSummary`:

* per (rank-local token count, SM budget), every layer term that depends on the token count
  alone (dense and routed GEMMs, elementwise bytes, recurrent scan, graph collectives, the
  head) is computed once with the operations of ``_compose`` in its order, and kept in a
  bounded per-pool table (:func:`_tokens_terms`);
* per call, only the batch-dependent terms (decode attention reads, the one-kernel floor
  rule, causal prefill attention, secondary reads, PCP prefill gathers) are added per layer,
  then the stage maxima and the totals.

Every float operation that reaches a result is ``_compose``'s, on the same operands, in the same
order (``tests/test_step_mixed.py`` compares the float totals bit for bit on random pools and
summaries, and on every embedded scenario).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import laws
from .step_fast import layer_token_terms, routed_seconds, secondary_attention

if TYPE_CHECKING:
    from .step import BatchSummary, _Prepared
    from .step_fast import FastPath

_TABLE_MAX = 8192  # (tokens, budget) entries per pool, as the decode table

__all__ = ["totals"]


def _tokens_terms(p: _Prepared, fast: FastPath, tokens: int, budget: int) -> tuple[Any, ...]:
    """The token-count-only terms of a step (model.md §1.3): (layers, pr, derate, ps, head_sm,
    head stage), per layer (count, flops, dense_shaped·derate, rec, dense SM before the
    attention's SM term, routed SM, routed HBM, routed, NVLink, NIC, elementwise, HBM base),
    then the layer's constants: the decode fast path's attention tuple (per-request seconds
    before the weight bytes), the one-kernel floor
    rule (floor below the prefill floor, or not), window index, q heads, head dim,
    secondaries, PCP gather (collective, widths) or None."""
    T = float(tokens)
    tp, peak, hbm_bps = p.tp, p.peak, p.hbm
    sm_count = p.sm_count
    derate: Any = 1.0
    if sm_count > 0 and budget > 0 and budget < sm_count:
        derate = sm_count / budget
    ramp = laws.efficiency(T, p.eps_max, p.m_half)
    pr = peak * ramp
    mfac = T / (T + p.m_half) if p.shape_aware and p.m_half > 0 else None
    ps = peak * (ramp * p.prefill_scale) if p.prefill_scale > 0 else None
    layers = []
    for L, (mode, fl, kv, rate, weight, secs, preq) in zip(p.layers, fast.attn, strict=True):
        flops, dense_shaped, routed_flops, routed_wb, elementwise, rec = layer_token_terms(
            p, L, T, mfac)
        dsd = dense_shaped * derate
        dense_sm = flops / pr * derate + dsd + rec  # + the attention's SM term, per call
        routed_sm, routed_hbm = routed_seconds(p, L, routed_flops, routed_wb, pr, derate, hbm_bps)
        on_node, cross = L.graph_collective_seconds(T)
        base = (L.weight_bytes + 0.0 + elementwise) / hbm_bps  # no KV bytes read at HBM speed
        one_kernel = L.attn and L.one_kernel
        layers.append((
            L.count, flops, dsd, rec, dense_sm, routed_sm, routed_hbm, routed_sm + routed_hbm,
            on_node, cross, elementwise, base, mode, fl, kv, rate, preq, weight,
            one_kernel and L.attn_floor_lt_prefill, one_kernel and not L.attn_floor_lt_prefill,
            L.window_idx, L.q_heads, L.head_dim, secs,
            (L.pcp_gather_coll, L.pcp_widths) if L.pcp_gather else None))
    head_sm = T * p.head_flops / tp / pr * derate
    head_hbm = p.head_dw_hbm
    return (tuple(layers), pr, derate, ps, head_sm,
            head_sm if head_sm > head_hbm else head_hbm)


def totals(p: _Prepared, fast: FastPath, s: BatchSummary) -> tuple[Any, ...] | None:
    """(sm_s, hbm_s, nvlink_s, nic_s, host_s, host_ns, overlap_s) of a non-empty scalar summary
    on a pool with a fast path; None for an empty step (the shared path prices it)."""
    (_n, tokens_all, withheld, pre_req, dec_req, _dec_tok, dec_kv, pre_tok, causal, _ctx,
     uniform, budget, _reads, windowed, _runs) = s
    if tokens_all == 0:
        return None
    tokens = tokens_all - withheld
    key = tokens if not budget else (tokens, budget)
    table = fast.mixed
    terms = table.get(key)
    if terms is None:
        if len(table) >= _TABLE_MAX:
            table.clear()
        terms = table[key] = _tokens_terms(p, fast, tokens, budget)
    layers, pr, derate, ps, head_sm, head_stage = terms
    dec = dec_req > 0
    pre = pre_req > 0
    mixed = dec and pre
    n_dec_kv = float(dec_kv)
    tp, hbm_bps, pf = p.tp, p.hbm, p.prefill_floor_s
    pcp_rows = float(p.pcp * pre_tok) if pre_tok > 0 else 0.0
    tot_sm = tot_hbm = tot_nv = tot_nic = overlap = 0.0
    for (cnt, flops, dsd, rec, dense_sm, rsm, rh, routed, on, cross, elementwise, base, mode,
         fl, kv, rate, preq, weight, floor_lt, floor_ge, widx, q_heads, head_dim, secs,
         pcp_gather) in layers:
        attn: Any = 0.0
        attn_sm: Any = 0.0
        hbm_base = base
        if mode:  # the layer has attention
            if mode == 1:
                if dec:
                    attn = fl + n_dec_kv * kv / rate
                    if preq > 0:  # decision AC4: per-request work
                        attn = attn + dec_req * preq
            elif dec:  # no measured rate: the KV bytes read at HBM speed
                hbm_base = (weight + n_dec_kv * kv + elementwise) / hbm_bps
            if mixed:  # the one-kernel backend launches once (model.md §3.4)
                if floor_lt:
                    attn = attn - fl
                elif floor_ge:
                    attn_sm = attn_sm - pf
            if pre:
                layer_causal = causal if widx < 0 else windowed[widx]
                if ps is not None:
                    attn_sm = attn_sm + (pf + layer_causal * q_heads * head_dim / tp / ps
                                         * derate)
                else:  # causal work on the plain ramp: the dense SM term changes
                    flops = flops + layer_causal * q_heads * head_dim / tp
                    dense_sm = flops / pr * derate + dsd + rec
            if dec and secs:
                attn = secondary_attention(attn, secs, n_dec_kv, dec_req)
        sm = dense_sm + attn_sm + rsm
        hbm = hbm_base + attn + rh
        if pcp_gather is not None and pcp_rows > 0:
            kc, widths = pcp_gather
            for width in widths:
                t = kc.seconds(pcp_rows * width * 2)
                if kc.crosses:
                    cross = cross + t
                else:
                    on = on + t
        st = sm - rsm
        d = hbm - rh
        if d > st:
            st = d
        if on > st:
            st = on
        if cross > st:
            st = cross
        overlap = overlap + cnt * (st + routed)
        tot_sm = tot_sm + cnt * sm
        tot_hbm = tot_hbm + cnt * hbm
        tot_nv = tot_nv + cnt * on
        tot_nic = tot_nic + cnt * cross
    tot_sm = tot_sm + head_sm
    tot_hbm = tot_hbm + fast.head_hbm
    overlap = overlap + head_stage
    if tokens_all > fast.capture:
        host_ns, host_s = fast.eager
    elif uniform:
        host_ns, host_s = fast.hosts[1]
    else:
        host_ns, host_s = fast.hosts[2]
    return tot_sm, tot_hbm, tot_nv, tot_nic, host_s, host_ns, overlap
