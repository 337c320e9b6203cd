"""StepTime: one forward pass over a batch (model.md §1).

Three stages, so that the bulk path (millions of batches as numpy columns) reuses exactly
this arithmetic:

1. :func:`summarise` — the one walk over the requests (model.md §1.2) into a :class:`BatchSummary`
   of per-batch aggregates, including the per-request *nonlinear* sums the layers need
   (DCP/sparse decode reads per signature, windowed causal work per window, the MLA
   context-gather runs).
2. :func:`compose` — everything after the walk (model.md §1.3–§1.7): per-layer terms in the spec's
   operation order, head, host, empty step, SM derate, stage max, per-resource totals.
   Every data-dependent branch is a selection (:func:`_sel`), so ``compose`` runs unchanged
   on a summary whose numeric fields are numpy arrays of K batches and gives, element by
   element, the bits of K scalar calls. Branches on coefficients and the plan stay ``if``.
3. :func:`finish` — model.md §1.4 ``summarize``: integer ns per resource, NoOverlap, bottleneck,
   Overlap.

Everything that is a pure function of the :class:`ResolvedPool` is prepared once per pool
object (:func:`prepared`) without re-associating any floating-point expression.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Collection, Iterable, Sequence
from itertools import compress
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from . import laws, step_fast, step_mixed
from .resolved import (
    ALL2ALL,
    ALL_GATHER,
    ALL_REDUCE,
    FULL,
    GROUP_DCP,
    GROUP_PCP,
    GROUP_TP,
    PIECEWISE,
    REDUCE_SCATTER,
    CollectiveKey,
    ResolvedPool,
)
from .types import MAX_DURATION_NS, RESOURCES, Batch, Resource, StepEstimate

_FIRST = itemgetter(0)
_SECOND = itemgetter(1)
_tuple_new = tuple.__new__
ACTIVATION_BYTES = 2.0  # activations cross collectives at 16 bits (model.md §5.6 ActivationBytes)
_INF = math.inf

__all__ = [
    "BatchSummary",
    "StepTotals",
    "compose",
    "dcp_charge_bytes",
    "finish",
    "prepared",
    "stack_summaries",
    "step_time_into",
    "summarise",
]


# --- polymorphic selections (cheap for Python scalars, element-wise for arrays) ------------


def _gtmax(a: Any, b: Any) -> Any:
    """Go's running max with ``>``: keep ``a`` unless ``b > a`` (model.md §1.3 stage)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(b > a, b, a)
    return b if b > a else a


# --- the summary of one walk ---------------------------------------------------------------


class BatchSummary(NamedTuple):
    """Per-batch aggregates of the request walk (model.md §1.2). Fields may be numpy arrays."""

    n_requests: Any  # len(requests)
    tokens_all: Any  # Σ scheduled over every request (b.Tokens())
    withheld: Any  # prefill tokens other PCP ranks hold
    prefill_requests: Any
    decode_requests: Any
    decode_tokens: Any  # Σ scheduled over decodes (DCP combine rows)
    decode_kv_tokens: Any  # Σ (computed + scheduled) over decodes
    prefill_tokens: Any  # Σ rank-local prefill tokens
    causal_flops: Any  # Σ causal pairs (float)
    any_context: Any  # some request has computed > 0
    uniform_decode: Any  # non-empty and every scheduled == uniform decode width
    sm_budget: Any
    decode_reads: tuple[Any, ...]  # per prepared decode-read signature: Σ dcpDecodeTokens
    windowed: tuple[Any, ...]  # per prepared window: windowedCausalFLOPs (x4 applied)
    context_runs: Any  # DCP context-gather run sums (tuple of ints; 2-D int array [K, runs])


class StepTotals(NamedTuple):
    """What :func:`compose` hands to :func:`finish` (seconds, except ``host_ns``)."""

    sm_s: Any
    hbm_s: Any
    nvlink_s: Any
    nic_s: Any
    host_s: Any  # host_ns read back as seconds (Duration.Seconds())
    host_ns: Any
    overlap_s: Any
    empty: Any  # b.Tokens() == 0


# --- what is prepared once per pool -------------------------------------------------------


class _Coll:
    """One (op, group) collective as priced by collectiveSeconds (model.md §5.6), or unpriced
    (+Inf)."""

    __slots__ = ("crosses", "floor_s", "knots", "knot_s", "peak", "priced", "span", "trans")

    def __init__(self, key: CollectiveKey | None):
        self.priced = key is not None and key.peak_bps > 0
        self.crosses = bool(key.crosses_nodes) if key is not None else False
        self.span = key.span if key is not None else 1.0
        self.trans = key.transition_bps if key is not None else 0.0
        self.peak = key.peak_bps if key is not None else 0.0
        self.floor_s = laws.duration_seconds(key.floor_ns) if key is not None else 0.0
        # vLLM's all-reduce from measured knots (decision AC1), else the NCCL law
        measured = key is not None and len(key.knot_bytes) > 1
        self.knots = key.knot_bytes if key is not None and measured else ()
        self.knot_s = tuple(laws.duration_seconds(ns) for ns in key.knot_ns) \
            if key is not None and measured else ()

    def seconds(self, nbytes: Any) -> Any:
        """collectiveSeconds(key, bytes·span if it crosses nodes else bytes)."""
        if self.crosses:
            nbytes = nbytes * self.span
        if not self.priced:
            return _INF if not isinstance(nbytes, np.ndarray) else np.full(nbytes.shape, _INF)
        if self.knots:
            return laws.knot_time(nbytes, self.knots, self.knot_s)
        return laws.collective_time(nbytes, self.trans, self.peak, self.floor_s)


class _Secondary:
    __slots__ = ("compress", "floor_s", "per_tok", "rate", "shards", "window")

    def __init__(self, floor_s: float, per_tok: float, rate: float, window: int,
                 compress: int, shards: bool):
        self.floor_s, self.per_tok, self.rate = floor_s, per_tok, rate
        self.window, self.compress, self.shards = window, compress, shards


