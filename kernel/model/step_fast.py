"""The scalar fast path of StepTime for all-decode batches (the simulator's common call).

A discrete-event simulator prices one decode step per call, so the shared, polymorphic
:func:`kernel.model.step.compose` (written once for Python scalars and numpy columns alike) pays for
its generality on every call. For a batch whose every request decodes (``0 < scheduled <=
decode_threshold``) on a pool without decode-context parallelism, everything but the
attention reads depends on the step's token count alone (and on the SM budget). This module:

* prepares, once per pool, the per-layer attention constants;
* computes, once per (token count, SM budget), every term that depends on the token count only
  (:func:`_tokens_terms`), with the very operations of :func:`kernel.model.step._compose` in its
  order, and keeps it in a bounded per-pool table;
* per call, walks the requests with C-level builtins, adds the attention reads per layer,
  takes the stage maxima and summarises (model.md §1.4) inline.

Every float operation that reaches a result is the shared path's operation, in the same order,
on the same operands, so the results are bit-identical; ``tests/test_step_fast.py`` checks that
against :func:`kernel.model.step.compose` + :func:`kernel.model.step.finish` on random pools and batches.
Anything else (a prefill, an empty batch, DCP, a degenerate ramp) returns ``None`` and the
caller takes the shared path.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from . import laws
from .types import MAX_DURATION_NS, Resource, StepEstimate

if TYPE_CHECKING:
    from .step import _Prepared

_FIRST = itemgetter(0)
_SECOND = itemgetter(1)
_TWO_63 = 9223372036854775808.0
_TABLE_MAX = 8192  # (tokens, budget) entries per pool; a decode step has at most max_num_seqs·q
_SM, _HBM, _NVLINK, _NIC, _HOST = (Resource.SM, Resource.HBM, Resource.NVLINK, Resource.NIC,
                                   Resource.HOST)
_new = object.__new__

__all__ = ["FastPath", "build", "decode_estimate", "decode_totals", "estimate", "step",
           "summarize", "totals"]


class FastPath:
    """Per-pool constants of the decode fast path and its per-token-count table."""

    __slots__ = ("attn", "capture", "chunks", "eager", "gathers", "head_hbm", "hosts", "mixed",
                 "table", "width")

    def __init__(self, p: _Prepared):
        # Per layer: (mode, floor_s, kv, rate, weight_bytes, secondaries, per-request s);
        # mode 0: no attention, 1: a measured decode rate, 2: no rate (KV bytes read at HBM
        # speed).
        attn = []
        for L in p.layers:
            preq = 0.0
            if not L.attn:
                mode, fl, kv, rate = 0, 0.0, 0.0, 0.0
            elif L.attn_rate > 0:
                mode, fl, kv, rate = 1, L.attn_floor_s, L.kv, L.attn_rate
                preq = L.attn_per_req_s
            else:
                mode, fl, kv, rate = 2, 0.0, L.kv, 0.0
            secs = tuple((a.window, a.compress, a.floor_s, a.per_tok, a.rate)
                         for a in L.secondaries) if L.attn else ()
            attn.append((mode, fl, kv, rate, L.weight_bytes, secs, preq))
        self.attn = tuple(attn)
        self.width = p.uniform_width
        self.capture = p.capture
        self.head_hbm = p.head_dw_hbm
        # host ns and its Duration.Seconds() for: eager (above capture), decode mode, other.
        # The host stage's ns, seconds and ns as a resource total (0 where not > 0) for each.
        self.hosts = tuple((ns, s, _duration(s) if s > 0 else 0) for ns, s in (
            (ns, laws.duration_seconds(ns)) for ns in (
                p.eager_ns + p.launch_ns, p.host_decode_ns + p.launch_ns,
                p.host_other_ns + p.launch_ns)))
        self.eager = self.hosts[0]
        self.table: dict[Any, tuple[Any, ...]] = {}
        self.mixed: dict[Any, tuple[Any, ...]] = {}  # kernel.model.step_mixed's table
        # (Σ scheduled, budget, any decode, prefill rows...) -> kernel.model.step.mixed_estimate's
        self.chunks: dict[Any, tuple[Any, ...]] = {}
        self.gathers = any(L.pcp_gather for L in p.layers)  # PCP prefill gathers: per call


def build(p: _Prepared) -> FastPath | None:
    """The pool's fast path, or None where only the shared path applies."""
    if p.degenerate or p.dcp > 1 or p.decode_sigs:
        return None
    if any(L.dcp_decode for L in p.layers):
        return None
    return FastPath(p)


