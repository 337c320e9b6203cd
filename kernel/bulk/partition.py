"""Grouping rows of any order in memory, without sorting them: a partition by batch id range.

Rows that arrive in any order (request-major logs, rows merged from several ranks, shuffled)
must be grouped by batch before pricing. A comparison sort of every row is not needed, only
whole batches side by side, batches in id order and each batch's rows in input order:

1. a histogram of the batch ids over at most :data:`CELLS` equal id ranges ("cells", a shift
   of ``id - lo``), one pass;
2. consecutive cells merged into pieces of about ``piece_rows`` rows (a lookup table
   cell → piece, small enough to stay in cache);
3. each chunk's rows scattered to their pieces by a stable counting sort on the piece number
   (compiled loops where numba is on, :mod:`kernel.bulk.row_loops`, decision SJ1; else
   Arrow's stable sort of 8/16-bit keys and takes), chunk by chunk on the pool, each
   chunk freed once scattered (reading a chunk's rows in order and writing ~100 streams is
   cache-friendly; gathering a piece from every chunk would not be);
4. each piece, when priced, taken from the scattered chunks in input order
   (:func:`gather_piece`) and priced where it lies: the walk keys each row by ``id - piece's
   first id`` and never needs a batch's rows contiguous (:mod:`kernel.bulk.groups`). Only
   when something does (a rejected row, a per-batch column, over-limit rejection) is the
   piece grouped (:func:`group_piece`), by a stable radix sort on that key (16-bit when the
   piece spans < 65,536 ids).

All of it is linear in the rows but the grouping fallback for a piece spanning more ids
(e.g. sparse 64-bit ids: a stable merge sort of that piece alone). Rows keep their input
order within a batch, so float sums accumulate exactly as for a sorted trace: the prices are
equal bit for bit. Columns are kept narrow (int32 where the values fit) while they wait
(:meth:`kernel.io.trace.Rows.narrowed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..io.trace import Rows, narrow_type
from ..model import jit
from . import row_loops

__all__ = ["CELLS", "Partition", "Scattered", "fits", "gather_piece", "group_piece", "plan",
           "plan_from_ranges", "scatter"]

CELLS = 1 << 16  # id ranges of the histogram (the lookup table: 64k entries)
# Scattered rows are allocated by malloc, as every other array is: where an application has
# tuned it (kernel.io.malloc), freed chunks are reused rather than faulted in again.
_POOL = pa.system_memory_pool()


@dataclass
class Partition:
    """Pieces of whole batches over the id range ``[lo, lo + (CELLS << shift))``."""

    lo: int
    hi: int  # the largest id planned for
    shift: int
    piece_of_cell: np.ndarray  # uint8 (up to 256 pieces) or uint16: the piece of each cell
    first_cell: np.ndarray  # int64: each piece's first cell (pieces in id order)

    @property
    def n(self) -> int:
        return int(self.first_cell.size)

    @property
    def local(self) -> bool:
        """Whether every piece spans at most 65,536 ids (ids then fit uint16 offsets)."""
        if self.shift > 16:
            return False
        spans = np.diff(np.append(self.first_cell, CELLS)) << self.shift
        spans[-1] = self.piece_span(self.n - 1)  # (the last piece ends at ``hi``)
        return bool(spans.max() <= 1 << 16)

    def first_ids(self) -> np.ndarray:
        """Each piece's smallest id (int64)."""
        return np.int64(self.lo) + (self.first_cell << self.shift)

    def cells(self, ids: np.ndarray) -> np.ndarray:
        return cells(ids, self.lo, self.shift)

    def piece_lo(self, k: int) -> int:
        """The smallest batch id piece ``k`` can hold."""
        return self.lo + (int(self.first_cell[k]) << self.shift)

    def piece_span(self, k: int) -> int:
        """How many batch ids piece ``k`` can hold (the last, up to ``hi``: a plan from
        statistics covers no id beyond it, and ids are checked against it before a scatter)."""
        if k + 1 < self.n:
            return (int(self.first_cell[k + 1]) - int(self.first_cell[k])) << self.shift
        return max(0, self.hi + 1 - self.piece_lo(k))


def id_range(ids: np.ndarray) -> tuple[int, int]:
    return (int(ids.min()), int(ids.max())) if ids.size else (0, 0)


def cell_shift(lo: int, hi: int) -> int:
    """The shift that maps ``hi - lo`` below :data:`CELLS`."""
    return max(0, (hi - lo).bit_length() - CELLS.bit_length() + 1)