class _Layer:
    """Everything about one planned layer kind that does not depend on the batch."""

    count: float
    kind: str
    gemms: list[tuple[float, float | None, float | None]]
    dense_flops: float
    weight_bytes: float
    expert: bool
    funnel: float
    top_k: int
    share: float
    expert_flops: float
    dp_slice: float
    ets_weight: float
    total_experts: int
    experts_per_rank: int
    moe_rate: float
    moe_floor_s: float
    moe_eff: float
    shared_flops: float
    attn: bool
    q_heads: int
    head_dim: int
    latent: bool
    kv: float
    decode_sig: int
    window_idx: int
    attn_floor_s: float
    attn_rate: float
    attn_per_req_s: float
    one_kernel: bool
    attn_floor_lt_prefill: bool
    secondaries: list[_Secondary]
    dcp_decode: bool
    dcp_qW: float
    dcp_oW: float
    dcp_charges: list[tuple[str, _Coll, float]]
    ctx_gather: bool
    ctx_gather_width: float
    ctx_gather_coll: _Coll
    pcp_gather: bool
    pcp_widths: list[int]
    pcp_gather_coll: _Coll
    elementwise: float
    rec: bool
    rec_floor_s: float
    rec_rate: float
    coll_list: list[tuple[float, int, _Coll]]

    def graph_collective_seconds(self, T: Any) -> tuple[Any, Any]:
        """Seconds of the layer's graph collectives for ``T`` tokens: (on node, crossing),
        summed in graph order (scalar or array)."""
        on_node: Any = 0.0
        cross: Any = 0.0
        for bpt, mult, kc in self.coll_list:
            nbytes = T * bpt
            if mult:
                nbytes = nbytes * mult
            if kc.crosses:
                cross = cross + kc.seconds(nbytes)
            else:
                on_node = on_node + kc.seconds(nbytes)
        return on_node, cross


class _Prepared:
    capture: int
    ctx_runs: bool
    dcp: int
    decode_sigs: tuple[tuple[int, int, bool], ...]
    degenerate: bool
    eager_ns: int
    eps_max: float
    fast: step_fast.FastPath | None
    full_ns: int
    head_dw_hbm: float
    head_flops: float
    hbm: float
    host_decode_ns: int
    host_other_ns: int
    imbalance: float
    interleave: int
    launch_ns: int
    layers: list[_Layer]
    m_half: float
    mla_chunk: int
    pcp: int
    peak: float
    prefill_floor_s: float
    prefill_scale: float
    shape_aware: bool
    sm_count: int
    tp: float
    uniform_width: int
    windows: tuple[int, ...]


_PREP: dict[int, tuple[weakref.ref[ResolvedPool], _Prepared]] = {}
_estimate = step_fast.estimate
_CHUNKS_MAX = 8192  # steps with prefill kept per pool (mixed_estimate)
_PREP_LOCK = threading.Lock()


def prepared(r: ResolvedPool) -> _Prepared:
    """The pool's prepared constants, built on first use and cached per pool object."""
    entry = _PREP.get(id(r))
    if entry is not None and entry[0]() is r:
        return entry[1]
    prep = _prepare(r)
    key = id(r)

    def forget(_ref: object, key: int = key) -> None:
        _PREP.pop(key, None)

    with _PREP_LOCK:
        _PREP[key] = (weakref.ref(r, forget), prep)
    return prep


def _host_mode_ns(r: ResolvedPool, mode: str) -> int:
    """hostPerStep for one graph mode (model.md §1.7), without the per-kernel launch term."""
    c = r.coefficients
    if mode == FULL:
        return c.host_replay_graph_per_step_ns
    if mode == PIECEWISE:
        return int(float(c.host_replay_graph_per_step_ns) * r.plan.piecewise_segments)
    return int(float(c.host_launch_eager_per_layer_ns) * r.plan.total_layers)


def _kind_floor_rate(r: ResolvedPool, kind: str) -> tuple[int, float]:
    c = r.coefficients
    if kind in c.attention_by_kind:
        return c.attention_by_kind[kind]
    return c.attention_floor_ns, c.attention_rate_bps


