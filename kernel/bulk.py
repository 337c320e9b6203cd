"""Bulk pricing: a recorded trace of millions of steps, priced as columns.

:func:`price` turns a request-level trace (``docs/traces.md``) into one row per batch with
the same numbers :meth:`Kernel.step_time` gives for each batch, without a Python loop per
batch:

1. rows are grouped by batch (a stable sort when the batch ids are not contiguous, so each
   batch keeps its requests in input order);
2. :func:`summarise_columns` evaluates the per-request laws of :mod:`kernel.laws` on whole
   columns and reduces them per batch into a :class:`kernel.step.BatchSummary` of arrays —
   integer sums with ``np.add.reduceat`` (exact, order-free), float sums with
   ``np.bincount(weights=...)``, which accumulates sequentially in row order exactly as the
   scalar walk does;
3. :func:`kernel.step.compose` runs unchanged on that array summary;
4. :func:`finish_columns` is ``step.finish`` on arrays.

:func:`price_file` streams a trace of any size with bounded memory (see ``docs/traces.md``
"Streaming"): batched reads, a tail batch carried into the next chunk while batch ids run in
increasing order, and otherwise a fallback that hash-partitions rows by batch id into
temporary Arrow files and prices them bucket by bucket.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import laws, safe_output, step
from .trace import (
    BATCH_COLUMNS,
    BATCH_REJECTED,
    CONFLICT,
    DUPLICATE_BATCH,
    INT64_MAX,
    OVERFLOW,
    REJECT_SCHEMA,
    UNKNOWN_BATCH,
    RejectedRowError,
    Rows,
    TraceError,
    coerce,
    open_trace,
)
from .types import MAX_DURATION_NS, RESOURCES

if TYPE_CHECKING:
    from .kernel import Kernel
    from .resolved import ResolvedPool

__all__ = [
    "PRICED_SCHEMA",
    "PriceCounts",
    "PricedResult",
    "finish_columns",
    "price",
    "price_file",
    "price_result",
    "summarise_columns",
]

RESOURCE_NAMES = tuple(r.value for r in RESOURCES)  # sm, hbm, nvlink, nic, host
PRICED_SCHEMA = pa.schema(
    [("batch_id", pa.int64()), ("overlap_ns", pa.int64()), ("no_overlap_ns", pa.int64()),
     ("bottleneck", pa.string())]
    + [(f"{n}_ns", pa.int64()) for n in RESOURCE_NAMES]
    + [("tokens", pa.int64()), ("requests", pa.int64()), ("prefill_requests", pa.int64()),
       ("decode_requests", pa.int64())])


# -- grouping --------------------------------------------------------------------------------

@dataclass
class _Groups:
    starts: np.ndarray  # first row of each batch (rows grouped, batches in first-seen order)
    ids: np.ndarray  # batch id of each batch
    inv: np.ndarray  # dense batch index of each row

    @property
    def n(self) -> int:
        return int(self.starts.size)


def _runs(ids: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.zeros(0, np.int64)
    brk = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return np.concatenate(([0], brk)).astype(np.int64)


def _groups_of_grouped(ids: np.ndarray) -> _Groups:
    starts = _runs(ids)
    inv = np.zeros(ids.size, np.int64)
    if starts.size > 1:
        inv[starts[1:]] = 1
        np.cumsum(inv, out=inv)
    return _Groups(starts, ids[starts], inv)


def _groups_from_starts(ids: np.ndarray, starts: np.ndarray) -> _Groups:
    inv = np.zeros(ids.size, np.int64)
    if starts.size > 1:
        inv[starts[1:]] = 1
        np.cumsum(inv, out=inv)
    return _Groups(starts, ids[starts], inv)


def _group(rows: Rows) -> tuple[Rows, _Groups]:
    """Rows reordered (stably) so each batch is contiguous, batches in first-seen order."""
    ids = rows.batch_id
    starts = _runs(ids)
    run_ids = ids[starts]
    if run_ids.size <= 1 or bool(np.all(run_ids[1:] > run_ids[:-1])) or \
            np.unique(run_ids).size == run_ids.size:
        return rows, _groups_of_grouped(ids)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    order = np.argsort(rank[inv], kind="stable")
    rows = rows.take(order)
    return rows, _groups_of_grouped(rows.batch_id)


# -- whole-batch checks -----------------------------------------------------------------------

def _batch_checks(rows: Rows, g: _Groups, inline_batch_cols: tuple[str, ...],
                  rejects: list[pa.Table] | None, strict: bool) -> tuple[Rows, _Groups]:
    """Reject whole batches: a rejected row, an int64 sum overflow, a per-batch conflict."""
    nb = g.n
    reason = np.zeros(nb, np.int8)  # 1 sibling rejected, 2 overflow, 3 conflict
    detail: dict[int, str] = {}
    column: dict[int, str] = {}
    if rows.bad.any():
        badb = np.unique(g.inv[rows.bad])
        reason[badb] = 1
    good = ~rows.bad
    any_bad = bool(rows.bad.any())
    s = np.where(good, rows.scheduled, 0) if any_bad else rows.scheduled
    c = np.where(good, rows.computed, 0) if any_bad else rows.computed
    longest = int(np.diff(np.append(g.starts, len(rows))).max()) if nb else 0
    if nb and (int(s.max()) + int(c.max())) * longest >= 2**62:  # sums might not fit int64
        approx = np.bincount(g.inv, weights=s.astype(np.float64) + c.astype(np.float64),
                             minlength=nb)
        for b in np.flatnonzero(approx >= 2.0**62):  # exact check in Python ints (rare)
            sl = slice(int(g.starts[b]), int(g.starts[b + 1]) if b + 1 < nb else len(rows))
            ss = sum(int(x) for x in s[sl])
            cc = ss + sum(int(x) for x in c[sl])
            if cc > INT64_MAX and reason[b] == 0:
                reason[b] = 2
                column[int(b)] = "scheduled" if ss > INT64_MAX else "computed"
                detail[int(b)] = ("per-batch sum of scheduled exceeds int64" if ss > INT64_MAX
                                  else "per-batch sum of computed + scheduled exceeds int64")
    for name in inline_batch_cols:
        v = getattr(rows, name)
        if v is None:
            continue
        vmin = np.minimum.reduceat(v, g.starts) if nb else v[:0]
        vmax = np.maximum.reduceat(v, g.starts) if nb else v[:0]
        conflict = (vmin != vmax) & (reason == 0)
        for b in np.flatnonzero(conflict):
            column[int(b)] = name
            detail[int(b)] = f"{name} differs within the batch ({vmin[b]} vs {vmax[b]})"
        reason[conflict] = 3
    if not reason.any():
        return rows, g
    rej_row = reason[g.inv] != 0
    sib = np.flatnonzero(rej_row & good)
    if sib.size:
        rb = g.inv[sib]
        first_bad: dict[int, int] = {}
        if rows.bad.any():
            bad_idx = np.flatnonzero(rows.bad)
            for i in bad_idx[::-1]:
                first_bad[int(g.inv[i])] = int(rows.row[i])
        reasons = [(BATCH_REJECTED, OVERFLOW, CONFLICT)[int(reason[b]) - 1] for b in rb]
        details = [f"row {first_bad[int(b)]} of this batch was rejected" if reason[b] == 1
                   else detail[int(b)] for b in rb]
        cols = ["" if reason[b] == 1 else column[int(b)] for b in rb]
        sub = rows.take(sib)
        values = [f"batch_id={b}, scheduled={x}, computed={y}"
                  for b, x, y in zip(sub.batch_id.tolist(), sub.scheduled.tolist(),
                                     sub.computed.tolist(), strict=True)]
        tbl = pa.table({
            "row": pa.array(sub.row, pa.int64()),
            "batch_id": pa.array(sub.batch_id, pa.int64()),
            "reason": pa.array(reasons, pa.string()),
            "column": pa.array(cols, pa.string()),
            "detail": pa.array(details, pa.string()),
            "source": pa.array(["trace"] * sib.size, pa.string()),
            "values": pa.array(values, pa.string()),
        }, schema=REJECT_SCHEMA)
        if strict:
            raise RejectedRowError(tbl.slice(0, 1).to_pylist()[0])
        if rejects is not None:
            rejects.append(tbl)
    keep = np.flatnonzero(~rej_row)
    rows = rows.take(keep)
    return rows, _groups_of_grouped(rows.batch_id)


# -- the vectorised walk ------------------------------------------------------------------------

def _isum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Exact int64 per-batch sums of grouped rows."""
    if starts.size == 0:
        return np.zeros(0, np.int64)
    return np.add.reduceat(x.astype(np.int64, copy=False), starts)


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