def cells(ids: np.ndarray, lo: int, shift: int) -> np.ndarray:
    """The cell of each id (``lo <= ids < lo + (CELLS << shift)``)."""
    if shift < 47:  # id - lo < 2**63: int64 arithmetic, in place
        off = ids - np.int64(lo)
        off >>= shift
        return off
    # (ids spanning more than half the int64 range: unsigned arithmetic)
    u = ids.astype(np.uint64) - np.uint64(lo % (1 << 64))
    return (u >> np.uint64(shift)).astype(np.intp)


def histogram(ids: np.ndarray, lo: int, shift: int) -> np.ndarray:
    """Rows per cell (int64, CELLS long)."""
    return np.bincount(cells(ids, lo, shift), minlength=CELLS)


def plan(lo: int, shift: int, counts: np.ndarray, piece_rows: int) -> Partition:
    """Cells merged, in order, into pieces of about ``piece_rows`` rows (at most 65,535)."""
    total = int(counts.sum())
    n_pieces = int(min(max(1, -(-total // max(piece_rows, 1))), (1 << 16) - 1))
    cum = np.cumsum(counts)
    # piece of a cell: how many piece-sized steps the rows before it fill (monotone)
    before = cum - counts
    piece = (before * n_pieces // max(total, 1)).astype(np.int64)
    # renumber so only pieces that start somewhere count (no empty piece numbers)
    starts = np.flatnonzero(np.concatenate(([True], piece[1:] != piece[:-1])))
    dense = np.zeros(CELLS, np.int64)
    dense[starts[1:]] = 1
    np.cumsum(dense, out=dense)
    hi = lo + (CELLS << shift) - 1
    lut = dense.astype(np.uint8 if starts.size <= 256 else np.uint16)  # (small keys: a counting sort)
    return Partition(lo, hi, shift, lut, starts.astype(np.int64))


def plan_from_ranges(ranges: list[tuple[int, int, int]], piece_rows: int) -> Partition | None:
    """A plan before reading, from (min, max, rows) of the source's parts (parquet row-group
    statistics): each part's rows spread evenly over its id range — pieces come out about the
    right size when ids are not too lumpy, and a lumpy piece is only slower, never wrong."""
    if not ranges:
        return None
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    shift = cell_shift(lo, hi)
    diff = np.zeros(CELLS + 1)
    for a, b, n in ranges:
        c0, c1 = (a - lo) >> shift, (b - lo) >> shift
        diff[c0] += n / (c1 - c0 + 1)
        diff[c1 + 1] -= n / (c1 - c0 + 1)
    counts = np.rint(np.maximum(np.cumsum(diff[:-1]), 0)).astype(np.int64)
    part = plan(lo, shift, counts, piece_rows)
    part.hi = hi
    return part


def fits(part: Partition, ids: np.ndarray) -> bool:
    """Whether every id is in the range the plan covers."""
    return ids.size == 0 or (int(ids.min()) >= part.lo and int(ids.max()) <= part.hi)


@dataclass
class Scattered:
    """A chunk's rows reordered by piece of ``part`` (stably: input order within a piece),
    piece ``k``'s from ``offsets[k]`` to ``offsets[k + 1]``. When every piece spans at most
    65,536 ids (``part.local``), ``rows.batch_id`` holds each id's low 16 bits (uint16): a
    quarter of the bytes to move and to hold until pricing (:func:`_ids` restores them). A
    chunk without a bad row holds no ``bad`` column (a read-only view of one False)."""

    rows: Rows
    offsets: np.ndarray
    part: Partition

    def nbytes(self) -> int:
        return self.rows.nbytes()

    def piece(self, k: int) -> Rows:
        """Piece ``k``'s rows (views), batch ids as stored."""
        return self.rows.slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def absolute(self) -> Rows:
        """The rows with their batch ids (int64), in piece order."""
        if self.rows.batch_id.dtype != np.uint16:
            return self.rows
        ids = _ids(self.rows.batch_id, np.repeat(self.part.first_ids(), np.diff(self.offsets)))
        r = self.rows
        return Rows(r.row, ids, r.scheduled, r.computed, r.bad, r.decode_threshold,
                    r.sm_budget, r.extra)


def plan_offsets(seg: np.ndarray, a: int, b: int, n: int) -> np.ndarray:
    """Piece offsets ``seg`` of pieces ``a`` to ``b`` (a spill group's) over all ``n`` pieces
    of the plan, the others empty: a :class:`Scattered` chunk's ``offsets``."""
    out = np.empty(n + 1, np.int64)
    out[:a] = 0
    out[a:b + 1] = seg
    out[b + 1:] = seg[-1]
    return out


def scatter(rows: Rows, part: Partition, *, fresh: bool = False,
            narrow: bool = False, compiled: bool = True) -> Scattered:
    """The rows reordered by piece; ``fresh``: rows as validation left them (row numbers
    increasing); ``narrow``: integer columns stored as :meth:`Rows.narrowed` stores them
    (``rows`` may be left as they were). By compiled loops where they are on and
    ``compiled`` (decision SJ1; each column then taken straight into its narrow type, SW3),
    else by Arrow: the same arrays, types included."""
    loops = _compiled() if compiled else None
    if loops is not None and not rows.extra:
        return _scatter_compiled(rows, part, fresh, loops, narrow)
    if narrow:
        rows.narrowed()
    key = part.piece_of_cell[part.cells(rows.batch_id)]
    # (Arrow's stable sort of small integers is a counting sort: ~half numpy's radix sort)
    order = pc.array_sort_indices(pa.array(key), memory_pool=_POOL).to_numpy().view(np.int64)
    # (where each piece starts among the sorted keys: cheaper than a bincount, which widens
    # every key to intp first; the piece numbers fit the keys' type, n itself may not)
    offsets = np.append(np.searchsorted(key[order], np.arange(part.n, dtype=key.dtype)),
                        key.size)
    # (a piece's offsets are made from the low bits when it is gathered: one subtraction
    # per piece instead of a per-row lookup of its first id here)
    low = rows.batch_id.astype(np.uint16) if part.local and not rows.extra else None
    return Scattered(_take(rows, order, fresh, low), offsets, part)


def _compiled() -> dict[str, Any] | None:
    """The compiled loops of :mod:`kernel.bulk.row_loops` by name, or None where compiled
    loops are off."""
    if jit.compiled(row_loops.piece_keys) is None:
        return None
    return {name: jit.compiled(getattr(row_loops, name)) for name in row_loops.__all__}


def _scatter_compiled(rows: Rows, part: Partition, fresh: bool,
                      loops: dict[str, Any], narrow: bool = False) -> Scattered:
    """:func:`scatter` in two compiled passes over the batch ids (count, place) and one over
    each column, every narrow column kept narrow (no Arrow arrays, no int64 keys); with
    ``narrow``, a wide column is taken straight into the type :meth:`Rows.narrowed` would
    give it (one take instead of narrowing's copy and then a take of the copy, SW3)."""
    ids, lo, shift = rows.batch_id, part.lo, part.shift
    if shift >= 47:  # (ids spanning more than half the int64 range: cells computed by numpy)
        ids, lo, shift = part.cells(ids), 0, 0
    n = len(rows)
    # (each id's low 16 bits, when they are what the pieces hold, written in the same pass)
    low = np.empty(n if part.local else 0, np.uint16)
    keys, offsets = loops["piece_keys"](ids, lo, shift, part.piece_of_cell, part.n, low)
    order = np.empty(n, np.int32 if n < 1 << 31 else np.int64)
    loops["stable_order"](keys, offsets, order)
    del keys

    def take(v: np.ndarray, narrowed: bool = False) -> np.ndarray:
        out = np.empty(n, narrow_type(v) if narrowed else v.dtype)
        loops["take_into"](order, v, out)
        return out

    def maybe(v: np.ndarray | None) -> np.ndarray | None:
        return None if v is None else take(v, narrow)

    first = _run_start(rows, fresh)
    if first is not None:
        row = np.empty(n, narrow_type(rows.row, first, first + n - 1) if narrow
                       else rows.row.dtype)
        loops["shifted_into"](order, first, row)
    else:
        row = take(rows.row, narrow)
    # (no bad row: a read-only view of one False, no memory held)
    bad = take(rows.bad) if rows.bad.any() else np.broadcast_to(np.False_, (n,))
    out = Rows(row, take(low if part.local else rows.batch_id), take(rows.scheduled, narrow),
               take(rows.computed, narrow), bad, maybe(rows.decode_threshold),
               maybe(rows.sm_budget))
    return Scattered(out, offsets, part)


def _run_start(rows: Rows, fresh: bool) -> int | None:
    """The first row number of a chunk just validated (``fresh``: increasing) whose row
    numbers run on without a gap, or None: its rows taken in ``order`` are then numbered
    ``order + first``, no gather of the row column."""
    n = len(rows)
    if not fresh or not n:
        return None
    first = int(rows.row[0])
    return first if int(rows.row[-1]) - first == n - 1 else None


def _take(rows: Rows, order: np.ndarray, fresh: bool, ids: np.ndarray | None) -> Rows:
    """``rows.take(order)``, cheaper for the usual chunk: the row numbers of a chunk just
    validated (``fresh``) that run on without a gap are ``order`` shifted, and a chunk
    without bad rows needs no gather of them; ``ids``: batch ids to take instead."""
    if rows.extra:
        return rows.take(order)
    n = len(rows)
    first = _run_start(rows, fresh)
    if first is not None:
        row = (order + first).astype(rows.row.dtype)
    else:
        row = rows.row[order]
    # (no bad row: a read-only view of one False, no memory held)
    bad = rows.bad[order] if rows.bad.any() else np.broadcast_to(np.False_, (n,))

    indices = pa.array(order)

    def take(v: np.ndarray) -> np.ndarray:
        # (Arrow's take of fixed-width columns: ~20% less than numpy's fancy indexing)
        return pc.take(v, indices, memory_pool=_POOL).to_numpy()

    def maybe(v: np.ndarray | None) -> np.ndarray | None:
        return None if v is None else take(v)

    return Rows(row, take(rows.batch_id if ids is None else ids), take(rows.scheduled),
                take(rows.computed), bad, maybe(rows.decode_threshold), maybe(rows.sm_budget))


def gather_piece(chunks: list[Scattered], k: int, *, compiled: bool = True) -> Rows:
    """Piece ``k``'s rows from every scattered chunk, in input order, as int64 (ids restored
    from their low bits by a compiled pass where compiled loops are on and ``compiled``)."""
    cuts = [(c.rows, int(c.offsets[k]), int(c.offsets[k + 1])) for c in chunks
            if c.offsets[k + 1] > c.offsets[k]]
    if not cuts:
        return Rows.empty()
    if any(r.extra for r, _, _ in cuts) or len({r.batch_id.dtype for r, _, _ in cuts}) > 1:
        rows = Rows.concat([r.slice(a, b) for r, a, b in cuts], wide=True)
    else:  # (each column put end to end directly: no Rows per slice, ~300 of them at 10 M)
        def cat(name: str, dtype: Any = np.int64) -> Any:
            if getattr(cuts[0][0], name) is None:
                return None
            return np.concatenate([getattr(r, name)[a:b] for r, a, b in cuts], dtype=dtype)

        n = sum(b - a for _, a, b in cuts)
        no_bad = all(r.bad.strides == (0,) and not r.bad[:1].any() for r, _, _ in cuts)
        rows = Rows(cat("row"), cat("batch_id", None), cat("scheduled"), cat("computed"),
                    np.zeros(n, bool) if no_bad else cat("bad", bool),
                    cat("decode_threshold"), cat("sm_budget"))
    if rows.batch_id.dtype == np.uint16:  # low bits of the ids
        first = chunks[0].part.piece_lo(k)
        restore = jit.compiled(row_loops.ids_from_low) if compiled else None
        if restore is None:
            rows.batch_id = _ids(rows.batch_id, first)
        else:  # (one pass instead of numpy's three)
            ids = np.empty(len(rows), np.int64)
            restore(rows.batch_id, first, ids)
            rows.batch_id = ids
    return rows


def _ids(low: np.ndarray, first: np.ndarray | int) -> np.ndarray:
    """Batch ids (int64) from their low 16 bits and their piece's first id (one per row, or
    one for all): each id's offset from ``first`` is below 2**16, so uint16 arithmetic, which
    wraps modulo 2**16, gives it exactly."""
    first = np.asarray(first, np.int64)
    return (low - first.astype(np.uint16)).astype(np.int64) + first


def group_piece(rows: Rows, lo: int, span: int) -> Rows:
    """A piece's rows (input order) grouped by batch id, stably, batches in id order, with
    int64 columns. The usual piece (< 65,536 ids) is grouped by a 16-bit radix sort, and its
    sorted ids are rebuilt from their counts rather than gathered."""
    if len(rows) < 2:
        return rows.widened()
    ids = rows.batch_id
    if span <= 1 << 16:
        key: np.ndarray = (ids - lo).astype(np.uint16)
        order = np.argsort(key, kind="stable")
        if bool(np.all(order[1:] > order[:-1])):
            return rows.widened()
        if rows.extra:
            return rows.take(order).widened()
        counts = np.bincount(key, minlength=span)
        # (gathering narrow columns and widening after touches half the bytes at random)
        def take(v: np.ndarray) -> np.ndarray:
            return v[order].astype(np.int64, copy=False)

        def maybe(v: np.ndarray | None) -> np.ndarray | None:
            return None if v is None else take(v)

        bad = rows.bad[order] if rows.bad.any() else np.zeros(len(rows), bool)
        return Rows(take(rows.row), np.repeat(np.arange(lo, lo + span, dtype=np.int64), counts),
                    take(rows.scheduled), take(rows.computed), bad,
                    maybe(rows.decode_threshold), maybe(rows.sm_budget))
    if span <= 1 << 32:  # two stable 16-bit radix passes
        off = ids - lo
        first = np.argsort((off & 0xFFFF).astype(np.uint16), kind="stable")
        order = first[np.argsort((off[first] >> 16).astype(np.uint16), kind="stable")]
    else:
        order = np.argsort(ids, kind="stable")
    if bool(np.all(order[1:] > order[:-1])):
        return rows.widened()
    return rows.take(order).widened()