def _prepare(r: ResolvedPool) -> _Prepared:
    lay, c, plan = r.layout, r.coefficients, r.plan
    p = _Prepared()
    tp = float(max(lay.tp, 1))
    p.tp = tp
    p.peak, p.hbm = c.peak_flops, c.hbm_bps
    p.eps_max, p.m_half = c.eps_max, c.m_half
    p.shape_aware = c.shape_aware
    p.degenerate = not (c.eps_max > 0 and c.peak_flops > 0)
    p.sm_count = r.chip_sm_count
    p.prefill_floor_s = laws.duration_seconds(c.attention_prefill_floor_ns)
    p.prefill_scale = c.attention_prefill_scale
    p.imbalance = c.moe_imbalance
    p.dcp, p.pcp = lay.dcp, lay.pcp
    p.interleave = r.dcp_interleave
    p.mla_chunk = r.mla_context_chunk
    p.uniform_width = r.uniform_decode_width
    p.capture = r.capture_tokens
    p.host_decode_ns = _host_mode_ns(r, r.decode_graph_mode)
    p.host_other_ns = _host_mode_ns(r, r.other_graph_mode)
    p.eager_ns = _host_mode_ns(r, "NONE")
    p.full_ns = c.host_replay_graph_per_step_ns
    p.launch_ns = laws.to_duration_ns(
        laws.duration_seconds(c.host_launch_per_kernel_ns) * plan.total_kernels)
    p.head_flops = plan.head.dense_flops_per_token
    p.head_dw_hbm = plan.head.dense_weight_bytes / tp / c.hbm_bps

    colls: dict[tuple[str, str], _Coll] = {}

    def coll(op: str, group: str) -> _Coll:
        if (op, group) not in colls:
            colls[(op, group)] = _Coll(r.collectives.get((op, group)))
        return colls[(op, group)]

    per_layer_kv = r.kv_bytes_per_token / r.kv_layers if r.kv_layers > 0 else 0.0
    dcp_on = lay.dcp > 1
    sigs: list[tuple[int, int, bool]] = []
    windows: list[int] = []
    ctx_runs = False
    layers = []
    for pl in plan.layers:
        L = _Layer()
        L.count = float(pl.count)
        L.kind = pl.attn_kind
        # Dense GEMMs (shape-aware: the n and k factors of ShapeEfficiency are constants).
        L.gemms = []
        if c.shape_aware and c.eps_max > 0:
            for g in pl.dense_gemms:
                n, k = float(g.n), float(g.k)
                if g.shard_n:
                    n /= tp
                else:
                    k /= tp
                kfac = k / (k + c.k_half) if c.k_half > 0 and k > 0 else None
                nfac = n / (n + c.n_half) if c.n_half > 0 and n > 0 else None
                L.gemms.append((g.flops_per_token, kfac, nfac))
        L.dense_flops = pl.dense_flops_per_token
        weight = 0.0 + pl.dense_weight_bytes / tp
        # Routed experts.
        L.expert = pl.expert_flops_per_token_per_expert > 0
        if L.expert:
            # Known coverage limit (model.md §11 item 5): the funnel multiplies by dp, not by pcp.
            L.funnel = float(lay.dp) if (lay.moe_group > 1 and lay.dp > 1) else 1.0
            L.top_k = pl.top_k
            L.share = r.local_expert_share
            L.expert_flops = pl.expert_flops_per_token_per_expert
            # dpSlice = DP with EP off; 1 with EP on. NB routed FLOPs are NOT divided by tp:
            # the spec's documented, measured over-charge (model.md §4.2, §11 item 1) is kept.
            L.dp_slice = r.expert_tensor_shards / tp if lay.expert_width <= 1 else 1.0
            if c.moe_expert_tp_split > 0 and lay.expert_width <= 1:
                # decision MO1: each rank computes its tp slice of every expert (vLLM's FusedMoE
                # shards the intermediate size by tp), so FLOPs divide by all the expert shards
                L.dp_slice = float(r.expert_tensor_shards)
            L.ets_weight = pl.expert_weight_bytes_per_expert / r.expert_tensor_shards
            L.total_experts = r.total_experts
            L.experts_per_rank = r.experts_per_rank
            # decision MF1: vLLM's fused MoE priced by its own fitted law (rate 0: the reference's
            # dense ramp and derated HBM rate); fitted on rows without expert parallelism
            fused = c.moe_fused_rate_bps > 0 and lay.expert_width <= 1
            L.moe_rate = c.moe_fused_rate_bps if fused else 0.0
            L.moe_floor_s = laws.duration_seconds(c.moe_fused_floor_ns) if fused else 0.0
            L.moe_eff = c.moe_fused_efficiency if fused else 0.0
            L.shared_flops = pl.shared_expert_flops_per_token
            weight = weight + pl.shared_expert_weight_bytes / tp
        L.weight_bytes = weight
        # Attention.
        L.attn = pl.attn_q_heads > 0
        L.q_heads, L.head_dim = pl.attn_q_heads, pl.attn_head_dim
        L.latent = laws.is_latent(pl.attn_kind)
        L.kv = per_layer_kv
        L.decode_sig = -1
        L.window_idx = -1
        L.secondaries = []
        L.dcp_decode = False
        L.ctx_gather = False
        L.pcp_gather = False
        if L.attn:
            floor_ns, rate = _kind_floor_rate(r, pl.attn_kind)
            L.attn_floor_s = laws.duration_seconds(floor_ns)
            L.attn_rate = rate
            # decision AC4: per-request work, for the layers the part-wide pair prices
            L.attn_per_req_s = laws.duration_seconds(c.attention_per_request_ns) \
                if pl.attn_kind not in c.attention_by_kind else 0.0
            topk = laws.sparse_top_k(pl.attn_kind, pl.attn_index_top_k, pl.attn_window)
            shards = dcp_on and laws.dcp_shards_kv(pl.attn_kind)
            if topk > 0 or shards:
                sig = (topk, pl.attn_compress_ratio if topk > 0 else 0, shards)
                if sig not in sigs:
                    sigs.append(sig)
                L.decode_sig = sigs.index(sig)
            if pl.attn_window > 0:
                if pl.attn_window not in windows:
                    windows.append(pl.attn_window)
                L.window_idx = windows.index(pl.attn_window)
            # One launch on a one-kernel backend (FlashAttention varlen, model.md §3.4): the static
            # half of the rule. Otherwise BOTH the prefill and the decode floors are charged
            # on a mixed batch — the spec's known divergence, kept.
            L.one_kernel = (not L.latent and lay.dcp <= 1 and r.chip_nvfp4_tflops <= 0
                            and rate > 0 and c.attention_prefill_scale > 0)
            L.attn_floor_lt_prefill = floor_ns < c.attention_prefill_floor_ns
            for a in pl.attentions:
                if a.holds_kv:
                    continue
                f2, r2 = _kind_floor_rate(r, a.kind)
                if r2 <= 0:
                    continue
                primary = pl.attn_kv_heads * pl.attn_head_dim
                if primary <= 0:
                    continue
                per_tok = per_layer_kv * (a.kv_heads * a.head_dim / primary)
                L.secondaries.append(_Secondary(
                    laws.duration_seconds(f2), per_tok, r2, a.window, a.compress_ratio,
                    dcp_on and laws.dcp_shards_kv(a.kind)))
            # DCP decode collectives (model.md §3.7 dcpDecodeCollectives).
            if dcp_on and laws.dcp_shards_kv(pl.attn_kind):
                # Coverage limits kept (model.md §11): full-attention DCP does not gather the
                # query of context-prefill rows, and the query is charged at 2 bytes even
                # where a backend takes a quantized query.
                L.dcp_decode = True
                heads = pl.attn_q_heads
                L.dcp_qW = float(pl.attn_head_dim)
                L.dcp_oW = float(pl.attn_kv_lora_rank) if (
                    L.latent and pl.attn_kv_lora_rank > 0) else L.dcp_qW
                charges: list[tuple[str, _Coll, float]] = []
                if lay.pcp > 1:
                    attn_heads = heads / tp
                    if lay.dcp > lay.pcp:
                        attn_heads = float(heads)
                        charges.append(("q", coll(ALL_GATHER, GROUP_TP), attn_heads))
                else:
                    attn_heads = heads / tp * lay.dcp
                    charges.append(("q", coll(ALL_GATHER, GROUP_DCP), attn_heads))
                if r.dcp_comm_backend == "a2a":
                    charges.append(("a2a", coll(ALL2ALL, GROUP_DCP), attn_heads))
                else:
                    charges.append(("lse", coll(ALL_GATHER, GROUP_DCP), attn_heads))
                    combine = REDUCE_SCATTER if lay.pcp <= 1 else ALL_REDUCE
                    charges.append(("o", coll(combine, GROUP_DCP), attn_heads))
                L.dcp_charges = charges
                if L.latent:
                    L.ctx_gather = True
                    ctx_runs = True
                    L.ctx_gather_width = pl.attn_head_dim * ACTIVATION_BYTES
            if lay.pcp > 1:
                L.pcp_gather = True
                lora, hd = pl.attn_kv_lora_rank, pl.attn_head_dim
                widths = [lora, hd - lora] if 0 < lora < hd else [hd]
                for a in pl.attentions:
                    if not a.holds_kv and a.kv_heads > 0 and a.head_dim > 0:
                        widths.append(a.kv_heads * a.head_dim)
                L.pcp_widths = widths
        L.elementwise = pl.elementwise_bytes_per_token
        L.rec = pl.recurrent_kind != "" and pl.recurrent_kind in c.recurrent
        if L.rec:
            rf, rr = c.recurrent[pl.recurrent_kind]
            L.rec_floor_s, L.rec_rate = laws.duration_seconds(rf), rr
        L.coll_list = []
        for col in pl.collectives:
            # Known divergence (model.md §11 item 3): dispatch is priced at 16-bit activations even
            # when the experts take quantized input (bytes_per_token = hidden·2 from the plan).
            mult = pl.top_k if (col.routed_by_top_k and pl.top_k > 0 and lay.routed_all2all) \
                else 0
            L.coll_list.append((col.bytes_per_token, mult, coll(col.op, col.group)))
        if L.pcp_gather:
            L.pcp_gather_coll = coll(ALL_GATHER, GROUP_PCP)
        if L.ctx_gather:
            L.ctx_gather_coll = coll(ALL_GATHER, GROUP_DCP)
        layers.append(L)
    p.layers = layers
    p.decode_sigs = tuple(sigs)
    p.windows = tuple(windows)
    p.ctx_runs = ctx_runs
    p.fast = step_fast.build(p)
    return p