def summarise_columns(r: ResolvedPool, g: _Groups, scheduled: np.ndarray, computed: np.ndarray,
                      threshold: np.ndarray | int, sm_budget: np.ndarray) -> step.BatchSummary:
    """step.summarise for every batch at once.

    Rows are grouped by batch (``g``), in request order within each batch, and validated
    (``scheduled``, ``computed`` >= 0, so a request is skipped exactly when both are 0);
    ``threshold`` is per batch (or one int for all), ``sm_budget`` per batch.
    """
    p = step.prepared(r)
    nb = g.n
    inv, starts = g.inv, g.starts
    s = scheduled.astype(np.int64, copy=False)
    c = computed.astype(np.int64, copy=False)
    n_requests = np.diff(np.append(starts, s.size))
    tokens_all = _isum(s, starts)
    computed_all = _isum(c, starts)
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
    pre_s = _isum_sparse(pinv, ps, nb)
    dec_tok = tokens_all - pre_s
    dec_kv = tokens_all + computed_all - pre_s - _isum_sparse(pinv, pc_, nb)
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
        pre_tok = _isum_sparse(pinv, local, nb)
        withheld = _isum_sparse(pinv, ps - local, nb)
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


def _count(inv: np.ndarray, mask: np.ndarray, nb: int) -> np.ndarray:
    """Rows per batch where ``mask`` holds."""
    idx = np.flatnonzero(mask)
    return np.bincount(inv[idx], minlength=nb).astype(np.int64)


