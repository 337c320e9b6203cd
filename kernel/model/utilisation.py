"""Per-step work and utilisation: FLOPs, HBM bytes, network bytes, MFU and MBU.

The counts are the quantities the step's own terms charge (:func:`kernel.model.step.compose`), per
rank, read from the same :class:`~kernel.model.step.BatchSummary` and the same prepared pool
constants — so they are what the kernel *thinks* a step does, including its documented
over-charges (routed-expert FLOPs are not divided by TP and carry the MoE imbalance factor;
docs/decisions.md, issue 17). Terms priced by a measured rate (recurrent layers) have no
FLOP count and add nothing here.

Like ``compose``, :func:`work_counts` is polymorphic: on a scalar summary it returns Python
floats, on a summary of numpy columns it returns arrays whose elements are, bit for bit, the
scalar results (the same operations in the same order; only ``laws.select`` branches).

* MFU = FLOPs / (NoOverlap seconds × the chip's dense peak for the served dtype);
* MBU = HBM bytes / (NoOverlap seconds × the chip's catalog HBM bandwidth, not derated).

NoOverlap is the step time the spec recommends (model.md §1.4 "Which to use").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import laws
from .step import BatchSummary, dcp_charge_bytes, prepared, secondary_read_tokens, summarise
from .types import Batch

__all__ = [
    "EXTRA_COLUMNS",
    "UTILISATION_COLUMNS",
    "Utilisation",
    "WorkCounts",
    "batch_columns",
    "peaks",
    "step_utilisation",
    "utilisation",
    "work_counts",
]

# The optional per-batch columns bulk pricing adds (:func:`kernel.bulk.utilisation.column_producer`).
UTILISATION_COLUMNS: tuple[str, ...] = (
    "flops", "hbm_bytes", "nvlink_bytes", "nic_bytes", "mfu", "mbu")


class WorkCounts(NamedTuple):
    """Per-rank work of one step (fields may be numpy arrays of K steps)."""

    flops: Any  # FLOPs the SM terms charge (GEMMs, routed + shared experts, prefill attention, head)
    hbm_bytes: Any  # weights, KV read by decode attention, element-wise traffic, touched experts
    nvlink_bytes: Any  # payload of the collectives priced on the node (NVLink)
    nic_bytes: Any  # payload of the collectives that cross nodes (× span, as charged)


class Utilisation(NamedTuple):
    """:class:`WorkCounts` plus MFU and MBU against the chip's peaks (fractions, 0…1)."""

    flops: Any
    hbm_bytes: Any
    nvlink_bytes: Any
    nic_bytes: Any
    mfu: Any
    mbu: Any


def peaks(r: Any) -> tuple[float, float]:
    """(dense FLOP/s for the served dtype, HBM bytes/s) of the pool's chip, from the catalog.

    Raises ValueError when the pool carries no catalog HBM peak (a hand-built pool)."""
    flops = float(r.coefficients.peak_flops)
    hbm = float(getattr(r, "chip_hbm_peak_bps", 0.0) or 0.0)
    if not flops > 0:
        raise ValueError(f"{r.scenario}: the chip's compute peak is {flops!r}; MFU needs a "
                         "positive peak_flops")
    if not hbm > 0:
        raise ValueError(f"{r.scenario}: chip_hbm_peak_bps is {hbm!r}; MBU needs the chip's "
                         "catalog memory bandwidth (chip.memory_bandwidth_tbs > 0)")
    return flops, hbm


def work_counts(r: Any, s: BatchSummary) -> WorkCounts:
    """FLOPs and bytes of one step (or of K steps, from a summary of columns)."""
    if isinstance(s.tokens_all, np.ndarray):
        with np.errstate(all="ignore"):
            return _counts(r, s)
    return _counts(r, s)