# --- 1. the walk ---------------------------------------------------------------------------


def summarise(r: ResolvedPool, batch: Batch) -> BatchSummary:
    """One walk over the requests, in order (model.md §1.2), into per-batch aggregates."""
    p = prepared(r)
    thr = batch.decode_threshold
    width = p.uniform_width
    reqs = batch.requests
    if reqs and not p.decode_sigs:
        # All-decode fast path: the same integer aggregates through builtins. Integer sums
        # are exact in any order, and with no decode-read signature there is no float sum.
        sched = list(map(_FIRST, reqs))
        comp = list(map(_SECOND, reqs))
        lo, hi = min(sched), max(sched)
        if hi <= thr and lo > 0:
            tok = sum(sched)
            return BatchSummary(
                len(reqs), tok, 0, 0, len(reqs), tok, sum(comp) + tok, 0, 0.0,
                max(comp) > 0, lo == hi == width, batch.sm_budget, (), (0.0,) * len(p.windows),
                ())
    return _walk(p, batch)


def _walk(p: _Prepared, batch: Batch) -> BatchSummary:
    """The general request walk (model.md §1.2), request by request."""
    thr = batch.decode_threshold
    width = p.uniform_width
    pcp, dcp, inter = p.pcp, p.dcp, p.interleave
    sigs = p.decode_sigs
    windows = p.windows
    reads = [0.0] * len(sigs)
    wpairs = [0.0] * len(windows)
    prefills: list[tuple[int, int]] | None = [] if p.ctx_runs else None
    tokens_all = withheld = 0
    pre_req = dec_req = dec_tok = dec_kv = pre_tok = 0
    causal = 0.0
    any_ctx = False
    uniform = True
    for q in batch.requests:
        s = q[0]
        c = q[1]
        tokens_all += s
        if s != width:
            uniform = False
        ctx = c + s
        if ctx <= 0:
            continue
        if c > 0:
            any_ctx = True
        if s > thr:
            pre_req += 1
            pairs, local_sched, chunks = prefill_request(s, c, pcp, dcp)
            causal += pairs
            pre_tok += local_sched
            withheld += s - local_sched
            for i, w in enumerate(windows):
                for cs, cp in chunks:
                    wpairs[i] += laws.windowed_pairs_for_chunk(cs, cp, w)
            if prefills is not None:
                prefills.append((s, c))
        else:
            dec_req += 1
            dec_tok += s
            dec_kv += ctx
            for i, (topk, ratio, shards) in enumerate(sigs):
                reads[i] += laws.dcp_decode_tokens_one(ctx, topk, ratio, dcp, inter, shards)
    runs: tuple[int, ...] = ()
    if prefills:
        runs = _context_runs(prefills)
    return BatchSummary(
        len(batch.requests), tokens_all, withheld, pre_req, dec_req, dec_tok, dec_kv,
        pre_tok, causal, any_ctx, uniform and bool(batch.requests), batch.sm_budget,
        tuple(reads), tuple(4 * x for x in wpairs), runs)