def layer_token_terms(p: _Prepared, L: Any, T: float, mfac: Any) -> tuple[Any, ...]:
    """One layer's terms that depend on the token count ``T`` only, in the shared path's
    operation order: (dense FLOPs, shape-aware dense seconds before the derate, routed FLOPs,
    routed weight bytes, elementwise bytes, recurrent seconds). The decode and the mixed fast
    paths both take them from here."""
    tp, peak = p.tp, p.peak
    flops: Any = 0.0
    dense_shaped: Any = 0.0
    if L.gemms:
        for f, kfac, nfac in L.gemms:
            eff: Any = p.eps_max
            if mfac is not None:
                eff = eff * mfac
            if kfac is not None:
                eff = eff * kfac
            if nfac is not None:
                eff = eff * nfac
            dense_shaped = dense_shaped + T * f / tp / (peak * eff)
    elif not p.shape_aware:
        flops = T * L.dense_flops / tp
    routed_flops: Any = 0.0
    routed_wb: Any = 0.0
    if L.expert:
        routed_tokens = T * L.funnel
        routed_per_rank = routed_tokens * L.top_k * L.share
        routed_flops = routed_per_rank * L.expert_flops * p.imbalance / L.dp_slice
        touched = laws.experts_touched(laws.round_half(routed_tokens), L.total_experts,
                                       L.top_k, L.experts_per_rank)
        routed_wb = L.ets_weight * touched
        flops = flops + T * L.shared_flops / tp
    elementwise = T * L.elementwise / tp
    rec: Any = 0.0
    if L.rec:
        rec = L.rec_floor_s + T / L.rec_rate
    return flops, dense_shaped, routed_flops, routed_wb, elementwise, rec


def routed_seconds(p: _Prepared, L: Any, routed_flops: Any, routed_wb: Any, pr: Any,
                   derate: Any, hbm_bps: float) -> tuple[Any, Any]:
    """(routed SM, routed HBM) seconds of one layer: the reference's dense ramp and derated HBM
    rate, or, where the measured layer carries vLLM's fitted fused MoE law (decision MF1), its
    floor plus the touched weights at the fitted rate (HBM) and the routed FLOPs at the fitted
    fraction of the peak (SM)."""
    if not (L.expert and L.moe_rate > 0):
        return routed_flops / pr * derate, routed_wb / hbm_bps
    sm: Any = 0.0
    if L.moe_eff > 0:
        sm = routed_flops / (p.peak * L.moe_eff) * derate
    return sm, L.moe_floor_s + routed_wb / L.moe_rate


def secondary_attention(attn: Any, secs: Any, n_kv: Any, n_dec: int) -> Any:
    """``attn`` plus each secondary attention read of a decode step (a window caps the KV
    tokens at window × requests, a compression divides them), in the shared path's order."""
    for window, compress, f2, per_tok, r2 in secs:
        n: Any = n_kv
        if window > 0:
            w = float(window * n_dec)
            if not (n <= w or n != n):  # Go's min
                n = w
        if compress > 1:
            n = n / compress
        attn = attn + (f2 + n * per_tok / r2)
    return attn


def ramp_terms(p: _Prepared, tokens: int, budget: int) -> tuple[float, Any, Any, Any, Any]:
    """The token count's scalars both fast paths start from, as the shared path computes
    them (model.md §2.1, §2.5): (T, SM derate, ramp, peak · ramp, the shape-aware factor or
    None)."""
    T = float(tokens)
    sm_count = p.sm_count
    derate: Any = 1.0
    if sm_count > 0 and budget > 0 and budget < sm_count:
        derate = sm_count / budget
    ramp = laws.efficiency(T, p.eps_max, p.m_half)
    mfac = T / (T + p.m_half) if p.shape_aware and p.m_half > 0 else None
    return T, derate, ramp, p.peak * ramp, mfac


