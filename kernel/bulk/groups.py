"""Grouping request rows by batch, and the checks that reject whole batches.

Rows arrive validated one by one (:func:`kernel.io.trace.coerce`); here they are arranged so each
batch's requests are contiguous and in input order (:func:`group`), and batches that cannot
be priced whole are set aside with their reason (:func:`batch_checks`).

Pricing itself does not need the rows moved: every per-batch reduction of the walk is a sum,
a count or a maximum keyed by a dense batch index, accumulated in row order, so rows of whole
batches in input order price the same as grouped ones (:func:`groups_in_range`,
``Groups.grouped`` false). Only per-batch slices (rejects, producers reading ``ctx.rows``)
want them contiguous (:func:`regroup`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..io.trace import (
    BATCH_REJECTED,
    CONFLICT,
    INT64_MAX,
    OVERFLOW,
    ZERO_TOKENS,
    Rows,
    all_distinct,
    record_rejects,
    reject_table,
    row_values,
)

__all__ = ["Groups", "batch_checks", "group", "groups_from_starts", "groups_in_range",
           "groups_of_grouped", "regroup", "runs", "sums_fit"]


@dataclass
class Groups:
    """The batches of a set of rows: ``inv`` maps each row to its batch (0..n-1).

    ``grouped``: each batch's rows are contiguous, batch ``b`` from ``starts[b]`` to the next
    start. Otherwise rows may be in any order, ``counts`` holds each batch's rows, and
    ``starts`` each batch's first row (computed when first asked for)."""

    starts_: np.ndarray | None  # first row of each batch (None: not computed yet)
    ids: np.ndarray  # batch id of each batch
    inv: np.ndarray  # dense batch index of each row
    grouped: bool = True
    counts_: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.ids.size)

    @property
    def starts(self) -> np.ndarray:
        """The first row of each batch (where its run starts, when grouped)."""
        if self.starts_ is None:
            first = np.full(self.n, self.inv.size, np.int64)
            np.minimum.at(first, self.inv, np.arange(self.inv.size, dtype=np.int64))
            self.starts_ = first
        return self.starts_

    @property
    def counts(self) -> np.ndarray:
        """Rows of each batch (int64)."""
        if self.counts_ is None:
            self.counts_ = (np.diff(np.append(self.starts, self.inv.size)) if self.grouped
                            else np.bincount(self.inv, minlength=self.n))
        return self.counts_

    def sum(self, v: np.ndarray) -> np.ndarray:
        """Exact int64 per-batch sums of a per-row integer column."""
        return self._reduce(np.add, v, 0)

    def max(self, v: np.ndarray) -> np.ndarray:
        """Per-batch maxima of a per-row integer column (int64)."""
        return self._reduce(np.maximum, v, np.iinfo(np.int64).min)

    def _reduce(self, ufunc: np.ufunc, v: np.ndarray, identity: int) -> np.ndarray:
        v = v.astype(np.int64, copy=False)
        if self.n == 0:
            return np.zeros(0, np.int64)
        if self.grouped:
            return ufunc.reduceat(v, self.starts)
        out = np.full(self.n, identity, np.int64)
        ufunc.at(out, self.inv, v)
        return out