def prefill_request(s: int, c: int, pcp: int, dcp: int
                    ) -> tuple[float, int, Sequence[tuple[int, int]]]:
    """One prefill request of the walk (model.md §1.2, §3.8): its causal pairs, its rank-local
    scheduled tokens and the (tokens, prefix) chunks its busiest PCP rank holds."""
    pairs = laws.causal_pairs(s, c)
    local_sched = s
    chunks: Sequence[tuple[int, int]] = ((s, c),)
    if pcp > 1:
        local = laws.pcp_local_tokens(s, pcp, dcp)
        if local >= 0:
            local_sched = local
            pairs = laws.pcp_causal_pairs(s, c, pcp, dcp)
        chunks = laws.pcp_busiest_chunks(s, c, pcp, dcp)
    return pairs, local_sched, chunks


def walk_columns(p: _Prepared, sl: list[int], cl: list[int], seen: Collection[int], thr: int,
                 budget: int) -> BatchSummary:
    """The walk's :class:`BatchSummary` (equal to :func:`_walk`'s) from the scheduled and
    computed columns as int lists and the distinct scheduled counts, on a pool without
    decode-read signatures or context-gather runs (every pool with a fast path).

    Decode aggregates are integer sums (exact in any order); only the prefill requests, found
    with C-level scans (:func:`rows_above`), are walked one by one (:func:`walk_parts`)."""
    n = len(sl)
    rows = rows_above(sl, seen, thr) if n and max(seen) > thr else ()
    empty = 0
    if 0 in seen and thr >= 0:  # (0, 0) requests have no context: the walk skips them
        empty = sum(1 for s, c in zip(sl, cl, strict=True) if s == 0 and c == 0)
    return walk_parts(p, n, sum(sl), sum(cl), [(sl[i], cl[i]) for i in rows], empty, seen,
                      budget)


def walk_parts(p: _Prepared, n: int, tokens_all: int, sum_c: int,
               prefills: list[tuple[int, int]], empty: int, seen: Collection[int],
               budget: int) -> BatchSummary:
    """:func:`walk_columns` from its parts: the request count, Σ scheduled, Σ computed, the
    (scheduled, computed) of every request above the decode threshold in batch order, the
    count of decode-side (0, 0) requests and the distinct scheduled counts. The prefills are
    walked in order, so each float sum adds the walk's terms in the walk's order."""
    pre_req, pre_tok, withheld, pre_s, pre_c, causal, windowed = prefill_aggregates(p, prefills)
    width = p.uniform_width
    return _tuple_new(BatchSummary, (  # BatchSummary(...) without its Python-level __new__
        n, tokens_all, withheld, pre_req, n - len(prefills) - empty, tokens_all - pre_s,
        sum_c + tokens_all - pre_s - pre_c, pre_tok, causal, sum_c > 0,
        n > 0 and len(seen) == 1 and width in seen, budget, (), windowed, ()))


def prefill_aggregates(p: _Prepared, prefills: Iterable[tuple[int, int]]
                       ) -> tuple[int, int, int, int, int, float, tuple[float, ...]]:
    """The walk over a step's prefill requests, (scheduled, computed) in batch order, on a pool
    without context-gather runs: (prefill requests, rank-local prefill tokens, withheld
    tokens, Σ scheduled, Σ computed, causal pairs, windowed pairs per window with the x4)."""
    windows = p.windows
    wpairs = [0.0] * len(windows)
    pre_req = pre_tok = withheld = pre_s = pre_c = 0
    causal = 0.0
    pcp, dcp = p.pcp, p.dcp
    for s, c in prefills:
        pre_s += s
        pre_c += c
        if s + c <= 0:
            continue  # no context: the walk skips it
        pre_req += 1
        if pcp > 1 or windows:
            pairs, local_sched, chunks = prefill_request(s, c, pcp, dcp)
        else:  # prefill_request without PCP: the whole chunk on every rank
            pairs, local_sched, chunks = laws.causal_pairs(s, c), s, ()
        causal += pairs
        pre_tok += local_sched
        withheld += s - local_sched
        for j, w in enumerate(windows):
            for cs, cp in chunks:
                wpairs[j] += laws.windowed_pairs_for_chunk(cs, cp, w)
    return (pre_req, pre_tok, withheld, pre_s, pre_c, causal,
            tuple([4 * x for x in wpairs]) if wpairs else ())


def mixed_estimate(p: _Prepared, fast: step_fast.FastPath, n: int, tokens_all: int,
                   sum_c: int, prefills: list[tuple[int, int]], empty: int, uniform: bool,
                   budget: int, per: dict[Resource, int] | None) -> StepEstimate | None:
    """StepTime of a step with prefill on a pool with a fast path, from :func:`walk_parts`'
    parts (``uniform``: every request schedules the pool's uniform decode width), or None for
    a step that schedules no token (the shared path prices it: host only).

    Everything but the decode attention reads depends on the prefill rows' (scheduled,
    computed) in order, Σ scheduled, the SM budget and whether any request decodes: that
    entry (the prefill walk, :func:`prefill_aggregates`, settled by
    :func:`kernel.model.step_mixed.resolved`) is kept per pool under those keys in a bounded table
    (decision LS1), so a chunk shape seen before costs what a decode step costs
    (:func:`kernel.model.step_fast.estimate`)."""
    if not tokens_all:
        return None
    n_dec = n - len(prefills) - empty
    key = (tokens_all, budget, n_dec > 0, *prefills)
    chunks = fast.chunks
    hit = chunks.get(key)
    if hit is None:
        if len(chunks) >= _CHUNKS_MAX:
            chunks.clear()
        pre_req, pre_tok, withheld, pre_s, pre_c, causal, windowed = prefill_aggregates(
            p, prefills)
        hit = chunks[key] = (step_mixed.resolved(
            p, fast, tokens_all - withheld, budget, pre_req, pre_tok, causal, windowed,
            n_dec > 0), pre_s + pre_c)
    terms, pre_kv = hit
    if tokens_all > fast.capture:  # the host stage, as step_mixed.host chooses it
        host = fast.eager
    elif uniform:
        host = fast.hosts[1]
    else:
        host = fast.hosts[2]
    return _estimate(p, fast, terms, sum_c + tokens_all - pre_kv, n_dec, host, per)


