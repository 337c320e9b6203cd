"""Grouping rows whose batch ids advance through the file, beyond the memory budget, in memory.

Mode ``window`` (``docs/traces.md``, decision SP1). A request-major log (each request's rows
together, requests in arrival order) has its rows in no batch order, but each row group's
batch ids lie in a narrow range that moves up through the file. The parquet statistics say,
before reading, the smallest batch id of every row group still to come: once the row groups
before it are read, every piece of the plan (:mod:`kernel.bulk.partition`) below that id is
complete and is priced at once, and a validated chunk is let go when its last piece has been
priced. Memory then holds the rows of the pieces still open — a few row groups for a
request-major log — rather than the whole trace, and nothing goes to disk.

The mode is chosen before reading, when the statistics show the rows held at any time
(:func:`held_rows`, each row group held until its last piece is complete) fit half of
``memory_budget``; otherwise the trace is spilled (:mod:`kernel.bulk.spill`). Pieces are
priced exactly as ``sorted`` and ``spill`` mode price them (the rows of each batch gathered
in input order), so the prices are bit for bit those of the sorted trace. Statistics that
do not cover the rows (they never should) are caught on the chunk that shows it: before the
first piece is priced, the run goes on spilling; after it, it stops with an error naming the
row group, since a priced piece may have missed rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any

import numpy as np

from ..io.trace import Rows, TraceError
from .engine import Engine, Priced
from .partition import Partition, Scattered

__all__ = ["ROW_BYTES", "complete_pieces", "fits_window", "held_rows", "window_units"]

ROW_BYTES = 16  # bytes a held row is taken to cost (as the spill counts them)

Unit = Callable[[], Priced]


def _piece_of(part: Partition, ids: np.ndarray) -> np.ndarray:
    """The piece holding each id (ids within the plan's range)."""
    return np.searchsorted(part.first_ids(), ids, side="right") - 1


def complete_pieces(ranges: list[tuple[int, int, int]], part: Partition) -> np.ndarray:
    """For each row group ``g`` (``ranges``: (min id, max id, rows) in file order), how many
    leading pieces are complete once groups ``0..g`` are read: those wholly below the
    smallest id of every later group (all of them after the last group)."""
    mins = np.array([r[0] for r in ranges], np.int64)
    later = np.minimum.accumulate(mins[::-1])[::-1]  # smallest id of groups g, g+1, ...
    done = np.empty(mins.size, np.int64)
    done[:-1] = _piece_of(part, later[1:])  # (the piece of that id is still open)
    done[-1] = part.n
    return np.maximum.accumulate(done)


def held_rows(ranges: list[tuple[int, int, int]], part: Partition) -> int:
    """The most rows held at once, each row group's until every piece it touches is complete
    (an upper bound: a chunk is let go as soon as its own last piece is)."""
    done = complete_pieces(ranges, part)
    maxs = np.array([r[1] for r in ranges], np.int64)
    rows = np.array([r[2] for r in ranges], np.int64)
    last = _piece_of(part, maxs)
    # (the group read when the pieces up to the last one group g touches are complete)
    freed = np.maximum(np.searchsorted(done, last, side="right"), np.arange(rows.size))
    held = np.zeros(rows.size + 1, np.int64)
    np.add.at(held, np.arange(rows.size), rows)
    np.add.at(held, freed + 1, -rows)
    return int(np.cumsum(held)[:-1].max()) if rows.size else 0


def fits_window(ranges: list[tuple[int, int, int]] | None, part: Partition | None,
                budget: int) -> bool:
    """Whether mode ``window`` holds at most half of ``budget`` (the rest is for the pieces
    being priced), by the statistics."""
    if not ranges or part is None:
        return False
    return held_rows(ranges, part) * ROW_BYTES <= budget // 2


def window_units(eng: Engine, parts: Iterator[tuple[Any, Any, int]], part: Partition,
                 ranges: list[tuple[int, int, int]], sizes: list[int], label: str,
                 pool: Executor, fallback: Callable[[Iterator[Rows | Scattered]], Iterator[Unit]]
                 ) -> Iterator[Unit]:
    """Validated chunks (``(rows, terms, i)``, ``i`` the source chunk's index and
    ``sizes[i]`` its row count) held in memory, each piece of ``part`` priced as soon as the
    statistics show it complete. A chunk outside the plan before any piece was priced sends
    everything to ``fallback`` (the spill)."""
    done = complete_pieces(ranges, part)
    ends = np.cumsum([r[2] for r in ranges])  # source rows through each row group
    held: list[_Held] = []  # chunks with rows in pieces not yet priced, in input order
    priced_to = 0  # pieces below this are priced
    read, seen = 0, -1
    parts = iter(parts)
    # (each chunk's pieces are found on the pool, one chunk ahead)
    keyed = ((pool.submit(_Held.of, rows, part), i) for rows, _, i in parts)
    ahead: deque[tuple[Future[_Held], int]] = deque()
    try:
        for item in chain(keyed, [None]):
            if item is not None:
                ahead.append(item)
                if len(ahead) < 2:
                    continue
            if not ahead:
                break
            fut, i = ahead.popleft()
            c = fut.result()
            while seen < i:  # (chunks with no valid row are not yielded: count them too)
                seen += 1
                read += sizes[seen]
            if c.first < priced_to:  # (statistics that do not cover the rows: never should)
                if priced_to == 0:  # nothing priced yet: the spill takes everything
                    rest = [f.result().rows for f, _ in ahead]
                    ahead.clear()
                    yield from fallback(chain((h.rows for h in held), [c.rows], rest,
                                              (p[0] for p in parts)))
                    return
                g = min(int(np.searchsorted(ends, read, side="left")), len(ranges) - 1)
                raise TraceError(
                    f"{label}: non-empty row group {g} holds batch ids outside its parquet "
                    f"statistics (min {ranges[g][0]}, max {ranges[g][1]}), found after the "
                    "batches below them were priced; rewrite the file, or price it with "
                    "order='external'")
            held.append(c)
            # (row groups read through: the pieces their successors cannot reach are done)
            full = int(np.searchsorted(ends, read, side="right"))
            upto = int(done[full - 1]) if full else 0
            if upto > priced_to:
                yield from _pieces(eng, held, part, priced_to, upto)
                priced_to = upto
                held = [h for h in held if h.last >= priced_to]
        yield from _pieces(eng, held, part, priced_to, part.n)
    finally:
        for f, _ in ahead:
            f.cancel()


@dataclass
class _Held:
    """A validated chunk (input order, narrow columns), the piece of each row (None when
    all are in one) and the pieces that have rows."""

    rows: Rows
    key: np.ndarray | None
    pieces: np.ndarray  # int64, increasing

    @property
    def last(self) -> int:
        return int(self.pieces[-1])

    @property
    def first(self) -> int:
        """The first piece with rows; -1 for rows outside the plan."""
        return int(self.pieces[0])

    @staticmethod
    def of(rows: Rows, part: Partition) -> _Held:
        ids = rows.batch_id
        lo, hi = int(ids.min()), int(ids.max())
        if lo < part.lo or hi > part.hi:
            return _Held(rows, None, np.array([-1, -1], np.int64))
        a, b = _piece_of(part, np.array([lo, hi])).tolist()
        if a == b:  # (one piece: no key)
            return _Held(rows, None, np.array([a], np.int64))
        key = part.piece_of_cell[part.cells(ids)]
        counts = np.bincount(key, minlength=part.n)
        return _Held(rows, key, np.flatnonzero(counts))

    def piece(self, k: int) -> Rows:
        """Its rows in piece ``k``, in input order."""
        if self.key is None:
            return self.rows.slice(0, len(self.rows))  # (a new object: widened in place)
        return self.rows.take(np.flatnonzero(self.key == k))


def _pieces(eng: Engine, held: list[_Held], part: Partition, a: int, b: int
            ) -> Iterator[Unit]:
    """The units pricing pieces ``a..b-1`` that have rows, from the held chunks (each
    gathered and priced on the pool)."""
    by_piece: dict[int, list[_Held]] = {}
    for c in held:
        lo, hi = np.searchsorted(c.pieces, [a, b])
        for k in c.pieces[lo:hi].tolist():
            by_piece.setdefault(k, []).append(c)
    for k in sorted(by_piece):
        yield partial(_price_piece, eng, part, by_piece[k], k)


def _price_piece(eng: Engine, part: Partition, chunks: list[_Held], k: int) -> Priced:
    rows = Rows.concat([c.piece(k) for c in chunks], wide=True)
    return eng.price_range_task(rows, part.piece_lo(k), part.piece_span(k))