def _isum_sparse(inv: np.ndarray, x: np.ndarray, nb: int) -> np.ndarray:
    """Exact int64 per-batch sums of a subset of rows (``inv`` non-decreasing)."""
    out = np.zeros(nb, np.int64)
    if inv.size == 0:
        return out
    st = _runs(inv)
    out[inv[st]] = np.add.reduceat(x.astype(np.int64, copy=False), st)
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


_BOTTLENECK_DICT = pa.array(list(RESOURCE_NAMES), pa.string())


def _price_grouped(r: ResolvedPool, rows: Rows, g: _Groups, decode_threshold: int = 1,
                   sm_budget: int = 0) -> pa.Table:
    """Price rows that are grouped by batch and already validated: one row per batch.

    The arguments apply where ``rows`` has no per-batch column."""
    if g.n == 0:
        return PRICED_SCHEMA.empty_table()
    first = g.starts
    thr: np.ndarray | int = (rows.decode_threshold[first] if rows.decode_threshold is not None
                             else int(decode_threshold))
    sm = (rows.sm_budget[first] if rows.sm_budget is not None
          else np.full(g.n, int(sm_budget), np.int64))
    summary = summarise_columns(r, g, rows.scheduled, rows.computed, thr, sm)
    totals = step.compose(r, summary)
    out = finish_columns(totals)
    bott = pa.DictionaryArray.from_arrays(pa.array(out.pop("bottleneck")),
                                          _BOTTLENECK_DICT).cast(pa.string())
    cols: dict[str, Any] = {"batch_id": g.ids, "overlap_ns": out["overlap_ns"],
                            "no_overlap_ns": out["no_overlap_ns"], "bottleneck": bott}
    for n in RESOURCE_NAMES:
        cols[f"{n}_ns"] = out[f"{n}_ns"]
    cols["tokens"] = summary.tokens_all
    cols["requests"] = summary.n_requests.astype(np.int64)
    cols["prefill_requests"] = summary.prefill_requests
    cols["decode_requests"] = summary.decode_requests
    return pa.table(cols, schema=PRICED_SCHEMA)


# -- the per-batch side table -------------------------------------------------------------------