def prefill_rows(sl: list[int], seen: Collection[int], lo: int, hi: int, thr: int
                 ) -> Sequence[int]:
    """:func:`rows_above` given the least and greatest scheduled counts: none when ``hi <=
    thr``; for one prefill count among decode counts (a chunked-prefill step), found with
    C-level scans that count the decode count (a small int: an identity test per request)
    and locate the prefill one."""
    if hi <= thr:
        return ()
    if lo <= thr and len(seen) == 2:
        k = seen[hi] if isinstance(seen, dict) else len(sl) - sl.count(lo)
        i = sl.index(hi)
        rows = [i]
        for _ in range(k - 1):
            i = sl.index(hi, i + 1)
            rows.append(i)
        return rows
    return rows_above(sl, seen, thr)


def rows_above(sl: list[int], seen: Collection[int], thr: int) -> list[int]:
    """Positions, in order, of the requests scheduling more than ``thr`` tokens: C-level scans
    per distinct prefill count (a step's prefill chunks are few), else one pass. ``seen`` is
    the set of distinct scheduled counts, or a dict of how many requests schedule each."""
    over = [v for v in seen if v > thr]
    if len(over) > 4:
        return list(compress(range(len(sl)), map(thr.__lt__, sl)))
    rows = []
    for v in over:
        i = -1
        for _ in range(seen[v] if isinstance(seen, dict) else sl.count(v)):  # dict: counts
            i = sl.index(v, i + 1)
            rows.append(i)
    if len(over) > 1:
        rows.sort()
    return rows


def _context_runs(prefills: list[tuple[int, int]]) -> tuple[int, ...]:
    """dcpPrefillContextGathers' runs (model.md §3.7): stable sort by scheduled, split at computed
    <= 0.

    Only positive sums are kept: gatherRun(0) charges nothing.
    """
    out: list[int] = []
    run = 0
    for _s, c in sorted(prefills, key=lambda x: x[0]):
        if c <= 0:
            if run > 0:
                out.append(run)
            run = 0
        else:
            run += c
    if run > 0:
        out.append(run)
    return tuple(out)


def stack_summaries(summaries: Sequence[BatchSummary]) -> BatchSummary:
    """K scalar summaries as one summary of numpy columns (context runs zero-padded 2-D)."""
    def col(vals: list[Any]) -> Any:
        return np.asarray(vals)

    fields: list[Any] = []
    for name in BatchSummary._fields:
        vals = [getattr(s, name) for s in summaries]
        if name in ("decode_reads", "windowed"):
            n = len(vals[0])
            fields.append(tuple(np.asarray([v[i] for v in vals], dtype=np.float64)
                                for i in range(n)))
        elif name == "context_runs":
            width = max((len(v) for v in vals), default=0)
            arr = np.zeros((len(vals), width), dtype=np.int64)
            for i, v in enumerate(vals):
                arr[i, :len(v)] = v
            fields.append(arr)
        elif name == "causal_flops":
            fields.append(np.asarray(vals, dtype=np.float64))
        elif name in ("any_context", "uniform_decode"):
            fields.append(np.asarray(vals, dtype=bool))
        else:
            fields.append(col(vals).astype(np.int64))
    return BatchSummary(*fields)


# --- 2. everything after the walk ----------------------------------------------------------


def secondary_read_tokens(a: Any, n_dec_kv: Any, decode_requests: Any, dcp: int,
                          inter: int) -> Any:
    """Tokens a secondary attention read (indexer, window, compressed stream) covers per rank:
    capped by its window, divided by its compression, sharded by DCP (scalar or array)."""
    n: Any = n_dec_kv
    if a.window > 0:
        n = laws.go_min(n, laws.as_f64(a.window * decode_requests))
    if a.compress > 1:
        n = n / a.compress
    if a.shards:
        n = laws.as_f64(laws.dcp_local_tokens_one(laws.round_half(n), dcp, inter))
    return n


def compose(r: ResolvedPool, s: BatchSummary) -> StepTotals:
    """Per-layer terms, head, host and totals (model.md §1.3–§1.7) from a (scalar or array)
    summary."""
    p = prepared(r)
    if isinstance(s.tokens_all, np.ndarray):
        with np.errstate(all="ignore"):
            return _compose(p, s)
    if p.degenerate:  # a zero ramp: let division give Go's Inf/NaN instead of raising
        with np.errstate(all="ignore"):
            return _compose(p, s)
    return _compose(p, s)