def _counts(r: Any, s: BatchSummary) -> WorkCounts:
    p = prepared(r)
    tp = p.tp
    tokens_all = s.tokens_all
    empty = tokens_all == 0
    T = laws.select(empty, 1.0, laws.as_f64(tokens_all - s.withheld))
    dec = s.decode_requests > 0
    pre = s.prefill_requests > 0
    n_dec_kv = laws.as_f64(s.decode_kv_tokens)
    dcp, inter = p.dcp, p.interleave
    flops: Any = 0.0
    hbm: Any = 0.0
    nv: Any = 0.0
    nic: Any = 0.0
    for L in p.layers:
        lf: Any = 0.0
        # Dense GEMMs: the same FLOPs whether or not the ramp is shape-aware.
        if L.gemms:
            for f, _k, _n in L.gemms:
                lf = lf + T * f / tp
        elif not p.shape_aware:
            lf = lf + T * L.dense_flops / tp
        lb: Any = L.weight_bytes + T * L.elementwise / tp
        if L.expert:
            routed_tokens = T * L.funnel
            lf = lf + routed_tokens * L.top_k * L.share * L.expert_flops * p.imbalance / L.dp_slice
            lf = lf + T * L.shared_flops / tp
            touched = laws.experts_touched(laws.round_half(routed_tokens), L.total_experts,
                                           L.top_k, L.experts_per_rank)
            lb = lb + L.ets_weight * touched
        if L.attn:
            n_read = n_dec_kv if L.decode_sig < 0 else s.decode_reads[L.decode_sig]
            lb = laws.select(dec, lb + n_read * L.kv, lb)
            causal = s.causal_flops if L.window_idx < 0 else s.windowed[L.window_idx]
            lf = laws.select(pre, lf + causal * L.q_heads * L.head_dim / tp, lf)
            for a in L.secondaries:
                n = secondary_read_tokens(a, n_dec_kv, s.decode_requests, dcp, inter)
                lb = laws.select(dec, lb + n * a.per_tok, lb)
        ln: Any = 0.0
        lx: Any = 0.0
        for bpt, mult, kc in L.coll_list:
            nbytes = T * bpt
            if mult:
                nbytes = nbytes * mult
            if kc.crosses:
                lx = lx + nbytes * kc.span
            else:
                ln = ln + nbytes
        if L.dcp_decode:
            rows = s.decode_tokens if L.latent else laws.select(s.any_context, tokens_all, 0)
            rf = laws.as_f64(rows)
            for what, kc, heads in L.dcp_charges:
                nbytes = dcp_charge_bytes(L, what, rf, heads, dcp)
                if kc.crosses:
                    lx = lx + nbytes * kc.span
                else:
                    ln = ln + nbytes
            if L.ctx_gather:
                g = _gathered(L.ctx_gather_width, p.mla_chunk, s.context_runs)
                g = laws.select(pre, g, 0.0)
                if L.ctx_gather_coll.crosses:
                    lx = lx + g * L.ctx_gather_coll.span
                else:
                    ln = ln + g
        if L.pcp_gather:
            rows_f = laws.as_f64(p.pcp * s.prefill_tokens)
            kc = L.pcp_gather_coll
            for width in L.pcp_widths:
                nbytes = laws.select(s.prefill_tokens > 0, rows_f * width * 2, 0.0)
                if kc.crosses:
                    lx = lx + nbytes * kc.span
                else:
                    ln = ln + nbytes
        cnt = L.count
        flops = flops + cnt * lf
        hbm = hbm + cnt * lb
        nv = nv + cnt * ln
        nic = nic + cnt * lx
    head = r.plan.head
    flops = flops + T * p.head_flops / tp
    hbm = hbm + head.dense_weight_bytes / tp
    zero = 0.0
    return WorkCounts(laws.select(empty, zero, flops), laws.select(empty, zero, hbm),
                      laws.select(empty, zero, nv), laws.select(empty, zero, nic))


def _gathered(width: float, chunk: int, runs: Any) -> Any:
    """Bytes of the MLA context gathers: each run of C tokens in ceil(C/chunk) launches of
    C·width/launches bytes (what the DCP context-gather term charges, launch by launch)."""
    if isinstance(runs, np.ndarray):
        total = np.zeros(runs.shape[0])
        for j in range(runs.shape[1]):
            C = runs[:, j]
            chunks = -((-C) // chunk)
            total = total + chunks * (C * width / np.maximum(chunks, 1))
        return total
    out = 0.0
    for C in runs:
        chunks = -((-C) // chunk)
        out = out + chunks * (C * width / max(chunks, 1))
    return out


def utilisation(r: Any, counts: WorkCounts, no_overlap_ns: Any) -> Utilisation:
    """MFU and MBU of steps that took ``no_overlap_ns`` (0 where the step took no time)."""
    peak_flops, peak_hbm = peaks(r)
    secs = laws.duration_seconds(no_overlap_ns)
    mfu: Any
    mbu: Any
    if isinstance(secs, np.ndarray):
        on = secs > 0
        safe = np.where(on, secs, 1.0)
        mfu = np.where(on, counts.flops / (safe * peak_flops), 0.0)
        mbu = np.where(on, counts.hbm_bytes / (safe * peak_hbm), 0.0)
    else:
        mfu = counts.flops / (secs * peak_flops) if secs > 0 else 0.0
        mbu = counts.hbm_bytes / (secs * peak_hbm) if secs > 0 else 0.0
    return Utilisation(*counts, mfu, mbu)


def step_utilisation(r: Any, batch: Batch, no_overlap_ns: int) -> Utilisation:
    """The scalar path: one batch's counts and MFU/MBU given its NoOverlap time."""
    return utilisation(r, work_counts(r, summarise(r, batch)), no_overlap_ns)


# -- bulk: the optional utilisation columns -------------------------------------------------

# Beside the six utilisation columns, the two the report's throughput and KV sections read.
EXTRA_COLUMNS: tuple[str, ...] = ("prefill_tokens", "kv_blocks")


def batch_columns(ctx: Any) -> dict[str, np.ndarray]:
    """The utilisation columns of a priced chunk (a ``kernel.bulk.columns.BatchContext``):
    flops, hbm_bytes, nvlink_bytes, nic_bytes, mfu, mbu — each element what
    :func:`step_utilisation` gives for that batch — then prefill_tokens (scheduled tokens of
    the prefill requests) and kv_blocks (Σ ⌈(computed + scheduled) / (block_size × DCP
    shards)⌉ over the batch's requests)."""
    r, s = ctx.pool, ctx.summary
    n = ctx.n
    u = utilisation(r, work_counts(r, s), np.asarray(ctx.priced["no_overlap_ns"], np.int64))
    out = {name: np.broadcast_to(np.asarray(v, np.float64), (n,))
           for name, v in zip(UTILISATION_COLUMNS, u, strict=True)}
    out["prefill_tokens"] = np.asarray(s.tokens_all - s.decode_tokens, np.int64)
    out["kv_blocks"] = ctx.row_totals["kv_blocks_held"]
    return out
