"""The vectorised walk: :func:`kernel.model.step.summarise` and :func:`kernel.model.step.finish` on columns.

:func:`summarise_columns` evaluates the per-request laws of :mod:`kernel.model.laws` on whole columns
of rows and reduces them per batch into a :class:`kernel.model.step.BatchSummary` of arrays, in two
steps: :func:`row_terms` (the laws on every row; pure, so it runs on any thread) and
:class:`RowSums` (their per-batch sums: integers exact in int64, floats accumulated one row
at a time in row order with ``np.add.at``, exactly as the scalar walk does). So a batch's rows
need not be contiguous, only in request order among themselves, and may arrive in several
pieces: a trace in no known order is summed as it streams by. :func:`kernel.model.step.compose`
then runs unchanged on the array summary, and :func:`finish_columns` is ``step.finish`` on
arrays. The numbers equal ``Kernel.step_time``'s bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model import laws, step
from ..model.types import MAX_DURATION_NS, RESOURCES
from .groups import Groups

if TYPE_CHECKING:
    from ..model.resolved import ResolvedPool

__all__ = ["INT_SUMS", "RESOURCE_NAMES", "RowSums", "RowTerms", "finish_columns", "float_sums",
           "row_terms", "summarise_columns"]

RESOURCE_NAMES = tuple(r.value for r in RESOURCES)  # sm, hbm, nvlink, nic, host


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


# -- the walk in two steps: per-row terms, then per-batch sums --------------------------------

# Integer sums per batch (exact in int64, order-free): requests, Σ scheduled, Σ computed,
# requests breaking a uniform decode, with no context, skipped (ctx 0), prefills, Σ scheduled
# and Σ computed over prefills, Σ rank-local prefill tokens, Σ tokens other PCP ranks hold.
INT_SUMS = ("requests", "tokens", "computed", "odd", "no_ctx", "dead", "prefills",
            "prefill_scheduled", "prefill_computed", "prefill_local", "withheld")


def float_sums(p: step._Prepared) -> tuple[str, ...]:
    """The float sums per batch, each accumulated in row order: Σ causal pairs of prefills,
    per window Σ windowed pairs (before the factor 4), per decode-read signature Σ reads."""
    return ("causal", *(f"windowed.{i}" for i in range(len(p.windows))),
            *(f"reads.{i}" for i in range(len(p.decode_sigs))))


@dataclass
class RowTerms:
    """What a set of rows adds to the per-batch sums: for each sum, the batch index of each
    contributing row and its value (None: 1 per row), rows in input order; and the prefill
    rows, for the context-gather runs. Computing them is the costly part of the walk and
    touches no shared state."""

    adds: list[tuple[str, np.ndarray, np.ndarray | None]]
    prefill: tuple[np.ndarray, np.ndarray, np.ndarray]  # (batch, scheduled, computed)


@dataclass
class RowSums:
    """Per-batch sums of the walk's per-row terms (:data:`INT_SUMS`, :func:`float_sums`),
    one entry per batch.

    Float sums are accumulated one row at a time in the order rows are added
    (``np.add.at``), as the scalar walk does, so adding a batch's rows in request order, in
    one piece or many, gives the same sums bit for bit."""

    sums: dict[str, np.ndarray]
    prefill: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    @staticmethod
    def zeros(p: step._Prepared, nb: int) -> RowSums:
        return RowSums({**{k: np.zeros(nb, np.int64) for k in INT_SUMS},
                        **{k: np.zeros(nb) for k in float_sums(p)}})

    @property
    def n(self) -> int:
        return int(self.sums["requests"].size)

    def nbytes(self) -> int:
        return (sum(a.nbytes for a in self.sums.values())
                + sum(x.nbytes for b in self.prefill for x in b))

    @staticmethod
    def of(p: step._Prepared, g: Groups, t: RowTerms) -> RowSums:
        """The sums of ``t``'s rows (batches ``g``) alone: ``zeros(p, g.n).add(t)``, with
        ``np.bincount`` (which adds in row order as ``np.add.at`` does, and releases the GIL)
        and, for integer terms of every row, ``g``'s counts and exact sums."""
        nb = g.n
        out = RowSums.zeros(p, nb)
        for name, idx, v in t.adds:
            acc = out.sums[name]
            if idx is g.inv and acc.dtype.kind == "i":  # (every row: g knows its counts)
                acc += g.counts if v is None else g.sum(v)
            elif v is None:
                acc += np.bincount(idx, minlength=nb)
            elif acc.dtype.kind == "f":
                acc += np.bincount(idx, weights=v, minlength=nb)
            else:
                np.add.at(acc, idx, v)
        out.add_prefill(t)
        return out

    def add(self, t: RowTerms) -> RowSums:
        """Add ``t``'s rows (after every row added before); in place."""
        for name, idx, v in t.adds:
            np.add.at(self.sums[name], idx, 1 if v is None else v)
        self.add_prefill(t)
        return self

    def add_prefill(self, t: RowTerms) -> None:
        if t.prefill[0].size:
            self.prefill.append(t.prefill)

    def select(self, keep: np.ndarray) -> RowSums:
        """The sums of batches ``keep`` (increasing indices), renumbered 0..len(keep)-1."""
        out = RowSums({k: v[keep] for k, v in self.sums.items()})
        for b, s, c in self.prefill:
            at = np.searchsorted(keep, b)
            hit = (at < keep.size) & (keep[np.minimum(at, keep.size - 1)] == b)
            if hit.any():
                out.prefill.append((at[hit], s[hit], c[hit]))
        return out

    def summary(self, p: step._Prepared, sm_budget: np.ndarray) -> step.BatchSummary:
        """step.summarise's result for every batch, from the sums."""
        i = self.sums
        nb = self.n
        n_live = i["requests"] - i["dead"]
        pre_s = i["prefill_scheduled"]
        if p.pcp > 1:
            pre_tok, withheld = i["prefill_local"], i["withheld"]
        else:
            pre_tok, withheld = pre_s, np.zeros(nb, np.int64)
        if p.ctx_runs and self.prefill:
            b, s, c = (np.concatenate(x) for x in zip(*self.prefill, strict=True))
            runs_ = _context_runs(b, s, c, nb)
        else:
            runs_ = np.zeros((nb, 0), np.int64)
        return step.BatchSummary(
            i["requests"], i["tokens"], withheld, i["prefills"], n_live - i["prefills"],
            i["tokens"] - pre_s, i["tokens"] + i["computed"] - pre_s - i["prefill_computed"],
            pre_tok, i["causal"], i["no_ctx"] < i["requests"], i["odd"] == 0,
            sm_budget.astype(np.int64, copy=False),
            tuple(i[f"reads.{k}"] for k in range(len(p.decode_sigs))),
            tuple(4 * i[f"windowed.{k}"] for k in range(len(p.windows))), runs_)