def _compose(p: _Prepared, s: BatchSummary,
             trace: list[dict[str, Any]] | None = None) -> StepTotals:
    tp = p.tp
    peak = p.peak
    hbm_bps = p.hbm
    tokens_all = s.tokens_all
    empty = tokens_all == 0
    tokens = tokens_all - s.withheld
    # An empty step is priced from host alone (model.md §1.5); price its layers at 1 token, then
    # select, so that arrays need no division by zero.
    T = laws.select(empty, 1.0, laws.as_f64(tokens))
    dec = s.decode_requests > 0
    pre = s.prefill_requests > 0
    mixed = dec & pre
    n_dec_kv = laws.as_f64(s.decode_kv_tokens)
    # SM derate (model.md §2.5).
    sm_count = p.sm_count
    if sm_count > 0:
        budget = s.sm_budget
        partial = (budget > 0) & (budget < sm_count)
        derate = laws.select(partial, sm_count / laws.select(partial, budget, 1), 1.0)
    else:
        derate = 1.0
    # Every ramp, the grouped GEMM's included, is evaluated at the step's rank-local token
    # count (a recorded design finding, model.md §2.1).
    ramp = laws.efficiency(T, p.eps_max, p.m_half)
    if p.degenerate and not isinstance(ramp, np.ndarray):
        ramp = np.float64(ramp)
    pr = peak * ramp
    if p.shape_aware and p.m_half > 0:
        mfac = T / (T + p.m_half)
    else:
        mfac = None
    if p.prefill_scale > 0:
        ps = peak * (ramp * p.prefill_scale)
    else:
        ps = None
    dcp, inter = p.dcp, p.interleave

    tot_sm = tot_hbm = tot_nv = tot_nic = overlap = 0.0
    for L in p.layers:
        # Dense GEMMs, routed and shared experts, elementwise bytes, recurrent time: the terms
        # of the token count alone, defined once for this path and the fast paths. Routed
        # FLOPs are divided by L.dp_slice only (not by tp: the reference's documented
        # over-charge, model.md §4.2), unless the measured layer splits experts over tp (MO1).
        flops, dense_shaped, routed_flops, routed_wb, elementwise, rec = (
            step_fast.layer_token_terms(p, L, T, mfac))
        # Attention.
        attn: Any = 0.0
        attn_sm: Any = 0.0
        kv_bytes: Any = 0.0
        if L.attn:
            rate = L.attn_rate
            n_read = n_dec_kv if L.decode_sig < 0 else s.decode_reads[L.decode_sig]
            if rate > 0:
                attn = laws.select(dec, L.attn_floor_s + n_read * L.kv / rate, 0.0)
                if L.attn_per_req_s > 0:
                    attn = laws.select(dec, attn + s.decode_requests * L.attn_per_req_s, attn)
            else:
                kv_bytes = laws.select(dec, n_read * L.kv, 0.0)  # no measured rate: HBM fallback
            layer_causal = s.causal_flops if L.window_idx < 0 else s.windowed[L.window_idx]
            if L.one_kernel:
                if L.attn_floor_lt_prefill:
                    attn = laws.select(mixed, attn - L.attn_floor_s, attn)
                else:
                    attn_sm = laws.select(mixed, attn_sm - p.prefill_floor_s, attn_sm)
            if ps is not None:
                attn_sm = laws.select(pre, attn_sm + (p.prefill_floor_s + layer_causal * L.q_heads
                                               * L.head_dim / tp / ps * derate), attn_sm)
            else:
                flops = laws.select(pre, flops + layer_causal * L.q_heads * L.head_dim / tp, flops)
            for a in L.secondaries:
                n = secondary_read_tokens(a, n_dec_kv, s.decode_requests, dcp, inter)
                attn = laws.select(dec, attn + (a.floor_s + n * a.per_tok / a.rate), attn)
        # Resource composition.
        dense_sm = flops / pr * derate + dense_shaped * derate + rec + attn_sm
        dense_hbm = (L.weight_bytes + kv_bytes + elementwise) / hbm_bps + attn
        routed_sm, routed_hbm = step_fast.routed_seconds(p, L, routed_flops, routed_wb, pr,
                                                         derate, hbm_bps)
        routed = routed_sm + routed_hbm
        sm = dense_sm + routed_sm
        hbm = dense_hbm + routed_hbm
        on_node, cross = L.graph_collective_seconds(T)
        # DCP decode collectives.
        if L.dcp_decode:
            rows = s.decode_tokens if L.latent else laws.select(s.any_context, tokens_all, 0)
            has_rows = rows > 0
            rf = laws.as_f64(rows)
            for what, kc, heads in L.dcp_charges:
                t = kc.seconds(dcp_charge_bytes(L, what, rf, heads, dcp))
                if kc.crosses:
                    cross = laws.select(has_rows, cross + t, cross)
                else:
                    on_node = laws.select(has_rows, on_node + t, on_node)
            if L.ctx_gather:
                on_node, cross = _context_gathers(p, L, s.context_runs, pre, on_node, cross)
        # PCP prefill gathers.
        if L.pcp_gather:
            has_pre = s.prefill_tokens > 0
            kc = L.pcp_gather_coll
            rows_f = laws.as_f64(p.pcp * s.prefill_tokens)
            for width in L.pcp_widths:
                t = kc.seconds(rows_f * width * 2)
                if kc.crosses:
                    cross = laws.select(has_pre, cross + t, cross)
                else:
                    on_node = laws.select(has_pre, on_node + t, on_node)
        stage = _gtmax(_gtmax(_gtmax(sm - routed_sm, hbm - routed_hbm), on_node), cross) + routed
        if trace is not None:
            terms = {"dense_sm": sm - routed_sm, "dense_hbm": hbm - routed_hbm,
                     "nvlink": on_node, "nic": cross}
            best = "dense_sm"
            for name, v in terms.items():
                if v > terms[best]:
                    best = name
            trace.append({**terms, "routed_sm": routed_sm, "routed_hbm": routed_hbm,
                          "stage": stage, "dominant": best})
        cnt = L.count
        overlap = overlap + cnt * stage
        tot_sm = tot_sm + cnt * sm
        tot_hbm = tot_hbm + cnt * hbm
        tot_nv = tot_nv + cnt * on_node
        tot_nic = tot_nic + cnt * cross
    # Head (model.md §1.6): priced over ALL step tokens, not only sampled ones (spec [code], kept).
    head_sm = T * p.head_flops / tp / pr * derate
    head_hbm = p.head_dw_hbm
    tot_sm = tot_sm + head_sm
    tot_hbm = tot_hbm + head_hbm
    overlap = overlap + laws.select(head_sm > head_hbm, head_sm, head_hbm)
    # Host (model.md §1.7): mode by batch shape, eager above the capture size.
    decode_mode = (s.n_requests == 0) | s.uniform_decode
    host_step = laws.select(tokens_all > p.capture, p.eager_ns,
                     laws.select(decode_mode, p.host_decode_ns, p.host_other_ns))
    host_ns = laws.select(empty, host_step, host_step + p.launch_ns)
    zero = 0.0
    return StepTotals(
        laws.select(empty, zero, tot_sm), laws.select(empty, zero, tot_hbm), laws.select(empty, zero, tot_nv),
        laws.select(empty, zero, tot_nic), laws.duration_seconds(host_ns), host_ns,
        laws.select(empty, zero, overlap), empty)