def _tokens_terms(p: _Prepared, fast: FastPath, tokens: int, budget: int) -> tuple[Any, ...]:
    """Every term of a decode step that depends on the token count only (model.md §1.3), in the
    shared path's operation order: per layer (count, then the layer's attention constants:
    mode, floor, KV bytes per token, rate, per-request seconds, whether the floor comes off
    again (never in a decode step: see :func:`estimate`), secondaries; HBM base, routed
    HBM, the stage's token-only candidates (dense SM share, NVLink, NIC) already maxed, routed,
    weight bytes, elementwise bytes), then (Σ SM with the head, Σ NVLink, Σ NIC, the head's
    stage, :func:`_fixed_summary` of those three totals)."""
    T, derate, _ramp, pr, mfac = ramp_terms(p, tokens, budget)
    tp = p.tp
    hbm_bps = p.hbm
    layers = []
    tot_sm = tot_nv = tot_nic = 0.0
    for L, (mode, fl, kv, rate, weight, secs, preq) in zip(p.layers, fast.attn, strict=True):
        flops, dense_shaped, routed_flops, routed_wb, elementwise, rec = layer_token_terms(
            p, L, T, mfac)
        # attn_sm stays 0.0 in a batch without prefill (every prefill term is deselected).
        dense_sm = flops / pr * derate + dense_shaped * derate + rec + 0.0
        routed_sm, routed_hbm = routed_seconds(p, L, routed_flops, routed_wb, pr, derate, hbm_bps)
        routed = routed_sm + routed_hbm
        sm = dense_sm + routed_sm
        on_node, cross = L.graph_collective_seconds(T)
        # With a measured rate the KV-bytes term is 0.0, so the HBM base is fixed here.
        base = (weight + 0.0 + elementwise) / hbm_bps if mode != 2 else 0.0
        # The stage is Go's running max over (SM share, HBM share, NVLink, NIC) with ">": the
        # three token-only candidates are maxed here in their order and the call's HBM share
        # meets their winner. Equal values are equal floats (a zero's sign aside, which
        # st + routed ≥ +0.0 and a sum from +0.0 erase), and a NaN never wins either way.
        smd = sm - routed_sm
        m3 = smd
        if on_node > m3:
            m3 = on_node
        if cross > m3:
            m3 = cross
        cnt = L.count
        tot_sm = tot_sm + cnt * sm
        tot_nv = tot_nv + cnt * on_node
        tot_nic = tot_nic + cnt * cross
        layers.append((cnt, mode, fl, kv, rate, preq, False, secs, base, routed_hbm, m3,
                       routed, weight, elementwise))
    head_sm = T * p.head_flops / tp / pr * derate
    head_hbm = p.head_dw_hbm
    tot_sm = tot_sm + head_sm
    head_stage = head_sm if head_sm > head_hbm else head_hbm
    return (tuple(layers), tot_sm, tot_nv, tot_nic, head_stage,
            _fixed_summary(tot_sm, tot_nv, tot_nic))


def step(p: _Prepared, fast: FastPath, batch: Any, per: dict[Resource, int] | None
         ) -> StepEstimate | None:
    """StepTime of an all-decode batch, or None when the batch is not one (shared path)."""
    t = totals(p, fast, batch)
    return None if t is None else summarize(t, per)


def totals(p: _Prepared, fast: FastPath, batch: Any) -> tuple[Any, ...] | None:
    """(sm_s, hbm_s, nvlink_s, nic_s, host_s, host_ns, overlap_s) of an all-decode batch: the
    non-empty fields of :class:`kernel.model.step.StepTotals`; None for any other batch."""
    reqs = batch.requests
    if not reqs:
        return None
    seen = set(map(_FIRST, reqs))  # the distinct scheduled counts: one in a uniform decode
    if len(seen) == 1:
        (lo,) = seen
        hi = lo
        if lo <= 0 or hi > batch.decode_threshold:
            return None
        tokens = lo * len(reqs)
    else:
        lo, hi = min(seen), max(seen)
        if lo <= 0 or hi > batch.decode_threshold:
            return None
        tokens = sum(map(_FIRST, reqs))
    return decode_totals(p, fast, tokens, sum(map(_SECOND, reqs)) + tokens, lo, hi, len(reqs),
                         batch.sm_budget)


def decode_totals(p: _Prepared, fast: FastPath, tokens: int, kv_tokens: int, lo: int, hi: int,
                  n_dec: int, budget: int) -> tuple[Any, ...]:
    """:func:`totals` of an all-decode batch from its aggregates: Σ scheduled, Σ (computed +
    scheduled), the least and greatest scheduled count (both > 0 and <= the decode threshold:
    the caller's check), the request count and the SM budget."""
    t: tuple[Any, ...] = decode_estimate(p, fast, tokens, kv_tokens, lo, hi, n_dec, budget,
                                         None, True)
    return t