class _BatchTable:
    """An optional per-batch table (batch_id, decode_threshold, sm_budget) as sorted arrays."""

    def __init__(self, src: Any, columns: Mapping[str, str] | None,
                 rejects: list[pa.Table], strict: bool, decode_threshold: int, sm_budget: int):
        ts = open_trace(src, columns=columns, chunk_rows=1 << 62, required=("batch_id",),
                        optional=BATCH_COLUMNS)
        self.present = tuple(c for c in BATCH_COLUMNS if c in ts.names)
        parts = [coerce(t, 0, rejects=rejects, strict=strict, source="batches")
                 for t in ts.chunks()]
        rows = Rows.concat(parts) if parts else Rows.empty()
        self.rows_in = ts.num_rows or 0
        # bad rows: their batches are rejected in the trace (banned ids)
        self.banned = np.unique(rows.batch_id[rows.bad])
        self.banned_row = {int(b): int(rw) for b, rw in
                           zip(rows.batch_id[rows.bad][::-1], rows.row[rows.bad][::-1],
                               strict=True)}
        ok = rows.take(np.flatnonzero(~rows.bad))
        order = np.argsort(ok.batch_id, kind="stable")
        ids = ok.batch_id[order]
        dup = np.zeros(ids.size, bool)
        if ids.size > 1:
            same = ids[1:] == ids[:-1]
            dup[1:] |= same
            dup[:-1] |= same
        if dup.any():
            d = order[dup]
            tbl = pa.table({
                "row": pa.array(ok.row[d], pa.int64()),
                "batch_id": pa.array(ok.batch_id[d], pa.int64()),
                "reason": pa.array([DUPLICATE_BATCH] * d.size, pa.string()),
                "column": pa.array(["batch_id"] * d.size, pa.string()),
                "detail": pa.array(["the per-batch table names this batch more than once"]
                                   * d.size, pa.string()),
                "source": pa.array(["batches"] * d.size, pa.string()),
                "values": pa.array([f"batch_id={b}" for b in ok.batch_id[d].tolist()]),
            }, schema=REJECT_SCHEMA)
            if strict:
                raise RejectedRowError(tbl.slice(0, 1).to_pylist()[0])
            rejects.append(tbl)
            for b, rw in zip(ok.batch_id[d].tolist(), ok.row[d].tolist(), strict=True):
                self.banned_row.setdefault(int(b), int(rw))
            self.banned = np.union1d(self.banned, ok.batch_id[d])
            keep = order[~dup]
        else:
            keep = order
        self.ids = ok.batch_id[keep]
        self.rows = ok.row[keep]
        self.thr = (ok.decode_threshold[keep] if ok.decode_threshold is not None
                    else np.full(keep.size, decode_threshold, np.int64))
        self.sm = (ok.sm_budget[keep] if ok.sm_budget is not None
                   else np.full(keep.size, sm_budget, np.int64))
        self.defaults = (int(decode_threshold), int(sm_budget))
        self.seen = np.zeros(self.ids.size, bool)
        self.rows_rejected = 0

    def apply(self, rows: Rows, rejects: list[pa.Table] | None, strict: bool) -> None:
        """Set per-batch values from the table; mark rows of banned batches bad."""
        if len(rows) == 0:
            return
        if self.ids.size:
            j = np.searchsorted(self.ids, rows.batch_id)
            jc = np.minimum(j, self.ids.size - 1)
            hit = self.ids[jc] == rows.batch_id
            self.seen[jc[hit]] = True
            if "decode_threshold" in self.present:
                if rows.decode_threshold is None:
                    rows.decode_threshold = np.full(len(rows), self.defaults[0], np.int64)
                rows.decode_threshold[hit] = self.thr[jc[hit]]
            if "sm_budget" in self.present:
                if rows.sm_budget is None:
                    rows.sm_budget = np.full(len(rows), self.defaults[1], np.int64)
                rows.sm_budget[hit] = self.sm[jc[hit]]
        if self.banned.size:
            ban = np.isin(rows.batch_id, self.banned) & ~rows.bad
            if ban.any():
                idx = np.flatnonzero(ban)
                bids = rows.batch_id[idx].tolist()
                tbl = pa.table({
                    "row": pa.array(rows.row[idx], pa.int64()),
                    "batch_id": pa.array(rows.batch_id[idx], pa.int64()),
                    "reason": pa.array([BATCH_REJECTED] * idx.size, pa.string()),
                    "column": pa.array([""] * idx.size, pa.string()),
                    "detail": pa.array([f"row {self.banned_row[b]} of the per-batch table "
                                        "was rejected" for b in bids], pa.string()),
                    "source": pa.array(["trace"] * idx.size, pa.string()),
                    "values": pa.array([f"batch_id={b}" for b in bids], pa.string()),
                }, schema=REJECT_SCHEMA)
                if strict:
                    raise RejectedRowError(tbl.slice(0, 1).to_pylist()[0])
                if rejects is not None:
                    rejects.append(tbl)
                rows.bad[idx] = True  # bad rows are already reported

    def unknown(self, rejects: list[pa.Table] | None, strict: bool) -> int:
        miss = np.flatnonzero(~self.seen)
        if miss.size == 0:
            return 0
        tbl = pa.table({
            "row": pa.array(self.rows[miss], pa.int64()),
            "batch_id": pa.array(self.ids[miss], pa.int64()),
            "reason": pa.array([UNKNOWN_BATCH] * miss.size, pa.string()),
            "column": pa.array(["batch_id"] * miss.size, pa.string()),
            "detail": pa.array(["no request row of the trace has this batch id"] * miss.size,
                               pa.string()),
            "source": pa.array(["batches"] * miss.size, pa.string()),
            "values": pa.array([f"batch_id={b}" for b in self.ids[miss].tolist()]),
        }, schema=REJECT_SCHEMA)
        if strict:
            raise RejectedRowError(tbl.slice(0, 1).to_pylist()[0])
        if rejects is not None:
            rejects.append(tbl)
        return int(miss.size)