def runs(ids: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.zeros(0, np.int64)
    brk = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return np.concatenate(([0], brk)).astype(np.int64)


def groups_of_grouped(ids: np.ndarray) -> Groups:
    starts = runs(ids)
    inv = np.zeros(ids.size, np.int64)
    if starts.size > 1:
        inv[starts[1:]] = 1
        np.cumsum(inv, out=inv)
    return Groups(starts, ids[starts], inv)


def groups_from_starts(ids: np.ndarray, starts: np.ndarray) -> Groups:
    inv = np.zeros(ids.size, np.int64)
    if starts.size > 1:
        inv[starts[1:]] = 1
        np.cumsum(inv, out=inv)
    return Groups(starts, ids[starts], inv)


def groups_in_range(ids: np.ndarray, lo: int, span: int) -> Groups:
    """The batches of rows in any order whose ids lie in ``[lo, lo + span)`` (``span`` small:
    a histogram of that many entries), batches in id order; rows are not moved."""
    key = ids - np.int64(lo)
    counts = np.bincount(key, minlength=span)
    present = np.flatnonzero(counts)
    if present.size < span:  # ids with no row: renumber the batches densely
        dense = np.cumsum(counts > 0) - 1
        key = dense[key]
        counts = counts[present]
    return Groups(None, present + np.int64(lo), key, grouped=False, counts_=counts)


def regroup(rows: Rows, g: Groups) -> tuple[Rows, Groups]:
    """Rows in any order and their batches, made contiguous (stably: input order within a
    batch, batches in ``g``'s order)."""
    if g.grouped:
        return rows, g
    order = np.argsort(g.inv, kind="stable")
    starts = np.zeros(g.n, np.int64)
    np.cumsum(g.counts[:-1], out=starts[1:])
    return rows.take(order), Groups(starts, g.ids, g.inv[order], counts_=g.counts)


def sums_fit(scheduled: np.ndarray, computed: np.ndarray, longest: int) -> bool:
    """Whether every per-batch sum of scheduled + computed surely fits int64 (batches of at
    most ``longest`` rows); when not, :func:`batch_checks` checks batch by batch."""
    if scheduled.size == 0:
        return True
    return (int(scheduled.max()) + int(computed.max())) * longest < 2**62


def group(rows: Rows) -> tuple[Rows, Groups]:
    """Rows reordered (stably) so each batch is contiguous, batches in first-seen order."""
    ids = rows.batch_id
    starts = runs(ids)
    run_ids = ids[starts]
    if run_ids.size <= 1 or bool(np.all(run_ids[1:] > run_ids[:-1])) or \
            all_distinct(run_ids):
        return rows, groups_of_grouped(ids)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    order = np.argsort(rank[inv], kind="stable")
    rows = rows.take(order)
    return rows, groups_of_grouped(rows.batch_id)


# -- whole-batch checks -----------------------------------------------------------------------

def batch_checks(rows: Rows, g: Groups, inline_batch_cols: tuple[str, ...],
                  rejects: list[pa.Table] | None, strict: bool) -> tuple[Rows, Groups]:
    """Reject whole batches: a rejected row, an int64 sum overflow, a per-batch conflict, no
    token scheduled."""
    nb = g.n
    reason = np.zeros(nb, np.int8)  # 1 sibling rejected, 2 overflow, 3 conflict, 4 no token
    detail: dict[int, str] = {}
    column: dict[int, str] = {}
    if rows.bad.any():
        badb = np.unique(g.inv[rows.bad])
        reason[badb] = 1
    good = ~rows.bad
    any_bad = bool(rows.bad.any())
    s = np.where(good, rows.scheduled, 0) if any_bad else rows.scheduled
    c = np.where(good, rows.computed, 0) if any_bad else rows.computed
    longest = int(g.counts.max()) if nb else 0
    if nb and not sums_fit(s, c, longest):
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
    if nb and not s.all():  # (only a batch with a zero row can schedule nothing)
        empty = (np.maximum.reduceat(s, g.starts) == 0) & (reason == 0)
        for b in np.flatnonzero(empty):
            column[int(b)] = "scheduled"
            detail[int(b)] = "the batch schedules no token (scheduled is 0 on every row)"
        reason[empty] = 4
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
        reasons = [(BATCH_REJECTED, OVERFLOW, CONFLICT, ZERO_TOKENS)[int(reason[b]) - 1]
                   for b in rb]
        details = [f"row {first_bad[int(b)]} of this batch was rejected" if reason[b] == 1
                   else detail[int(b)] for b in rb]
        cols = ["" if reason[b] == 1 else column[int(b)] for b in rb]
        sub = rows.take(sib)
        record_rejects(reject_table(sub.row, sub.batch_id, reasons, cols, details,
                                    row_values(sub)), rejects, strict)
    keep = np.flatnonzero(~rej_row)
    rows = rows.take(keep)
    return rows, groups_of_grouped(rows.batch_id)