def decode_estimate(p: _Prepared, fast: FastPath, tokens: int, kv_tokens: int, lo: int,
                    hi: int, n_dec: int, budget: int, per: dict[Resource, int] | None,
                    raw: bool = False) -> Any:
    """``summarize(decode_totals(...), per)``, bit for bit (``raw``: the totals themselves):
    the per-token-count entry (built on first use, the table bounded) and the host stage,
    then :func:`estimate`."""
    key = tokens if not budget else (tokens, budget)
    table = fast.table
    terms = table.get(key)
    if terms is None:
        if len(table) >= _TABLE_MAX:
            table.clear()
        terms = table[key] = _tokens_terms(p, fast, tokens, budget)
    # The host stage: eager above the capture size, the uniform-decode graph when every
    # request schedules the pool's width, else the other graph mode.
    if tokens > fast.capture:
        host = fast.eager
    elif lo == hi == fast.width:
        host = fast.hosts[1]
    else:
        host = fast.hosts[2]
    return estimate(p, fast, terms, kv_tokens, n_dec, host, per, raw)


def estimate(p: _Prepared, fast: FastPath, terms: tuple[Any, ...], kv_tokens: int,
             n_dec: int, host: tuple[int, float, int], per: dict[Resource, int] | None,
             raw: bool = False) -> Any:
    """The per-call part of a step on a fast-path pool, given its table entry (``terms``: a
    decode step's from :func:`_tokens_terms`, a step with prefill's from
    :func:`kernel.model.step_mixed.resolved`), the decode requests' Σ (computed + scheduled) and
    count, and the host stage (ns, seconds, ns as a resource total): per layer the decode
    attention reads, the HBM share and the stage, in the shared path's order, then the
    summary (``raw``: the totals, as :func:`decode_totals` returns them).

    The stage is Go's running max over (SM share, HBM share, NVLink, NIC) with ">": the entry
    holds the first greatest of the three that do not depend on the call (``m3``), and the
    call's HBM share meets it. Equal values are equal floats (a zero's sign aside, which
    st + routed ≥ +0.0 and a sum from +0.0 erase), and a NaN never wins either way."""
    layers, tot_sm, tot_nv, tot_nic, head_stage, fixed = terms
    n_kv = float(kv_tokens)
    overlap: Any = 0.0
    hbm: Any = 0.0
    for cnt, mode, fl, kv, rate, preq, sub_fl, secs, base, rh, m3, routed, weight, ew in layers:
        if mode == 1:  # a measured decode rate
            attn: Any = fl + n_kv * kv / rate
            if preq > 0:  # decision AC4: per-request work
                attn = attn + n_dec * preq
            if sub_fl:  # a mixed step on a one-kernel backend: one launch (model.md §3.4)
                attn = attn - fl
            if secs:
                attn = secondary_attention(attn, secs, n_kv, n_dec)
            h = base + attn + rh
        elif mode == 2:  # no rate: the KV bytes read at HBM speed
            attn = 0.0
            if sub_fl:
                attn = attn - fl
            if secs:
                attn = secondary_attention(attn, secs, n_kv, n_dec)
            h = ((weight + n_kv * kv) + ew) / p.hbm + attn + rh
        else:  # no decode read (no attention, or no decode request): neither of the above
            h = base + 0.0 + rh
        d = h - rh
        overlap = overlap + cnt * ((d if d > m3 else m3) + routed)
        hbm = hbm + cnt * h
    hbm = hbm + fast.head_hbm
    overlap = overlap + head_stage
    host_ns, host_s, d_host = host
    if raw or not hbm > 0:  # (no weights read, or NaN: the general summary)
        t = (tot_sm, hbm, tot_nv, tot_nic, host_s, host_ns, overlap)
        return t if raw else summarize(t, per)
    sm_best, nn_best, nn_neck, no_fixed, tmpl = fixed
    ns = hbm * 1e9
    d_hbm = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
    no = no_fixed + d_hbm + d_host
    if no > MAX_DURATION_NS:
        no = MAX_DURATION_NS
    best = sm_best
    neck = _SM
    if hbm > best:
        best, neck = hbm, _HBM
    if nn_best > best:
        best, neck = nn_best, nn_neck
    if host_s > best:
        neck = _HOST
    if per is not None:
        if per:
            per.clear()
        per.update(tmpl)  # SM, HBM (a placeholder kept in its place), NVLink, NIC
        per[_HBM] = d_hbm
        if host_s > 0:
            per[_HOST] = d_host
    return _estimate(host_ns, overlap, no, neck, per)