def row_terms(p: step._Prepared, inv: np.ndarray, scheduled: np.ndarray, computed: np.ndarray,
              threshold: np.ndarray | int) -> RowTerms:
    """The per-row terms of step.summarise for validated rows (``scheduled``, ``computed``
    >= 0, so a request is skipped exactly when both are 0); ``inv``: each row's batch index;
    ``threshold``: per batch (indexed by ``inv``) or one int for all."""
    s = scheduled.astype(np.int64, copy=False)
    c = computed.astype(np.int64, copy=False)
    # Index lists of the (usually few) rows that are not plain decodes with context.
    width = p.uniform_width
    odd = np.flatnonzero(s != width)  # rows breaking a uniform decode
    no_ctx = np.flatnonzero(c == 0)
    dead = no_ctx[s[no_ctx] == 0]  # ctx == 0: skipped by the walk
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
    ps, pc_, pinv = s[pi], c[pi], inv[pi]
    adds: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        ("requests", inv, None), ("tokens", inv, s), ("computed", inv, c),
        ("odd", inv[odd], None), ("no_ctx", inv[no_ctx], None), ("dead", inv[dead], None),
        ("prefills", pinv, None), ("prefill_scheduled", pinv, ps),
        ("prefill_computed", pinv, pc_)]
    # Prefill rows.
    pcp, dcp, inter = p.pcp, p.dcp, p.interleave
    pairs = laws.causal_pairs(ps, pc_)
    chunks = [(ps, pc_)]
    if pcp > 1:
        local = ps
        if pi.size:
            loc = laws.pcp_local_tokens(ps, pcp, dcp)
            has = loc >= 0
            local = np.where(has, loc, ps)
            pairs = np.where(has, laws.pcp_causal_pairs(ps, pc_, pcp, dcp), pairs)
            chunks = _busiest_chunks(ps, pc_, pcp, dcp)
        adds += [("prefill_local", pinv, local), ("withheld", pinv, ps - local)]
    adds.append(("causal", pinv, np.asarray(pairs, np.float64)))
    for k, w in enumerate(p.windows):
        if len(chunks) == 1:
            adds.append((f"windowed.{k}", pinv,
                         laws.windowed_pairs_for_chunk(chunks[0][0], chunks[0][1], w)))
        else:  # interleave each request's two chunks, in order
            t0 = laws.windowed_pairs_for_chunk(chunks[0][0], chunks[0][1], w)
            t1 = laws.windowed_pairs_for_chunk(chunks[1][0], chunks[1][1], w)
            both = np.empty(2 * t0.size)
            both[0::2], both[1::2] = t0, t1
            adds.append((f"windowed.{k}", np.repeat(pinv, 2), both))
    # Decode rows: per-signature reads, summed in request order.
    if p.decode_sigs:
        is_dec = np.ones(s.size, bool)
        is_dec[pi] = False
        is_dec[dead] = False
        di = np.flatnonzero(is_dec)
        dctx, dinv = s[di] + c[di], inv[di]
        for k, (topk, ratio, shards) in enumerate(p.decode_sigs):
            per = laws.dcp_decode_tokens_one(dctx, topk, ratio, dcp, inter, shards)
            adds.append((f"reads.{k}", dinv, np.asarray(per, np.float64)))
    prefill = (pinv, ps, pc_) if p.ctx_runs else (pinv[:0], ps[:0], pc_[:0])
    return RowTerms(adds, prefill)


def summarise_columns(r: ResolvedPool, g: Groups, scheduled: np.ndarray, computed: np.ndarray,
                      threshold: np.ndarray | int, sm_budget: np.ndarray) -> step.BatchSummary:
    """step.summarise for every batch at once.

    Rows are in request order within each batch (``g``: grouped or not), and validated;
    ``threshold`` is per batch (or one int for all), ``sm_budget`` per batch.
    """
    p = step.prepared(r)
    terms = row_terms(p, g.inv, scheduled, computed, threshold)
    return RowSums.of(p, g, terms).summary(p, sm_budget)


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

