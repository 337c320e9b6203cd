"""Grouping rows of any order beyond the memory budget: a partition by batch id range to disk.

Mode ``spill`` (``docs/traces.md``, decision BT1). The batch-id range is planned before
reading (parquet row-group statistics, an in-memory table's range) into pieces of whole
batches (:mod:`kernel.bulk.partition`), and consecutive pieces into *spill groups* of about
a quarter of ``memory_budget`` each. Then, in two passes over the rows, each linear:

1. **partition**: every chunk, just validated, is scattered to its pieces on the worker
   that validated it (as in ``sorted`` mode); a writer thread appends each group's slice of
   it, narrow columns as they are, to that group's file (an Arrow IPC stream per slice; the
   slice's piece offsets stay in memory, a few integers per slice);
2. **group**: the groups are read back one by one, ids increasing (on a read-ahead thread,
   each file removed once read); where compiled loops are on, each group end to end and each
   piece gathered grouped on its pricing worker, then priced as a sorted chunk
   (:mod:`kernel.bulk.joined`, decision SW5); otherwise each piece gathered from the slices
   in input order and priced where it lies, exactly as ``sorted`` mode prices its pieces.

Each batch keeps its rows in input order, so the prices are bit-for-bit those of the sorted
trace. Memory holds two groups (about half ``memory_budget``) plus what pricing holds, at
any trace size; the disk holds the validated rows once (~10 bytes a row). The files live in
a scratch directory registered for removal on SIGINT/SIGTERM (``pipeline.safe_output``) and
removed when the run ends, however it ends.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline import safe_output

from ..io.trace import KEEP_PREFIX, Rows
from ..model import jit
from . import row_loops
from .ahead import prefetched
from .engine import PRICE_ROWS, Engine, Priced
from .joined import Joined, gather_grouped, grouping_compiled
from .partition import (
    Partition,
    Scattered,
    fits,
    gather_piece,
    plan_from_ranges,
    plan_offsets,
    scatter,
)

__all__ = ["ROW_BYTES", "group_bounds", "spill_plan", "spill_units"]

ROW_BYTES = 16  # bytes a held row is taken to cost (12 with the usual narrow columns, RO14)
MAX_FILES = 256  # spill groups at most (open files)
WRITE_AHEAD = 2  # scattered chunks waiting for the writer threads
WRITERS = 2  # writer threads (decision SW1)
GATHER_AHEAD = 1  # units (a piece each) the read-ahead thread takes ahead (SW5)

Unit = Callable[[], Priced]

log = logging.getLogger(__name__)  # no handler here: the CLI attaches one (CF5)


def group_rows(budget: int) -> int:
    """Rows of one spill group: two are held at once, in a quarter of ``budget`` each."""
    return max(1, budget // 4 // ROW_BYTES)


def spill_plan(ranges: list[tuple[int, int, int]], budget: int) -> Partition | None:
    """Pieces of at most :data:`~kernel.bulk.engine.PRICE_ROWS` rows, and at most one spill
    group's (a tiny budget makes tiny pieces: how the tests force many groups)."""
    return plan_from_ranges(ranges, min(PRICE_ROWS, group_rows(budget)))


LOCAL_IDS = 60_000  # ids a piece is planned to span at most when pieces are cut to stay local
LOCAL_MIN_ROWS = PRICE_ROWS // 8  # but not into pieces of fewer rows than this


def local_plan(ranges: list[tuple[int, int, int]], part: Partition) -> Partition:
    """``part``, or, when its pieces span more than 65,536 ids (few rows a batch: at 4 a
    batch, a 1 Mi-row piece spans ~260,000 ids) and pieces of at most :data:`LOCAL_IDS` ids
    would still hold :data:`LOCAL_MIN_ROWS` rows, a plan of such pieces: every spilled id then
    goes to disk and back as 2 bytes instead of 8 (decision SW4)."""
    if part.local:
        return part
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    rows = sum(r[2] for r in ranges)
    piece_rows = int(rows / (hi - lo + 1) * LOCAL_IDS)
    if piece_rows < LOCAL_MIN_ROWS:
        return part
    local = plan_from_ranges(ranges, min(piece_rows, PRICE_ROWS))
    return local if local is not None and local.local else part