def _duration(seconds: float) -> int:
    """A positive total in ns as summarize converts it (truncated, saturated)."""
    ns = seconds * 1e9
    return int(ns) if ns < _TWO_63 else MAX_DURATION_NS


def _fixed_summary(sm: float, nv: float, nic: float) -> tuple[Any, ...]:
    """The part of :func:`summarize` that the SM, NVLink and NIC totals decide, for a step
    whose HBM total is > 0: (SM's bid for the bottleneck, the NVLink/NIC winner's total and
    resource — NVLink on a tie, as the running max keeps the earlier —, their ns summed, the
    per-resource map in order with HBM's place held). A total not > 0 bids nothing; a NaN
    one is listed at 0 ns, as summarize lists it."""
    tmpl: dict[Resource, int] = {}
    no = 0
    sm_best = 0.0
    if sm > 0:
        d = tmpl[_SM] = _duration(sm)
        no += d
        sm_best = sm
    elif sm != sm:
        tmpl[_SM] = 0
    tmpl[_HBM] = 0
    nn_best, nn_neck = 0.0, _NVLINK
    if nv > 0:
        d = tmpl[_NVLINK] = _duration(nv)
        no += d
        nn_best = nv
    elif nv != nv:
        tmpl[_NVLINK] = 0
    if nic > 0:
        d = tmpl[_NIC] = _duration(nic)
        no += d
        if nic > nn_best:
            nn_best, nn_neck = nic, _NIC
    elif nic != nic:
        tmpl[_NIC] = 0
    return sm_best, nn_best, nn_neck, no, tmpl


def summarize(t: tuple[Any, ...], per: dict[Resource, int] | None) -> StepEstimate:
    """kernel.model.step.finish of :func:`totals` (a non-empty step), unrolled over the resources.

    A total that is not > 0 is skipped unless it is NaN, which finish prices at 0 ns.
    """
    sm, hbm, nv, nic, host_s, host_ns, overlap_s = t
    if per is not None:
        per.clear()
    no = 0
    best = 0.0
    neck = _SM
    if sm > 0:
        ns = sm * 1e9
        d = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
        no = d
        best = sm
        if per is not None:
            per[_SM] = d
    elif sm != sm and per is not None:
        per[_SM] = 0
    if hbm > 0:
        ns = hbm * 1e9
        d = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
        no = no + d
        if hbm > best:
            best, neck = hbm, _HBM
        if per is not None:
            per[_HBM] = d
    elif hbm != hbm and per is not None:
        per[_HBM] = 0
    if nv > 0:
        ns = nv * 1e9
        d = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
        no = no + d
        if nv > best:
            best, neck = nv, _NVLINK
        if per is not None:
            per[_NVLINK] = d
    elif nv != nv and per is not None:
        per[_NVLINK] = 0
    if nic > 0:
        ns = nic * 1e9
        d = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
        no = no + d
        if nic > best:
            best, neck = nic, _NIC
        if per is not None:
            per[_NIC] = d
    elif nic != nic and per is not None:
        per[_NIC] = 0
    if host_s > 0:
        ns = host_s * 1e9
        d = int(ns) if ns < _TWO_63 else MAX_DURATION_NS
        no = no + d
        if host_s > best:
            neck = _HOST
        if per is not None:
            per[_HOST] = d
    if no > MAX_DURATION_NS:
        no = MAX_DURATION_NS
    return _estimate(host_ns, overlap_s, no, neck, per)


def _estimate(host_ns: int, overlap_s: Any, no: int, neck: Resource,
              per: dict[Resource, int] | None) -> StepEstimate:
    """The estimate from its NoOverlap total: Overlap is the host stage plus the overlapped
    seconds in ns (truncated, saturated), never above NoOverlap, as finish computes it."""
    ov = host_ns
    if overlap_s > 0:
        ns = overlap_s * 1e9
        ov = ov + (int(ns) if ns < _TWO_63 else MAX_DURATION_NS)
    if ov > MAX_DURATION_NS:
        ov = MAX_DURATION_NS
    if ov > no:
        ov = no
    est = _new(StepEstimate)  # a frozen dataclass, filled without its __init__'s setattrs
    fields = est.__dict__
    fields["overlap"] = ov
    fields["no_overlap"] = no
    fields["bottleneck"] = neck
    fields["per_resource"] = per
    fields["calibrated"] = None  # a calibrated kernel takes its own path (Kernel.step_time_into)
    return est
