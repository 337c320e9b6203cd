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
* per prefill walk (:func:`resolved`), the prefill-dependent terms (causal prefill
  attention, the one-kernel floor rule, PCP prefill gathers) are settled into an entry of
  the decode table's shape, with Σ SM, NVLink and NIC and their part of the summary;
* per call, :func:`kernel.model.step_fast.estimate` adds the decode attention reads (and the
  secondary reads) per layer, takes the stage maxima and summarises, as for a decode step.
  :func:`kernel.model.step.mixed_estimate` keeps the resolved entries keyed by the step's prefill
  rows (decision LS1), so a chunk shape seen before costs the decode path's work.

Every float operation that reaches a result is ``_compose``'s, on the same operands, in the same
order (``tests/test_step_mixed.py`` compares the float totals bit for bit on random pools and
summaries, and on every embedded scenario).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .step_fast import _fixed_summary, estimate, layer_token_terms, ramp_terms, routed_seconds

if TYPE_CHECKING:
    from .step import BatchSummary, _Prepared
    from .step_fast import FastPath

_TABLE_MAX = 8192  # (tokens, budget) entries per pool, as the decode table

__all__ = ["host", "resolved", "totals"]


def _tokens_terms(p: _Prepared, fast: FastPath, tokens: int, budget: int) -> tuple[Any, ...]:
    """The token-count-only terms of a step (model.md §1.3): (layers, pr, derate, ps, head_sm,
    head stage, Σ NVLink, Σ NIC — the graph collectives', which a PCP prefill gather adds
    to), per layer (count, flops, dense_shaped·derate, rec, dense SM before the attention's
    SM term, routed SM, routed HBM, routed, NVLink, NIC, elementwise, HBM base), then the
    layer's constants:
    the decode fast path's attention tuple (per-request seconds before the weight bytes), the
    one-kernel floor rule (floor below the prefill floor, or not), window index, q heads, head
    dim, secondaries, PCP gather (collective, widths) or None."""
    T, derate, ramp, pr, mfac = ramp_terms(p, tokens, budget)
    tp, peak, hbm_bps = p.tp, p.peak, p.hbm
    ps = peak * (ramp * p.prefill_scale) if p.prefill_scale > 0 else None
    layers = []
    tot_nv = tot_nic = 0.0
    for L, (mode, fl, kv, rate, weight, secs, preq) in zip(p.layers, fast.attn, strict=True):
        flops, dense_shaped, routed_flops, routed_wb, elementwise, rec = layer_token_terms(
            p, L, T, mfac)
        dsd = dense_shaped * derate
        dense_sm = flops / pr * derate + dsd + rec  # + the attention's SM term, per call
        routed_sm, routed_hbm = routed_seconds(p, L, routed_flops, routed_wb, pr, derate, hbm_bps)
        on_node, cross = L.graph_collective_seconds(T)
        base = (L.weight_bytes + 0.0 + elementwise) / hbm_bps  # no KV bytes read at HBM speed
        one_kernel = L.attn and L.one_kernel
        cnt = L.count
        tot_nv = tot_nv + cnt * on_node
        tot_nic = tot_nic + cnt * cross
        layers.append((
            cnt, flops, dsd, rec, dense_sm, routed_sm, routed_hbm, routed_sm + routed_hbm,
            on_node, cross, elementwise, base, mode, fl, kv, rate, preq, weight,
            one_kernel and L.attn_floor_lt_prefill, one_kernel and not L.attn_floor_lt_prefill,
            L.window_idx, L.q_heads, L.head_dim, secs,
            (L.pcp_gather_coll, L.pcp_widths) if L.pcp_gather else None))
    head_sm = T * p.head_flops / tp / pr * derate
    head_hbm = p.head_dw_hbm
    return (tuple(layers), pr, derate, ps, head_sm,
            head_sm if head_sm > head_hbm else head_hbm, tot_nv, tot_nic)