def dcp_charge_bytes(L: _Layer, what: str, rows: Any, heads: float, dcp: int) -> Any:
    """Bytes of one DCP decode collective (model.md §3.7): the query gather, the all-to-all of
    outputs and LSEs, the LSE gather, or the output combine, over ``rows`` decode rows."""
    if what == "q":
        return rows * heads * L.dcp_qW * 2
    if what == "a2a":
        return rows * heads * (L.dcp_oW + 2) * 2
    if what == "lse":
        return dcp * rows * heads * 4
    return rows * heads * L.dcp_oW * 2


def _context_gathers(p: _Prepared, L: _Layer, runs: Any, pre: Any, on_node: Any,
                     cross: Any) -> tuple[Any, Any]:
    """dcpPrefillContextGathers (model.md §3.7): each run of C context tokens is gathered in
    ceil(C/chunk) launches of C·width/chunks bytes, charged one launch at a time."""
    kc = L.ctx_gather_coll
    width = L.ctx_gather_width
    chunk = p.mla_chunk
    if isinstance(runs, np.ndarray):
        for j in range(runs.shape[1]):
            C = runs[:, j]
            chunks = -((-C) // chunk)
            nbytes = C * width / np.maximum(chunks, 1)
            t = kc.seconds(nbytes)
            for i in range(int(chunks.max(initial=0))):
                go = pre & (i < chunks)
                if kc.crosses:
                    cross = np.where(go, cross + t, cross)
                else:
                    on_node = np.where(go, on_node + t, on_node)
        return on_node, cross
    if not pre:
        return on_node, cross
    for C in runs:
        chunks = -((-C) // chunk)
        t = kc.seconds(C * width / chunks)
        for _ in range(chunks):
            if kc.crosses:
                cross = cross + t
            else:
                on_node = on_node + t
    return on_node, cross


# --- 3. summarize --------------------------------------------------------------------------


def _sat_add(a: int, b: int) -> int:
    total = a + b
    return MAX_DURATION_NS if total > MAX_DURATION_NS else total


def finish(totals: StepTotals, per: dict[Resource, int] | None) -> StepEstimate:
    """model.md §1.4 summarize: per-resource ns, NoOverlap, bottleneck, Overlap (scalar totals)."""
    if per is not None:
        per.clear()
    if totals.empty:
        host = int(totals.host_ns)
        if per is not None:
            per[Resource.HOST] = host
        return StepEstimate(host, host, Resource.HOST, per)
    values = (totals.sm_s, totals.hbm_s, totals.nvlink_s, totals.nic_s, totals.host_s)
    no_overlap = 0
    best = 0.0
    bottleneck = Resource.SM
    for res, total in zip(RESOURCES, values, strict=True):
        if total <= 0:
            continue
        d = laws.to_duration_ns(float(total))
        if per is not None:
            per[res] = d
        no_overlap = _sat_add(no_overlap, d)
        if total > best:
            best = total
            bottleneck = res
    overlap = _sat_add(laws.to_duration_ns(float(totals.overlap_s)), int(totals.host_ns))
    if overlap > no_overlap:
        overlap = no_overlap
    return StepEstimate(overlap, no_overlap, bottleneck, per)


def step_time_into(r: ResolvedPool, batch: Batch, per: dict[Resource, int] | None) -> StepEstimate:
    """StepTime (model.md §1): walk, compose, summarize; fills and returns the caller's ``per``.

    An all-decode batch takes the bit-identical scalar fast path (:mod:`kernel.model.step_fast`), any
    other non-empty batch :mod:`kernel.model.step_mixed`, on every pool that has one.
    """
    p = prepared(r)
    fast = p.fast
    if fast is None:
        return finish(compose(r, summarise(r, batch)), per)
    reqs = batch.requests
    thr = batch.decode_threshold
    seen = set(map(_FIRST, reqs))  # the distinct scheduled counts: one in a uniform decode
    if reqs:
        if len(seen) == 1:
            (lo,) = seen
            hi = lo
        else:
            lo = min(seen)
            hi = max(seen)
        if lo > 0 and hi <= thr:  # all decode: step_fast
            tokens = lo * len(reqs) if lo == hi else sum(map(_FIRST, reqs))
            return step_fast.decode_estimate(
                p, fast, tokens, sum(map(_SECOND, reqs)) + tokens, lo, hi, len(reqs),
                batch.sm_budget, per)
        # A prefill (step_mixed).
        sl = list(map(_FIRST, reqs))
        rows = prefill_rows(sl, seen, lo, hi, thr)
        empty = 0
        if 0 in seen and thr >= 0:  # (0, 0) requests have no context: the walk skips them
            empty = sum(1 for q in reqs if q[0] == 0 and q[1] == 0)
        n = len(reqs)
        est = mixed_estimate(p, fast, n, sum(sl), sum(map(_SECOND, reqs)),
                             [(reqs[i][0], reqs[i][1]) for i in rows], empty,
                             len(seen) == 1 and p.uniform_width in seen, batch.sm_budget, per)
        if est is not None:
            return est
    # An empty step (host only).
    return finish(_compose(p, summarise(r, batch)), per)


def layer_breakdown(r: ResolvedPool, batch: Batch) -> list[dict[str, Any]]:
    """Per layer kind, one layer's terms for ``batch`` (display only: ``blis-kernel step``).

    Keys: kind, count, dense_sm, dense_hbm, nvlink, nic, routed_sm, routed_hbm, stage and
    ``dominant`` — the term that won the stage max (ties to the earlier, as the max does).
    """
    s = summarise(r, batch)
    if s.tokens_all == 0:
        return []
    trace: list[dict[str, Any]] = []
    p = prepared(r)
    if p.degenerate:
        with np.errstate(all="ignore"):
            _compose(p, s, trace)
    else:
        _compose(p, s, trace)
    for row, pl in zip(trace, r.plan.layers, strict=True):
        row["kind"] = pl.kind_id
        row["count"] = pl.count
    return trace