# -- results --------------------------------------------------------------------------------------

@dataclass
class PriceCounts:
    """What a pricing run saw: ``rows_in == rows_priced + rows_rejected`` (request rows)."""

    rows_in: int = 0
    rows_priced: int = 0
    rows_rejected: int = 0
    batches_priced: int = 0
    batch_table_rows_rejected: int = 0  # rows of the per-batch table set aside
    mode: str = "in-memory"  # in-memory | contiguous | partitioned
    seconds: float = 0.0

    def check(self) -> None:
        if self.rows_in != self.rows_priced + self.rows_rejected:
            raise AssertionError(f"rows in {self.rows_in} != priced {self.rows_priced} + "
                                 f"rejected {self.rows_rejected}")

    @property
    def steps_per_second(self) -> float:
        return self.batches_priced / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PricedResult:
    """The priced batches, the rejected rows and the counts of one in-memory run."""

    priced: pl.DataFrame
    rejects: pl.DataFrame
    counts: PriceCounts = field(default_factory=PriceCounts)


# -- the engine -------------------------------------------------------------------------------

class _Engine:
    def __init__(self, r: ResolvedPool, names: Mapping[str, str], *, decode_threshold: int,
                 sm_budget: int, strict: bool, batch_table: _BatchTable | None,
                 on_priced: Callable[[pa.Table], None],
                 on_rejects: Callable[[pa.Table], None]):
        self.r = r
        self.defaults = {"decode_threshold": int(decode_threshold), "sm_budget": int(sm_budget)}
        self.strict = strict
        self.inline = tuple(c for c in BATCH_COLUMNS if c in names)
        if batch_table is not None:
            both = set(self.inline) & set(batch_table.present)
            if both:
                raise TraceError(f"per-batch column(s) {sorted(both)} given both in the trace "
                                 "and in the per-batch table")
        self.bt = batch_table
        self.on_priced = on_priced
        self.on_rejects = on_rejects
        self.counts = PriceCounts()

    def _emit_rejects(self, parts: list[pa.Table]) -> None:
        for t in parts:
            if t.num_rows:
                if (t.column("source").to_pylist()[0] == "batches"):
                    self.counts.batch_table_rows_rejected += t.num_rows
                else:
                    self.counts.rows_rejected += t.num_rows
                self.on_rejects(t)

    def coerce(self, raw: pa.Table, offset: int) -> Rows:
        rej: list[pa.Table] = []
        self.counts.rows_in += raw.num_rows
        rows = coerce(raw, offset, rejects=rej, strict=self.strict)
        if self.bt is not None:
            self.bt.apply(rows, rej, self.strict)
        self._emit_rejects(rej)
        return rows

    def price(self, rows: Rows, starts: np.ndarray | None = None) -> None:
        """Price rows holding every row of each batch they touch (``starts``: the first row
        of each batch when the rows are already grouped)."""
        if len(rows) == 0:
            return
        if starts is None:
            rows, g = _group(rows)
        else:
            g = _groups_from_starts(rows.batch_id, starts)
        rej: list[pa.Table] = []
        rows, g = _batch_checks(rows, g, self.inline, rej, self.strict)
        self._emit_rejects(rej)
        if g.n == 0:
            return
        out = _price_grouped(self.r, rows, g, **self.defaults)
        self.counts.rows_priced += len(rows)
        self.counts.batches_priced += g.n
        self.on_priced(out)

    def finish(self) -> None:
        if self.bt is not None:
            rej: list[pa.Table] = []
            self.bt.unknown(rej, self.strict)
            self._emit_rejects(rej)


def _rows_of(trace: Any) -> Rows:
    """A whole in-memory trace as coerced rows (bad rows marked, rejects dropped)."""
    src = open_trace(trace, chunk_rows=1 << 62)
    parts = [coerce(t, 0) for t in src.chunks()]
    return Rows.concat(parts) if parts else Rows.empty()


def _resolved(k: Kernel | ResolvedPool) -> ResolvedPool:
    from .resolved import ResolvedPool

    return k if isinstance(k, ResolvedPool) else k.resolved_pool


