"""A spill group read back as one array a column, and each of its pieces gathered grouped.

Mode ``spill`` (:mod:`kernel.bulk.spill`) reads its groups back one at a time. Gathering a
piece from the ~300 slices of its group and pricing it where it lies left two costs on the
pricing workers (decision SW5): the gather, ``np.concatenate`` of ~300 slices, and the
in-place walk's per-batch sums by ``np.add.at``, both holding the GIL (a sorted trace's
contiguous batches are summed by ``reduceat``, which does not), so pass 2 kept ~1.5 of 2
cores busy. Here a group's slices lie end to end, one array a column (:class:`Joined`: each
column's spill file mapped where every slice has it in one type, else copied on the read-ahead
thread into the widest of the slices' narrow types, decision SW6), and each piece is gathered
*grouped* — every batch's rows contiguous, in input order, batches in id order — by two
compiled passes over its batch ids and one per column (:mod:`kernel.bulk.row_loops`, the GIL
released), on the pricing worker that then prices it exactly as it prices a sorted trace's
chunk. The order within a batch is the input order (slices in input order, rows within a
slice in input order after a stable scatter), so the prices are bit for bit the sorted
trace's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..io.trace import Rows
from ..model import jit
from . import row_loops
from .groups import Groups
from .partition import Partition, Scattered, plan_offsets

__all__ = ["Joined", "RowSteps", "gather_grouped", "grouping_compiled", "rows_from_steps"]


@dataclass
class RowSteps:
    """A spill group's row numbers as they were spilled (decision SW2): ``steps`` (uint16,
    the group's slices end to end) rising from ``firsts[s, i]``, the first row number of
    piece ``i`` in slice ``s``; ``row_type``: their type once decoded."""

    steps: np.ndarray
    firsts: np.ndarray  # int64 [slices, pieces of the group]
    row_type: np.dtype


@dataclass
class Joined:
    """A spill group's slices end to end (``rows``: one array a column, slices in input
    order); ``offsets[s, i]``: where the group's ``i``-th piece starts in slice ``s``, in
    ``rows``' coordinates (``offsets[s, -1]``: where slice ``s`` ends); ``first``: the
    group's first piece of ``part``. With ``steps``, the row numbers are still the spilled
    steps (``rows.row`` holds them): each piece decodes its own as it is gathered, so the
    group's are never decoded whole into fresh memory (decision SW8)."""

    rows: Rows
    offsets: np.ndarray  # int64 [slices, pieces of the group + 1]
    first: int
    part: Partition
    steps: RowSteps | None = None

    def sizes(self) -> np.ndarray:
        """Rows of each of the group's pieces."""
        return (self.offsets[:, 1:] - self.offsets[:, :-1]).sum(axis=0)

    def scattered(self) -> list[Scattered]:
        """The slices as chunks scattered by the whole plan (views, but the row numbers,
        decoded; the pieces of other groups empty), for the gather of
        :func:`kernel.bulk.partition.gather_piece`."""
        a = self.first
        b = a + self.offsets.shape[1] - 1
        out = []
        for s, off in enumerate(self.offsets):
            rows = self.rows.slice(int(off[0]), int(off[-1]))
            if self.steps is not None:
                rows.row = rows_from_steps(rows.row, off - off[0], self.steps.firsts[s],
                                           self.steps.row_type)
            out.append(Scattered(rows, plan_offsets(off - off[0], a, b, self.part.n),
                                 self.part))
        return out


def rows_from_steps(steps: np.ndarray, seg: np.ndarray, firsts: np.ndarray,
                    row_type: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """The row numbers :func:`kernel.bulk.spill.row_steps` encoded (decision SW2), in their
    own type (into ``out``, of that type and length, when given)."""
    if out is None:
        out = np.empty(steps.size, row_type)
    loop = jit.compiled(row_loops.rows_from_steps)
    if loop is not None:
        loop(steps, seg, firsts, out)
        return out
    c = np.cumsum(steps, dtype=np.int64)
    lens = np.diff(seg)
    full = lens > 0
    starts = seg[:-1][full]
    # (a piece's first step is 0: its rows are its first row plus the steps since)
    out[:] = c + np.repeat(firsts[full] - c[starts], lens[full])
    return out


def grouping_compiled() -> bool:
    """Whether pieces can be gathered grouped here (compiled loops are on)."""
    return jit.compiled(row_loops.batch_keys) is not None


def gather_grouped(j: Joined, k: int) -> tuple[Rows, Groups] | None:
    """Piece ``k`` of the group's plan gathered with each batch's rows contiguous, in input
    order, batches in id order, int64 columns, and its batches; None when compiled loops
    are off or the piece spans too many ids for a table of them (sparse 64-bit ids: the
    caller gathers it as before)."""
    keys = jit.compiled(row_loops.batch_keys)
    if keys is None:
        return None
    i = k - j.first
    starts = np.ascontiguousarray(j.offsets[:, i])
    ends = np.ascontiguousarray(j.offsets[:, i + 1])
    n = int((ends - starts).sum())
    lo, span = j.part.piece_lo(k), j.part.piece_span(k)
    low = j.rows.batch_id.dtype == np.uint16  # (the ids' low 16 bits: a local plan)
    if n == 0 or (not low and span > max(1 << 16, 4 * n)):
        return None
    counts = np.zeros(span, np.int64)
    dest = np.empty(n, np.int32 if n < 1 << 31 else np.int64)
    keys(j.rows.batch_id, starts, ends, lo, low, counts, dest)
    place = jit.compiled(row_loops.place_into)
    assert place is not None

    def put(v: np.ndarray | None, dtype: type = np.int64) -> np.ndarray | None:
        if v is None:
            return None
        out: np.ndarray = np.empty(n, dtype)
        place(v, starts, ends, dest, out)
        return out

    r = j.rows
    bad = (put(r.bad, np.bool_) if r.bad.strides != (0,) or r.bad[:1].any()
           else np.broadcast_to(np.False_, (n,)))
    ids = np.empty(n, np.int64)
    inv = np.empty(n, np.int64)
    first_rows = np.empty(min(n, span), np.int64)
    fill = jit.compiled(row_loops.grouped_ids)
    assert fill is not None
    nb = fill(counts, lo, ids, inv, first_rows)
    first_rows = first_rows[:nb]
    if j.steps is None:
        row = put(r.row)
    else:  # (decoded as placed: SW8)
        row = np.empty(n, np.int64)
        steps = jit.compiled(row_loops.place_steps_into)
        assert steps is not None
        steps(r.row, starts, ends, np.ascontiguousarray(j.steps.firsts[:, i]), dest, row)
    rows = Rows(row, ids, put(r.scheduled), put(r.computed), bad,  # type: ignore[arg-type]
                put(r.decode_threshold), put(r.sm_budget))
    return rows, Groups(first_rows, ids[first_rows], inv)