def group_bounds(part: Partition, total_rows: int, budget: int) -> np.ndarray:
    """The first piece of each spill group, then ``part.n``: consecutive pieces of about
    :func:`group_rows` rows together (the pieces hold about ``total_rows / part.n`` each),
    at most :data:`MAX_FILES` groups."""
    per_piece = max(1, -(-total_rows // max(part.n, 1)))
    per = max(1, group_rows(budget) // per_piece, -(-part.n // MAX_FILES))
    return np.append(np.arange(0, part.n, per), part.n).astype(np.int64)


@dataclass
class _Slice:
    """One chunk's rows of one spill group: where its record lies in the group's file, where
    each of the group's pieces starts in it, and, when its row numbers went to disk as steps
    (decision SW2), each piece's first row number and their type."""

    pos: int
    size: int
    offsets: np.ndarray  # int64, one per piece of the group and one more
    firsts: np.ndarray | None = None  # int64, one per piece of the group (None: row as is)
    row_type: np.dtype | None = None


def _record(rows: Rows, steps: np.ndarray | None = None) -> pa.RecordBatch:
    """The rows as a record batch, narrow columns as they are (zero-copy), ``bad`` only when
    a row is bad; ``steps``: the row numbers' steps, written instead of them."""
    cols: dict[str, pa.Array] = {"batch_id": pa.array(rows.batch_id),
                                 "scheduled": pa.array(rows.scheduled),
                                 "computed": pa.array(rows.computed)}
    cols["row" if steps is None else "row_step"] = pa.array(rows.row if steps is None
                                                            else steps)
    if rows.bad.any():
        cols["bad"] = pa.array(rows.bad)
    for name in ("decode_threshold", "sm_budget"):
        v = getattr(rows, name)
        if v is not None:
            cols[name] = pa.array(v)
    for k, a in (rows.extra or {}).items():
        cols[KEEP_PREFIX + k] = a
    return pa.record_batch(cols)


def _rows(rb: pa.RecordBatch, sl: _Slice) -> Rows:
    names = set(rb.schema.names)

    def col(name: str) -> np.ndarray | None:
        return rb.column(name).to_numpy(zero_copy_only=False) if name in names else None

    n = rb.num_rows
    bad = col("bad")
    extra = {x[len(KEEP_PREFIX):]: rb.column(x) for x in rb.schema.names
             if x.startswith(KEEP_PREFIX)}
    row = col("row")
    if row is None:
        assert sl.firsts is not None and sl.row_type is not None
        row = rows_from_steps(col("row_step"), sl.offsets, sl.firsts,  # type: ignore[arg-type]
                              sl.row_type)
    return Rows(row, col("batch_id"), col("scheduled"), col("computed"),  # type: ignore[arg-type]
                np.broadcast_to(np.False_, (n,)) if bad is None else bad,
                col("decode_threshold"), col("sm_budget"), extra or None)


def row_steps(row: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A slice's row numbers as uint16 steps within each piece (``seg``: the pieces' starts
    in the slice, then its length) and each piece's first row number, or None when a step
    does not fit 16 bits (decision SW2; compiled where compiled loops are on)."""
    loop = jit.compiled(row_loops.row_steps)
    if loop is not None:
        steps = np.empty(row.size, np.uint16)
        firsts = np.empty(seg.size - 1, np.int64)
        return (steps, firsts) if loop(row, seg, steps, firsts) else None
    d = np.zeros(row.size, np.int64)
    np.subtract(row[1:], row[:-1], out=d[1:], dtype=np.int64)
    full = np.diff(seg) > 0
    starts = seg[:-1][full]
    d[starts] = 0
    if row.size and (int(d.min()) < 0 or int(d.max()) > 0xFFFF):
        return None
    firsts = np.zeros(seg.size - 1, np.int64)
    firsts[full] = row[starts]
    return d.astype(np.uint16), firsts


def rows_from_steps(steps: np.ndarray, seg: np.ndarray, firsts: np.ndarray,
                    row_type: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """The row numbers :func:`row_steps` encoded, in their own type (into ``out``, of that
    type and length, when given)."""
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


class SpillFiles:
    """The spill groups' files in ``directory``: scattered chunks appended on
    :data:`WRITERS` writer threads (group ``g`` always on thread ``g % WRITERS``, so each
    file gets its slices in input order), then each group read back whole."""

    def __init__(self, directory: Path, part: Partition, bounds: np.ndarray):
        self.dir = directory
        self.part = part
        self.bounds = bounds
        self.n = int(bounds.size - 1)
        self.index: list[list[_Slice]] = [[] for _ in range(self.n)]
        self.files: dict[int, pa.NativeFile] = {}
        self.stopped = False  # (a signal: write nothing more, the directory is going)
        self._writers = [ThreadPoolExecutor(1, thread_name_prefix="blis-spill")
                         for _ in range(WRITERS)]
        self._writes: deque[list[Future[None]]] = deque()

    def path(self, g: int) -> Path:
        return self.dir / f"group-{g:05d}.arrow"

    def add(self, s: Scattered) -> None:
        """Queue a chunk scattered by this plan (calling thread; raises a writer failure)."""
        while len(self._writes) >= WRITE_AHEAD:
            for f in self._writes.popleft():
                f.result()
        cuts = s.offsets[self.bounds]
        todo = np.flatnonzero(np.diff(cuts))
        self._writes.append([w.submit(self._write, s, cuts, mine)
                             for i, w in enumerate(self._writers)
                             if (mine := todo[todo % WRITERS == i]).size])

    def stop(self) -> None:
        self.stopped = True

    def _write(self, s: Scattered, cuts: np.ndarray, groups: np.ndarray) -> None:
        for g in groups.tolist():
            if self.stopped:
                return
            lo, hi = int(cuts[g]), int(cuts[g + 1])
            a, b = int(self.bounds[g]), int(self.bounds[g + 1])
            f = self.files.get(g)
            if f is None:
                f = self.files[g] = pa.OSFile(str(self.path(g)), "w")
            rows = s.rows.slice(lo, hi)
            seg = s.offsets[a:b + 1] - lo
            # (row numbers rise within a piece: 2 bytes a row instead of 4 or 8, SW2)
            stepped = row_steps(rows.row, seg) if rows.row.dtype.itemsize > 2 else None
            rb = _record(rows, None if stepped is None else stepped[0])
            pos = f.tell()
            with pa.ipc.new_stream(f, rb.schema) as w:
                w.write_batch(rb)
            self.index[g].append(_Slice(pos, f.tell() - pos, seg,
                                        None if stepped is None else stepped[1],
                                        None if stepped is None else rows.row.dtype))

    def _shutdown(self, cancel: bool) -> None:
        for w in self._writers:
            w.shutdown(wait=True, cancel_futures=cancel)

    def finish(self) -> None:
        """Wait for every write, close the files."""
        while self._writes:
            for f in self._writes.popleft():
                f.result()
        self._shutdown(False)
        for f in self.files.values():
            f.close()

    def close(self) -> None:
        """Stop the writers (dropping what is queued) and close the files (on failure)."""
        self._shutdown(True)
        self._writes.clear()
        for f in self.files.values():
            if not f.closed:
                f.close()

    def _records(self, g: int) -> list[tuple[pa.RecordBatch, _Slice]]:
        """Group ``g``'s slices, in input order, as record batches read from its file (mapped,
        not read: views of the page cache, no copy of the group into fresh heap pages; the
        mapping outlives the file's name, removed at once, until they are freed)."""
        if not self.index[g]:
            return []
        path = self.path(g)
        with pa.memory_map(str(path), "r") as f:
            buf = f.read_buffer()
        path.unlink()
        out = [(pa.ipc.open_stream(buf.slice(sl.pos, sl.size)).read_next_batch(), sl)
               for sl in self.index[g]]
        self.index[g] = []
        return out

    def read(self, g: int) -> list[Scattered]:
        """Group ``g``'s slices, in input order, as chunks scattered by the whole plan (the
        pieces of other groups empty); its file is removed once read."""
        return self._scattered(g, self._records(g))

    def _scattered(self, g: int, recs: list[tuple[pa.RecordBatch, _Slice]]
                   ) -> list[Scattered]:
        a, b = int(self.bounds[g]), int(self.bounds[g + 1])
        return [Scattered(_rows(rb, sl), plan_offsets(sl.offsets, a, b, self.part.n), self.part)
                for rb, sl in recs]

    def read_joined(self, g: int) -> Joined | list[Scattered]:
        """Group ``g``'s slices end to end, one array a column (:class:`Joined`, decision
        SW5), or, when they carry ``keep=`` columns, as :meth:`read` gives them; its file is
        removed once read."""
        recs = self._records(g)
        if not recs:
            return []
        if any(x.startswith(KEEP_PREFIX) for rb, _ in recs for x in rb.schema.names):
            return self._scattered(g, recs)
        a, b = int(self.bounds[g]), int(self.bounds[g + 1])
        sizes = np.array([rb.num_rows for rb, _ in recs], np.int64)
        base = np.concatenate(([0], np.cumsum(sizes)))
        n = int(base[-1])
        names = set().union(*(rb.schema.names for rb, _ in recs))

        def column(name: str) -> np.ndarray | None:
            if name not in names:
                return None
            types = [rb.schema.field(name).type.to_pandas_dtype() for rb, _ in recs
                     if name in rb.schema.names]
            out = np.zeros(n, np.result_type(*types))  # (a slice without it: none are set)
            for (rb, _), lo, hi in zip(recs, base[:-1], base[1:], strict=True):
                if name in rb.schema.names:
                    out[lo:hi] = rb.column(name).to_numpy(zero_copy_only=False)
            return out

        row_type = np.result_type(*[sl.row_type if sl.firsts is not None
                                    else rb.schema.field("row").type.to_pandas_dtype()
                                    for rb, sl in recs])
        row = np.empty(n, row_type)
        for (rb, sl), lo, hi in zip(recs, base[:-1], base[1:], strict=True):
            if sl.firsts is None:
                row[lo:hi] = rb.column("row").to_numpy()
            else:
                rows_from_steps(rb.column("row_step").to_numpy(), sl.offsets, sl.firsts,
                                row.dtype, row[lo:hi])
        bad = column("bad")
        rows = Rows(row, column("batch_id"), column("scheduled"),  # type: ignore[arg-type]
                    column("computed"),  # type: ignore[arg-type]
                    np.broadcast_to(np.False_, (n,)) if bad is None else bad,
                    column("decode_threshold"), column("sm_budget"))
        offsets = np.array([sl.offsets for _, sl in recs], np.int64).reshape(len(recs), b - a + 1)
        offsets += base[:-1, None]
        return Joined(rows, offsets, a, self.part)


def _group_units(eng: Engine, files: SpillFiles) -> Iterator[Unit]:
    """Pass 2, on the read-ahead thread: the groups read back in turn, ids increasing, and a
    unit for each piece with rows. Where compiled loops are on, a group is read end to end
    and each unit gathers its piece grouped on its worker (:mod:`kernel.bulk.joined`), then
    prices it as a sorted trace's chunk is priced; otherwise the unit gathers the piece and
    prices it where it lies."""
    part = files.part
    grouping = grouping_compiled()

    def price_where_it_lies(chunks: list[Scattered], k: int) -> Priced:
        return eng.price_range_task(gather_piece(chunks, k), part.piece_lo(k),
                                    part.piece_span(k))

    def gathered(j: Joined, k: int) -> Priced:
        grouped = gather_grouped(j, k)
        if grouped is not None:
            return eng.price_groups_task(*grouped)
        return price_where_it_lies(j.scattered(), k)

    for g in range(files.n):
        a = int(files.bounds[g])
        got = files.read_joined(g) if grouping else files.read(g)
        sizes: np.ndarray | int  # (rows of each piece of the group; 0: no slice)
        if isinstance(got, Joined):
            sizes, unit = got.sizes(), partial(gathered, got)
        else:
            sizes = sum(np.diff(c.offsets[a:int(files.bounds[g + 1]) + 1]) for c in got)
            unit = partial(price_where_it_lies, got)
        for k in (a + np.flatnonzero(sizes)).tolist():
            yield partial(unit, k)
        del got, unit  # (this group's rows go before the next is read)


def spill_units(eng: Engine, parts: Iterator[Rows | Scattered], part: Partition,
                total_rows: int, budget: int, tmp_parent: Path,
                fallback: Callable[[Iterator[Rows]], Iterator[Unit]]) -> Iterator[Unit]:
    """Validated chunks (scattered by ``part`` on the pool, or not: then here) partitioned
    to spill files, then priced group by group, pieces of whole batches in id order. A chunk
    with ids outside the plan (statistics that do not cover the rows: they never should)
    sends everything to ``fallback`` (DuckDB's sort): the rows spilled so far read back
    first, then the rest."""
    bounds = group_bounds(part, total_rows, budget)
    log.info("spill plan: %d pieces in %d groups (budget %d bytes)", part.n, len(bounds) - 1,
             budget)
    tmp = safe_output.make_temp_dir(tmp_parent, ".blis-spill-")  # removed on SIGINT/SIGTERM
    files = SpillFiles(tmp, part, bounds)
    stop = safe_output.on_interrupt(files.stop)
    try:
        for h in parts:
            if isinstance(h, Scattered) and h.part is part:
                files.add(h)
                continue
            rows = h.absolute() if isinstance(h, Scattered) else h
            if fits(part, rows.batch_id):
                files.add(scatter(rows, part))
                continue
            files.finish()
            spilled = (s.absolute() for g in range(files.n) for s in files.read(g))
            rest = (x.absolute() if isinstance(x, Scattered) else x for x in parts)
            yield from fallback(chain(spilled, [rows], rest))
            return
        files.finish()
        # (gathered grouped on the read-ahead thread where compiled loops are on, SW5)
        yield from prefetched(_group_units(eng, files), GATHER_AHEAD, "blis-spill-read",
                              wait=True)
    finally:
        safe_output.off_interrupt(stop)
        files.close()
        safe_output.remove_temp_dir(tmp)