def price_result(k: Kernel | ResolvedPool, trace: Any, *, decode_threshold: int = 1,
                 sm_budget: int = 0, columns: Mapping[str, str] | None = None,
                 batches: Any = None, strict: bool = False) -> PricedResult:
    """Price an in-memory trace (or a file, read whole): priced rows, rejects and counts.

    Batches come out in order of their first row. ``batches`` is an optional per-batch table
    (``batch_id`` + ``decode_threshold`` and/or ``sm_budget``).
    """
    t0 = time.perf_counter()
    src = open_trace(trace, columns=columns, chunk_rows=1 << 62)
    priced: list[pa.Table] = []
    rejects: list[pa.Table] = []
    bt_rej: list[pa.Table] = []
    bt = (_BatchTable(batches, columns, bt_rej, strict, decode_threshold, sm_budget)
          if batches is not None else None)
    eng = _Engine(_resolved(k), src.names, decode_threshold=decode_threshold,
                  sm_budget=sm_budget, strict=strict, batch_table=bt,
                  on_priced=priced.append, on_rejects=rejects.append)
    eng._emit_rejects(bt_rej)
    parts = [eng.coerce(raw, 0) for raw in src.chunks()]
    eng.price(Rows.concat(parts) if parts else Rows.empty())
    eng.finish()
    counts = eng.counts
    counts.seconds = time.perf_counter() - t0
    counts.check()
    table = pa.concat_tables(priced) if priced else PRICED_SCHEMA.empty_table()
    rtable = pa.concat_tables(rejects) if rejects else REJECT_SCHEMA.empty_table()
    rframe = pl.from_arrow(rtable)
    assert isinstance(rframe, pl.DataFrame)
    rframe = rframe.sort("source", "row", descending=[True, False])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return PricedResult(frame, rframe, counts)


def price(k: Kernel | ResolvedPool, trace: Any, *, decode_threshold: int = 1,
          sm_budget: int = 0, columns: Mapping[str, str] | None = None, batches: Any = None,
          strict: bool = False) -> pl.DataFrame:
    """One row per batch: batch_id, overlap_ns, no_overlap_ns, bottleneck, <resource>_ns,
    tokens, requests, prefill_requests, decode_requests — equal to ``k.step_time`` per batch.

    Bad rows are set aside (see :func:`price_result` to get them); ``strict`` raises instead.
    """
    return price_result(k, trace, decode_threshold=decode_threshold, sm_budget=sm_budget,
                        columns=columns, batches=batches, strict=strict).priced


# -- streaming ----------------------------------------------------------------------------------

class _NotContiguous(Exception):
    pass