def totals(p: _Prepared, fast: FastPath, s: BatchSummary) -> tuple[Any, ...] | None:
    """(sm_s, hbm_s, nvlink_s, nic_s, host_s, host_ns, overlap_s) of a non-empty scalar summary
    on a pool with a fast path; None for an empty step (the shared path prices it)."""
    (_n, tokens_all, withheld, pre_req, dec_req, _dec_tok, dec_kv, pre_tok, causal, _ctx,
     uniform, budget, _reads, windowed, _runs) = s
    if tokens_all == 0:
        return None
    terms = resolved(p, fast, tokens_all - withheld, budget, pre_req, pre_tok, causal,
                     windowed, dec_req > 0)
    t: tuple[Any, ...] = estimate(p, fast, terms, dec_kv, dec_req,
                                  host(fast, tokens_all, uniform), None, True)
    return t


def host(fast: FastPath, tokens_all: int, uniform: bool) -> tuple[int, float, int]:
    """The host stage: eager above the capture size, the uniform-decode graph when every
    request schedules the pool's width, else the other graph mode."""
    if tokens_all > fast.capture:
        return fast.eager
    if uniform:
        return fast.hosts[1]
    return fast.hosts[2]


def resolved(p: _Prepared, fast: FastPath, tokens: int, budget: int, pre_req: int,
             pre_tok: int, causal: float, windowed: tuple[float, ...], dec: bool
             ) -> tuple[Any, ...]:
    """A step's table entry in the shape :func:`kernel.model.step_fast.estimate` reads, for the
    rank-local token count, SM budget, the prefill walk's aggregates and whether any request
    decodes: every term but the decode attention reads is settled here — the SM share with
    the causal prefill attention, the one-kernel floor rule, PCP prefill gathers, Σ SM,
    NVLink and NIC — in ``_compose``'s operation order. ``estimate`` adds the decode reads
    (none when ``dec`` is false: every layer's mode is then 0)."""
    key = tokens if not budget else (tokens, budget)
    table = fast.mixed
    terms = table.get(key)
    if terms is None:
        if len(table) >= _TABLE_MAX:
            table.clear()
        terms = table[key] = _tokens_terms(p, fast, tokens, budget)
    layers, pr, derate, ps, head_sm, head_stage, tot_nv, tot_nic = terms
    pre = pre_req > 0
    mixed = dec and pre
    tp, pf = p.tp, p.prefill_floor_s
    pcp_rows = float(p.pcp * pre_tok) if pre_tok > 0 else 0.0
    gathers = pcp_rows > 0 and fast.gathers
    if gathers:
        tot_nv = tot_nic = 0.0
    tot_sm = 0.0
    out = []
    for (cnt, flops, dsd, rec, dense_sm, rsm, rh, routed, on, cross, elementwise, base, mode,
         fl, kv, rate, preq, weight, floor_lt, floor_ge, widx, q_heads, head_dim, secs,
         pcp_gather) in layers:
        attn_sm: Any = 0.0
        if mode:  # the layer has attention
            if mixed and floor_ge:  # one launch (model.md §3.4); floor_lt: estimate's
                attn_sm = attn_sm - pf
            if pre:
                layer_causal = causal if widx < 0 else windowed[widx]
                if ps is not None:
                    attn_sm = attn_sm + (pf + layer_causal * q_heads * head_dim / tp / ps
                                         * derate)
                else:  # causal work on the plain ramp: the dense SM term changes
                    flops = flops + layer_causal * q_heads * head_dim / tp
                    dense_sm = flops / pr * derate + dsd + rec
        sm = dense_sm + attn_sm + rsm
        st = sm - rsm
        if gathers:
            if pcp_gather is not None:
                kc, widths = pcp_gather
                for width in widths:
                    t = kc.seconds(pcp_rows * width * 2)
                    if kc.crosses:
                        cross = cross + t
                    else:
                        on = on + t
            tot_nv = tot_nv + cnt * on
            tot_nic = tot_nic + cnt * cross
        m3 = st  # the stage's candidates but the HBM share: their first greatest
        if on > m3:
            m3 = on
        if cross > m3:
            m3 = cross
        tot_sm = tot_sm + cnt * sm
        out.append((cnt, mode if dec else 0, fl, kv, rate, preq, mixed and floor_lt,
                    secs if dec else (), base, rh, m3, routed, weight, elementwise))
    tot_sm = tot_sm + head_sm
    return (tuple(out), tot_sm, tot_nv, tot_nic, head_stage,
            _fixed_summary(tot_sm, tot_nv, tot_nic))
