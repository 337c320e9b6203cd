"""Pricing a trace in no known order as it streams by: per-batch sums over the batch id range.

The walk needs of a batch's rows only sums (and maxima) taken in request order
(:class:`kernel.bulk.walk.RowSums`), and the float sums accumulate one row at a time. So when
the trace's batch ids span a range known before reading (parquet statistics) and small enough
to hold a few numbers per id, every chunk's per-row terms are computed on the pool as it is
read and added, chunk after chunk in trace order, into sums indexed by ``batch_id - lo``. No
row is moved and nothing waits for the last chunk but the per-batch step (compose and the
priced table), which then runs on the pool in pieces of whole batches, ids increasing.

This is mode ``summed``. It pays when consecutive rows mostly fall on nearby ids (a
request-major log), so that adding them row after row stays in cache (:func:`rows_stay_near`,
decided on the first chunk); rows spread over the whole range are grouped instead. It
applies only when nothing needs the rows of a batch side by side: no
per-batch column in the trace or beside it, no kept column, no producer that reads rows, no
over-limit rejection. No row is kept (each would be a fresh page to fault in: decision
RO16). Should the sums not stand — a rejected row, or per-batch sums that might not fit
int64, known only at the end — the chunks summed so far are read and validated again (not
counted twice) and the run goes on grouping them with the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..io.trace import Rows
from ..model import step
from .columns import RowTotal, priced_table
from .engine import Engine, Priced, piece_bounds
from .walk import INT_SUMS, RowSums, RowTerms, float_sums, row_terms

if TYPE_CHECKING:
    from ..io.sources import TraceSource

__all__ = ["NEAR_IDS", "Summed", "rows_stay_near", "summed_for"]

@dataclass
class ChunkTerms:
    """What one validated chunk adds: the walk's per-row terms, and each row total's value
    per row (keyed like the walk's terms by ``key``, the batch index of each row)."""

    walk: RowTerms | None = None
    key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    totals: dict[str, np.ndarray] = field(default_factory=dict)
    largest: int = 0  # the largest scheduled + computed of a row
    failed: bool = False  # a rejected row, or an id outside the range: sums cannot stand


class Summed:
    """Per-batch sums of every row so far, over the ids ``[lo, lo + span)``."""

    def __init__(self, eng: Engine, lo: int, span: int):
        self.eng = eng
        self.lo = lo
        self.p = step.prepared(eng.r)
        self.threshold = eng.defaults["decode_threshold"]
        self.row_totals: tuple[RowTotal, ...] = eng.spec.row_totals
        self.sums = RowSums.zeros(self.p, span)
        self.totals = {rt.name: np.zeros(span, np.int64) if rt.kind == "sum"
                       else np.full(span, np.iinfo(np.int64).min, np.int64)
                       for rt in self.row_totals}
        self.ufunc = {rt.name: np.add if rt.kind == "sum" else np.maximum
                      for rt in self.row_totals}
        self.largest = 0
        self.ok = True

    def nbytes(self) -> int:
        return self.sums.nbytes() + sum(v.nbytes for v in self.totals.values())

    def abandon(self) -> None:
        """Give up the sums (the run goes another way): free them, compute no more terms."""
        self.ok = False
        self.sums = RowSums.zeros(self.p, 0)
        self.totals = {}

    def terms(self, rows: Rows) -> ChunkTerms:
        """A chunk's terms (pure: runs on the pool); none once the sums cannot stand."""
        if len(rows) == 0 or not self.ok:
            return ChunkTerms()
        key = rows.batch_id - np.int64(self.lo)
        if rows.bad.any() or int(key.min()) < 0 or int(key.max()) >= self.sums.n:
            return ChunkTerms(failed=True)
        s = rows.scheduled.astype(np.int64, copy=False)
        c = rows.computed.astype(np.int64, copy=False)
        return ChunkTerms(row_terms(self.p, key, s, c, self.threshold), key,
                          {rt.name: rt.per_row(self.eng.r, s, c) for rt in self.row_totals},
                          int((s + c).max()))

    def add(self, t: ChunkTerms) -> None:
        """Add a chunk's terms, chunks in trace order (calling thread)."""
        self.ok = self.ok and not t.failed
        if not self.ok or t.walk is None:
            return
        self.sums.add(t.walk)
        for name, v in t.totals.items():
            self.ufunc[name].at(self.totals[name], t.key, v)
        self.largest = max(self.largest, t.largest)

    def complete(self) -> bool:
        """Whether the sums stand: no chunk failed, and every per-batch sum surely fits
        int64 (a batch's rows times the largest row; else the grouping path checks it)."""
        requests = self.sums.sums["requests"]
        longest = int(requests.max()) if requests.size else 0
        return self.ok and self.largest * longest < 2**62

    def units(self) -> Iterator[Callable[[], Priced]]:
        """The pricing of every batch with rows, in pieces of about PRICE_ROWS rows (ids
        increasing): one callable per piece, for the pool."""
        requests = self.sums.sums["requests"]
        present = np.flatnonzero(requests)
        if present.size == 0:
            return
        counts = requests[present]
        upto = np.cumsum(counts)
        bounds = piece_bounds(upto - counts, int(upto[-1]))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            yield partial(self._price, present[a:b])

    def _price(self, keep: np.ndarray) -> Priced:
        sums = self.sums.select(keep)
        nb = keep.size
        summary = sums.summary(self.p, np.full(nb, self.eng.defaults["sm_budget"], np.int64))
        totals = {name: v[keep] for name, v in self.totals.items()}
        out = priced_table(self.eng.r, keep + np.int64(self.lo), summary, self.eng.spec, totals)
        return Priced(out, [], int(sums.sums["requests"].sum()), nb)


NEAR_IDS = 64  # consecutive rows this close in batch id add into the same few cache lines


def rows_stay_near(chunk: pa.Table) -> bool:
    """Whether most consecutive rows of a (raw) chunk fall on nearby batch ids — a log
    written request by request, batches interleaved a few at a time — so that adding row
    after row into per-batch sums stays in cache. Rows spread over the whole id range
    (shuffled) are grouped instead (:mod:`kernel.bulk.partition`): that moves them, but
    every pass of it is cache-friendly."""
    col = chunk.column("batch_id")
    if len(col) < 2 or not pa.types.is_integer(col.type):
        return True
    ids = pc.fill_null(col, 0).to_numpy().astype(np.float64)
    return bool(np.mean(np.abs(np.diff(ids)) <= NEAR_IDS) >= 0.5)


def summed_for(eng: Engine, ts: TraceSource, budget: int) -> Summed | None:
    """A :class:`Summed` for this run when it applies (module docstring), else None."""
    if ts.id_ranges is None or not ts.id_ranges or ts.num_rows is None:
        return None
    if eng.inline or eng.bt is not None or eng.over_limit is not None or eng.spec.needs_rows:
        return None
    lo = min(r[0] for r in ts.id_ranges)
    span = max(r[1] for r in ts.id_ranges) - lo + 1
    # the sums beside the rows within the budget, and ids not much sparser than the rows
    per_id = 8 * (len(INT_SUMS) + len(float_sums(step.prepared(eng.r)))
                  + len(eng.spec.row_totals))
    if span * per_id > budget // 2 or span > 4 * max(ts.num_rows, 1 << 16):
        return None
    return Summed(eng, lo, span)