class _Sink:
    """A parquet (or CSV) file written incrementally to a temporary name, then renamed.

    Writes happen on a background thread (Arrow releases the GIL while encoding), with at
    most ``depth`` tables queued, so encoding overlaps pricing on a second core.
    """

    def __init__(self, path: Path, schema: pa.Schema, *, compression: str = "lz4",
                 depth: int = 2):
        self.path = path
        self.tmp = safe_output.temp_name(path)  # removed on SIGINT/SIGTERM too
        self.schema = schema
        self.csv = path.suffix.lower() == ".csv"
        self.compression = compression
        self.w: Any = None
        self.q: queue.Queue[pa.Table | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.csv:
            import pyarrow.csv as pcsv
            self.w = pcsv.CSVWriter(str(self.tmp), self.schema)
        else:
            dict_cols = [f.name for f in self.schema if pa.types.is_string(f.type)]
            self.w = pq.ParquetWriter(str(self.tmp), self.schema, compression=self.compression,
                                      use_dictionary=dict_cols)

    def _loop(self) -> None:
        while True:
            t = self.q.get()
            if t is None:
                return
            if self.error is None:
                try:
                    self.w.write_table(t)
                except BaseException as e:  # reported on the caller's thread
                    self.error = e

    def write(self, t: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        if self.thread is None:
            self._open()
            self.thread = threading.Thread(target=self._loop, name="blis-sink", daemon=True)
            self.thread.start()
        self.q.put(t)

    def _drain(self) -> None:
        if self.thread is not None:
            self.q.put(None)
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        if self.w is None:
            self._open()
            w: Any = self.w
            w.write_table(self.schema.empty_table())
        self._drain()
        self.w.close()
        if self.error is not None:
            safe_output.discard(self.tmp)
            raise self.error
        safe_output.commit(self.tmp, self.path)

    def abort(self) -> None:
        self._drain()
        if self.w is not None:
            self.w.close()
            self.w = None
        safe_output.discard(self.tmp)


def _prefetch(it: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Run ``it`` on a background thread, ``depth`` items ahead (Arrow decodes without the
    GIL, so reading overlaps pricing)."""
    q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for x in it:
                if stop.is_set():
                    return
                q.put((0, x))
            q.put((1, None))
        except BaseException as e:
            q.put((2, e))

    th = threading.Thread(target=run, name="blis-read", daemon=True)
    th.start()
    try:
        while True:
            kind, x = q.get()
            if kind == 1:
                return
            if kind == 2:
                raise x
            yield x
    finally:
        stop.set()
        while th.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        th.join()


def _progress(total: int | None, enabled: bool) -> Any:
    if not (enabled and sys.stdout.isatty()):
        return None
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    prog = Progress(TextColumn("pricing"), BarColumn(), TaskProgressColumn(),
                    TextColumn("{task.completed:,.0f} rows  {task.fields[rate]} rows/s"),
                    TimeElapsedColumn(), transient=False)
    prog.start()
    prog.add_task("price", total=total, rate="-")
    return prog


_MALLOC_TUNED = False


def _tune_malloc() -> None:
    """Keep glibc from handing every freed chunk-sized array back to the kernel.

    Streaming allocates and frees arrays of a few MiB per chunk; by default glibc serves
    each from a fresh mmap, so every chunk pays page faults for all its memory (measured:
    ~5x slower allocation-heavy numpy). Raising the mmap and trim thresholds lets freed
    chunks be reused from the heap. Process-wide and idempotent; Linux/glibc only; set
    ``BLIS_KEEP_MALLOC=1`` to leave malloc alone.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or not sys.platform.startswith("linux") or os.environ.get(
            "BLIS_KEEP_MALLOC"):
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: 32 MiB (glibc's maximum)
        libc.mallopt(-1, 512 << 20)  # M_TRIM_THRESHOLD: keep up to 512 MiB of free heap
    except (OSError, AttributeError):
        pass


def price_file(k: Kernel | ResolvedPool, src: Any, dst: str | Path, *,
               rejects: str | Path | None = None, strict: bool = False,
               chunk_rows: int = 1 << 20, progress: bool = True, decode_threshold: int = 1,
               sm_budget: int = 0, columns: Mapping[str, str] | None = None,
               batches: Any = None, tmp_dir: str | Path | None = None) -> PriceCounts:
    """Stream ``src`` (a trace file or table of any size) into parquet at ``dst``.

    Memory stays bounded by ``chunk_rows`` (plus the largest batch, and the per-batch table if
    given). While batch ids increase from batch to batch the tail batch of each chunk is
    carried into the next, so a batch split across chunks is priced whole, and output rows
    are in trace order. On the first batch id that is not larger than the one before it, the
    run restarts in partitioned mode: rows are hash-partitioned by batch id into temporary
    Arrow files and priced bucket by bucket (output ordered by bucket, then first row).
    ``rejects`` (parquet, or CSV by suffix) receives the rejected rows; ``strict`` raises
    :class:`RejectedRowError` at the first one. Returns the counts
    (``rows_in == rows_priced + rows_rejected``).
    """
    t0 = time.perf_counter()
    _tune_malloc()
    r = _resolved(k)
    dst = Path(dst)
    try:
        counts = _stream(r, src, dst, rejects, strict, chunk_rows, progress, decode_threshold,
                         sm_budget, columns, batches, tmp_dir, partitioned=False)
    except _NotContiguous:
        counts = _stream(r, src, dst, rejects, strict, chunk_rows, progress, decode_threshold,
                         sm_budget, columns, batches, tmp_dir, partitioned=True)
    counts.seconds = time.perf_counter() - t0
    counts.check()
    return counts


def _stream(r: ResolvedPool, src: Any, dst: Path, rejects: str | Path | None, strict: bool,
            chunk_rows: int, progress: bool, decode_threshold: int, sm_budget: int,
            columns: Mapping[str, str] | None, batches: Any, tmp_dir: str | Path | None,
            *, partitioned: bool) -> PriceCounts:
    ts = open_trace(src, columns=columns, chunk_rows=chunk_rows)
    out = _Sink(dst, PRICED_SCHEMA)
    rej_sink = _Sink(Path(rejects), REJECT_SCHEMA) if rejects is not None else None
    bt_rej: list[pa.Table] = []
    bt = (_BatchTable(batches, columns, bt_rej, strict, decode_threshold, sm_budget)
          if batches is not None else None)
    eng = _Engine(r, ts.names, decode_threshold=decode_threshold, sm_budget=sm_budget,
                  strict=strict, batch_table=bt, on_priced=out.write,
                  on_rejects=(rej_sink.write if rej_sink is not None else lambda t: None))
    prog = _progress(ts.num_rows, progress)
    t0 = time.perf_counter()

    def tick() -> None:
        if prog is not None:
            el = max(time.perf_counter() - t0, 1e-9)
            prog.update(prog.task_ids[0], completed=eng.counts.rows_in,
                        rate=f"{eng.counts.rows_in / el:,.0f}")

    try:
        eng._emit_rejects(bt_rej)
        if partitioned:
            _run_partitioned(eng, ts, chunk_rows, tmp_dir or dst.parent, tick)
            eng.counts.mode = "partitioned"
        else:
            _run_contiguous(eng, ts, tick)
            eng.counts.mode = "contiguous"
        eng.finish()
        out.close()
        if rej_sink is not None:
            rej_sink.close()
    except BaseException:
        out.abort()
        if rej_sink is not None:
            rej_sink.abort()
        raise
    finally:
        if prog is not None:
            tick()
            prog.stop()
    return eng.counts


def _coerced_chunks(eng: _Engine, ts: Any) -> Iterator[Rows]:
    """The trace's chunks, read ahead on a thread, validated, empty ones dropped."""
    offset = 0
    for raw in _prefetch(ts.chunks()):
        rows = eng.coerce(raw, offset)
        offset += raw.num_rows
        if len(rows):
            yield rows


def _run_contiguous(eng: _Engine, ts: Any, tick: Callable[[], None]) -> None:
    """Price chunk by chunk while batch ids increase; the last batch of each chunk is carried
    into the next (completed there with the next chunk's first run, without copying the
    chunk)."""
    carry = Rows.empty()
    last: int | None = None  # the largest batch id seen (the carried batch's, if any)
    for rows in _coerced_chunks(eng, ts):
        starts = _runs(rows.batch_id)
        run_ids = rows.batch_id[starts]
        if run_ids.size > 1 and not bool(np.all(run_ids[1:] > run_ids[:-1])):
            raise _NotContiguous
        first = 0
        if last is not None:
            if len(carry) and run_ids[0] == last:  # the carried batch goes on
                if starts.size == 1:
                    carry = Rows.concat([carry, rows])
                    tick()
                    continue
                eng.price(Rows.concat([carry, rows.slice(0, int(starts[1]))]))
                carry = Rows.empty()
                first = 1
            elif run_ids[0] <= last:
                raise _NotContiguous
        if len(carry):
            eng.price(carry)
        tail = int(starts[-1])
        if starts.size - 1 > first:
            lo = int(starts[first])
            eng.price(rows.slice(lo, tail), starts[first:-1] - lo)
        carry = rows.slice(tail, len(rows)) if tail else rows
        if tail:  # copy, so the chunk's memory can go
            carry = carry.take(np.arange(len(carry)))
        last = int(run_ids[-1])
        tick()
    eng.price(carry)
    tick()


def _bucket_of(ids: np.ndarray, nbuckets: int) -> np.ndarray:
    h = ids.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((h >> np.uint64(33)) % np.uint64(nbuckets)).astype(np.int64)


def _run_partitioned(eng: _Engine, ts: Any, chunk_rows: int, tmp_parent: str | Path,
                     tick: Callable[[], None]) -> None:
    total = ts.num_rows
    nb = 64 if total is None else max(1, min(256, -(-total // max(chunk_rows, 1))))
    with safe_output.temp_dir(tmp_parent, ".blis-price-") as tmp:
        _partition_and_price(eng, ts, nb, tmp, tick)


def _partition_and_price(eng: _Engine, ts: Any, nb: int, tmp: Path,
                         tick: Callable[[], None]) -> None:
    writers: list[Any] = [None] * nb
    try:
        for rows in _coerced_chunks(eng, ts):
            b = _bucket_of(rows.batch_id, nb).astype(np.uint8 if nb <= 256 else np.uint16)
            order = np.argsort(b, kind="stable")  # a radix sort for 8/16-bit keys
            bs = b[order]
            cuts = np.flatnonzero(bs[1:] != bs[:-1]) + 1
            table = rows.take(order).to_arrow()
            for lo, hi in zip(np.concatenate(([0], cuts)), np.append(cuts, bs.size),
                              strict=True):
                k = int(bs[lo])
                if writers[k] is None:
                    writers[k] = pa.ipc.new_file(str(tmp / f"{k}.arrow"), table.schema)
                writers[k].write_table(table.slice(int(lo), int(hi - lo)))
            tick()
        for w in writers:
            if w is not None:
                w.close()
        for k in range(nb):
            path = tmp / f"{k}.arrow"
            if not path.exists():
                continue
            with pa.memory_map(str(path)) as mm:
                t = pa.ipc.open_file(mm).read_all()
            rows = Rows.from_arrow(t)
            del t
            # Input order inside a bucket is kept (chunks were appended in order).
            eng.price(rows)
            path.unlink()
            tick()
    finally:
        for w in writers:
            if w is not None:
                try:
                    w.close()
                except Exception:
                    pass
