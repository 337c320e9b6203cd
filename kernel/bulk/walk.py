"""The vectorised walk: :func:`kernel.step.summarise` and :func:`kernel.step.finish` on columns.

:func:`summarise_columns` evaluates the per-request laws of :mod:`kernel.laws` on whole columns
of rows and reduces them per batch into a :class:`kernel.step.BatchSummary` of arrays: integer
sums exactly in int64 (``Groups.sum``: order-free), float sums with ``np.bincount(weights=...)``,
which accumulates sequentially in row order exactly as the scalar walk does. So the rows of a
batch need not be contiguous, only in request order among themselves. :func:`kernel.step.compose` then runs unchanged on that array summary, and
:func:`finish_columns` is ``step.finish`` on arrays. The numbers equal ``Kernel.step_time``'s
bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import laws, step
from ..types import MAX_DURATION_NS, RESOURCES
from .groups import Groups, runs

if TYPE_CHECKING:
    from ..resolved import ResolvedPool

__all__ = ["RESOURCE_NAMES", "finish_columns", "summarise_columns"]

RESOURCE_NAMES = tuple(r.value for r in RESOURCES)  # sm, hbm, nvlink, nic, host


def _fsum(inv: np.ndarray, w: np.ndarray, nb: int) -> np.ndarray:
    """Per-batch float sums accumulated sequentially in row order (np.bincount's loop)."""
    if w.size == 0:
        return np.zeros(nb)
    return np.bincount(inv, weights=w, minlength=nb)


def _busiest_chunks(s: np.ndarray, c: np.ndarray, pcp: int, dcp: int
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """laws.pcp_busiest_chunks on arrays: up to two (tokens, prefix) chunks per request;
    absent chunks have 0 tokens (their windowed term is then exactly 0.0)."""
    local = laws.pcp_local_tokens(s, pcp, dcp)
    whole = (local < 0) | (local == s)
    n_chunks = 2 * pcp
    ch = -((-s) // n_chunks)
    def chunk_len(idx: Any) -> np.ndarray:  # zigzag chunk idx: [lo, hi) over s tokens
        lo = np.minimum(idx * ch, s)
        return np.maximum(np.minimum(lo + ch, s) - lo, 0)

    held = np.stack([chunk_len(r) + chunk_len(n_chunks - 1 - r) for r in range(pcp)])
    busiest = np.argmax(held, axis=0)  # first strict maximum
    out = []
    for which in (0, 1):
        idx = busiest if which == 0 else n_chunks - 1 - busiest
        lo = np.minimum(idx * ch, s)
        hi = np.minimum(lo + ch, s)
        n = np.where(hi > lo, hi - lo, 0)
        pre = c + lo
        if which == 0:
            out.append((np.where(whole, s, n), np.where(whole, c, pre)))
        else:
            out.append((np.where(whole, 0, n), np.where(whole, 0, pre)))
    return out


def _context_runs(inv: np.ndarray, s: np.ndarray, c: np.ndarray, nb: int) -> np.ndarray:
    """dcpPrefillContextGathers' runs per batch (step._context_runs on prefill rows) as a
    zero-padded [nb, runs] int64 array, runs in the scalar walk's order."""
    if inv.size == 0:
        return np.zeros((nb, 0), np.int64)
    order = np.lexsort((s, inv))  # stable: by batch, then scheduled, then input order
    b, cc = inv[order], c[order]
    pos = cc > 0
    new_batch = np.concatenate(([True], b[1:] != b[:-1]))
    prev_pos = np.concatenate(([False], pos[:-1]))
    start = pos & (new_batch | ~prev_pos)
    if not start.any():
        return np.zeros((nb, 0), np.int64)
    run_sum = np.add.reduceat(cc[pos], np.flatnonzero(start[pos]))
    run_b = b[start]
    k = np.arange(run_b.size) - np.searchsorted(run_b, run_b, side="left")
    out = np.zeros((nb, int(k.max()) + 1), np.int64)
    out[run_b, k] = run_sum
    return out


def summarise_columns(r: ResolvedPool, g: Groups, scheduled: np.ndarray, computed: np.ndarray,
                      threshold: np.ndarray | int, sm_budget: np.ndarray) -> step.BatchSummary:
    """step.summarise for every batch at once.

    Rows are in request order within each batch (``g``: grouped or not), and validated
    (``scheduled``, ``computed`` >= 0, so a request is skipped exactly when both are 0);
    ``threshold`` is per batch (or one int for all), ``sm_budget`` per batch.
    """
    p = step.prepared(r)
    nb = g.n
    inv = g.inv
    s = scheduled.astype(np.int64, copy=False)
    c = computed.astype(np.int64, copy=False)
    n_requests = g.counts
    tokens_all = g.sum(s)
    computed_all = g.sum(c)
    # Index lists of the (usually few) rows that are not plain decodes with context.
    width = p.uniform_width
    odd = np.flatnonzero(s != width)  # rows breaking a uniform decode
    uniform = np.bincount(inv[odd], minlength=nb) == 0
    no_ctx = np.flatnonzero(c == 0)
    # any request with computed > 0 (such a request is never skipped)
    any_ctx = np.bincount(inv[no_ctx], minlength=nb) < n_requests
    dead = no_ctx[s[no_ctx] == 0]  # ctx == 0: skipped by the walk
    n_live = n_requests - np.bincount(inv[dead], minlength=nb)
    if isinstance(threshold, np.ndarray) and threshold.size and \
            int(threshold.min()) == int(threshold.max()):
        threshold = int(threshold[0])
    if isinstance(threshold, np.ndarray):
        live = np.ones(s.size, bool)
        live[dead] = False
        pi = np.flatnonzero(live & (s > threshold[inv]))
    elif threshold >= width:  # a prefill is never a uniform-decode row
        pi = odd[s[odd] > threshold]
    elif threshold >= 0:  # s > threshold >= 0: never a skipped row
        pi = np.flatnonzero(s > threshold)
    else:
        live = np.ones(s.size, bool)
        live[dead] = False
        pi = np.flatnonzero(live & (s > threshold))
    is_pre = np.zeros(s.size, bool)
    if p.decode_sigs:
        is_pre[pi] = True
    ps, pc_, pinv = s[pi], c[pi], inv[pi]
    pre_req = np.bincount(pinv, minlength=nb).astype(np.int64)
    dec_req = n_live - pre_req
    pre_s = _isum_sparse(pinv, ps, nb, g.grouped)
    dec_tok = tokens_all - pre_s
    dec_kv = tokens_all + computed_all - pre_s - _isum_sparse(pinv, pc_, nb, g.grouped)
    # Prefill rows.
    pcp, dcp, inter = p.pcp, p.dcp, p.interleave
    pairs = laws.causal_pairs(ps, pc_)
    local = ps
    chunks = [(ps, pc_)]
    if pcp > 1 and pi.size:
        loc = laws.pcp_local_tokens(ps, pcp, dcp)
        has = loc >= 0
        local = np.where(has, loc, ps)
        pairs = np.where(has, laws.pcp_causal_pairs(ps, pc_, pcp, dcp), pairs)
        chunks = _busiest_chunks(ps, pc_, pcp, dcp)
    causal = _fsum(pinv, pairs, nb)
    if local is ps:
        pre_tok, withheld = pre_s, np.zeros(nb, np.int64)
    else:
        pre_tok = _isum_sparse(pinv, local, nb, g.grouped)
        withheld = _isum_sparse(pinv, ps - local, nb, g.grouped)
    windowed = []
    for w in p.windows:
        if len(chunks) == 1:
            terms = laws.windowed_pairs_for_chunk(chunks[0][0], chunks[0][1], w)
            wsum = _fsum(pinv, terms, nb)
        else:  # interleave each request's two chunks, in order
            t0 = laws.windowed_pairs_for_chunk(chunks[0][0], chunks[0][1], w)
            t1 = laws.windowed_pairs_for_chunk(chunks[1][0], chunks[1][1], w)
            both = np.empty(2 * t0.size)
            both[0::2], both[1::2] = t0, t1
            wsum = _fsum(np.repeat(pinv, 2), both, nb)
        windowed.append(4 * wsum)
    # Decode rows: per-signature reads, summed in request order.
    reads = []
    if p.decode_sigs:
        is_dec = ~is_pre
        is_dec[dead] = False
        di = np.flatnonzero(is_dec)
        dctx, dinv = s[di] + c[di], inv[di]
        for topk, ratio, shards in p.decode_sigs:
            per = laws.dcp_decode_tokens_one(dctx, topk, ratio, dcp, inter, shards)
            reads.append(_fsum(dinv, np.asarray(per, np.float64), nb))
    runs = (_context_runs(pinv, ps, pc_, nb) if p.ctx_runs
            else np.zeros((nb, 0), np.int64))
    return step.BatchSummary(
        n_requests, tokens_all, withheld, pre_req, dec_req, dec_tok, dec_kv, pre_tok, causal,
        any_ctx, uniform, sm_budget.astype(np.int64, copy=False), tuple(reads), tuple(windowed),
        runs)


def _isum_sparse(inv: np.ndarray, x: np.ndarray, nb: int, grouped: bool) -> np.ndarray:
    """Exact int64 per-batch sums of a subset of rows (``grouped``: ``inv`` non-decreasing)."""
    out = np.zeros(nb, np.int64)
    if inv.size == 0:
        return out
    x = x.astype(np.int64, copy=False)
    if grouped:
        st = runs(inv)
        out[inv[st]] = np.add.reduceat(x, st)
    else:
        np.add.at(out, inv, x)
    return out


# -- vectorised finish ----------------------------------------------------------------------------

def _sat_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for non-negative int64, saturating at MaxInt64 (step._sat_add)."""
    over = a > MAX_DURATION_NS - b
    return np.where(over, MAX_DURATION_NS, a + np.where(over, 0, b))


def finish_columns(t: step.StepTotals) -> dict[str, np.ndarray]:
    """step.finish on arrays: per-resource ns, NoOverlap, bottleneck code, Overlap."""
    empty = np.asarray(t.empty, bool)
    host_ns = np.asarray(t.host_ns, np.int64)
    k = empty.size
    values = [np.broadcast_to(np.asarray(v, np.float64), (k,))
              for v in (t.sm_s, t.hbm_s, t.nvlink_s, t.nic_s, t.host_s)]
    no_overlap = np.zeros(k, np.int64)
    best = np.zeros(k)
    code = np.zeros(k, np.int8)
    per = {}
    for i, (name, total) in enumerate(zip(RESOURCE_NAMES, values, strict=True)):
        on = ~(total <= 0)
        d = np.where(on, laws.to_duration_ns(np.where(on, total, 0.0)), 0)
        per[name] = d
        no_overlap = _sat_add(no_overlap, d)
        win = on & (total > best)
        best = np.where(win, total, best)
        code = np.where(win, i, code)
    overlap = _sat_add(laws.to_duration_ns(np.asarray(t.overlap_s, np.float64)
                                           * np.ones(k)), host_ns)
    overlap = np.minimum(overlap, no_overlap)
    host_i = RESOURCE_NAMES.index("host")
    for name in RESOURCE_NAMES:
        per[name] = np.where(empty, host_ns if name == "host" else 0, per[name])
    return {
        "overlap_ns": np.where(empty, host_ns, overlap),
        "no_overlap_ns": np.where(empty, host_ns, no_overlap),
        "bottleneck": np.where(empty, host_i, code).astype(np.int8),
        **{f"{n}_ns": per[n] for n in RESOURCE_NAMES},
    }

