"""Grouping rows of any order beyond the memory budget: a partition by batch id range to disk.

Mode ``spill`` (``docs/traces.md``, decision BT1). The batch-id range is planned before
reading (parquet row-group statistics, an in-memory table's range) into pieces of whole
batches (:mod:`kernel.bulk.partition`), and consecutive pieces into *spill groups* of about
a quarter of ``memory_budget`` each. Then, in two passes over the rows, each linear:

1. **partition**: every chunk, just validated, is scattered to its pieces on the worker
   that validated it (as in ``sorted`` mode); a writer thread appends each group's slice of
   it, narrow columns as they are, to that group's files: each column raw, to a file of
   its own per type (decision SW6; kept ``keep=`` columns as an Arrow IPC stream per slice,
   one file a group); the slice's piece offsets and where its columns start stay in
   memory, a few integers per slice;
2. **group**: the groups are read back one by one, ids increasing (on a read-ahead thread,
   each file mapped, then removed); where compiled loops are on, each group's columns end to
   end as their files lie (no copy where every slice has a column in one type) and each
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
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from pipeline import safe_output

from ..io.trace import KEEP_PREFIX, Rows
from ..model import jit
from . import row_loops
from .ahead import prefetched
from .engine import PRICE_ROWS, Engine, Priced
from .joined import Joined, RowSteps, gather_grouped, grouping_compiled, rows_from_steps
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


COLUMNS = ("batch_id", "scheduled", "computed", "row", "row_step", "bad", "decode_threshold",
           "sm_budget")  # what a slice may hold, each in a raw file of its own (decision SW6)


@dataclass
class _Slice:
    """One chunk's rows of one spill group: where each of its columns lies in the group's
    file of that column and type (``at[name] = (type, first value)``; a column absent: the
    slice has none), where each of the group's pieces starts in it, when its row numbers went
    to disk as steps (decision SW2) each piece's first row number and their type, and where
    its kept (``keep=``) columns lie in the group's Arrow file of them."""

    rows: int
    at: dict[str, tuple[str, int]]
    offsets: np.ndarray  # int64, one per piece of the group and one more
    firsts: np.ndarray | None = None  # int64, one per piece of the group (None: row as is)
    row_type: np.dtype | None = None
    kept: tuple[int, int] | None = None  # (position, size) of its kept columns' record


def _columns(rows: Rows, steps: np.ndarray | None) -> dict[str, np.ndarray]:
    """A slice's columns to spill, narrow as they are: ``bad`` only when a row is bad, the
    per-batch columns only when the trace has them; ``steps``: the row numbers' steps,
    spilled instead of them."""
    cols = {"batch_id": rows.batch_id, "scheduled": rows.scheduled, "computed": rows.computed}
    if steps is None:
        cols["row"] = rows.row
    else:
        cols["row_step"] = steps
    if rows.bad.any():
        cols["bad"] = rows.bad
    for name in ("decode_threshold", "sm_budget"):
        v = getattr(rows, name)
        if v is not None:
            cols[name] = v
    return cols


def _kept(rows: Rows) -> pa.RecordBatch:
    return pa.record_batch({KEEP_PREFIX + k: a for k, a in (rows.extra or {}).items()})


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


class SpillFiles:
    """The spill groups' files in ``directory``: scattered chunks appended on
    :data:`WRITERS` writer threads (group ``g`` always on thread ``g % WRITERS``, so each
    file gets its slices in input order), one raw file per column and type of each group
    (decision SW6), then each group read back whole, each of its files mapped."""

    def __init__(self, directory: Path, part: Partition, bounds: np.ndarray):
        self.dir = directory
        self.part = part
        self.bounds = bounds
        self.n = int(bounds.size - 1)
        self.index: list[list[_Slice]] = [[] for _ in range(self.n)]
        # (group, column, type) -> the open file and the values it holds so far
        self.files: dict[tuple[int, str, str], tuple[BinaryIO, int]] = {}
        self.kept: dict[int, pa.NativeFile] = {}  # group -> its kept columns' Arrow file
        self.stopped = False  # (a signal: write nothing more, the directory is going)
        _allow_open_files(self.n * (len(COLUMNS) + 1))
        self._writers = [ThreadPoolExecutor(1, thread_name_prefix="blis-spill")
                         for _ in range(WRITERS)]
        self._writes: deque[list[Future[None]]] = deque()

    def path(self, g: int, name: str, type_name: str) -> Path:
        return self.dir / f"group-{g:05d}-{name}-{type_name}.bin"

    def kept_path(self, g: int) -> Path:
        return self.dir / f"group-{g:05d}-kept.arrow"

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
            rows = s.rows.slice(lo, hi)
            seg = s.offsets[a:b + 1] - lo
            # (row numbers rise within a piece: 2 bytes a row instead of 4 or 8, SW2)
            stepped = row_steps(rows.row, seg) if rows.row.dtype.itemsize > 2 else None
            at = {name: self._append(g, name, v)
                  for name, v in _columns(rows, None if stepped is None else stepped[0]).items()}
            self.index[g].append(_Slice(hi - lo, at, seg,
                                        None if stepped is None else stepped[1],
                                        None if stepped is None else rows.row.dtype,
                                        self._append_kept(g, rows) if rows.extra else None))

    def _append(self, g: int, name: str, v: np.ndarray) -> tuple[str, int]:
        """``v`` appended to group ``g``'s file of column ``name`` in ``v``'s type: the type
        and where ``v`` starts in that file (in values)."""
        key = (g, name, v.dtype.name)
        f, held = self.files.get(key) or (open(self.path(*key), "wb"), 0)  # (closed by finish)
        f.write(np.ascontiguousarray(v).data)
        self.files[key] = (f, held + v.size)
        return v.dtype.name, held

    def _append_kept(self, g: int, rows: Rows) -> tuple[int, int]:
        f = self.kept.get(g)
        if f is None:
            f = self.kept[g] = pa.OSFile(str(self.kept_path(g)), "w")
        rb = _kept(rows)
        pos = f.tell()
        with pa.ipc.new_stream(f, rb.schema) as w:
            w.write_batch(rb)
        return pos, f.tell() - pos

    def _shutdown(self, cancel: bool) -> None:
        for w in self._writers:
            w.shutdown(wait=True, cancel_futures=cancel)

    def _close_files(self) -> None:
        for f, _ in self.files.values():
            f.close()
        for k in self.kept.values():
            if not k.closed:
                k.close()

    def finish(self) -> None:
        """Wait for every write, close the files."""
        while self._writes:
            for f in self._writes.popleft():
                f.result()
        self._shutdown(False)
        self._close_files()

    def close(self) -> None:
        """Stop the writers (dropping what is queued) and close the files (on failure)."""
        self._shutdown(True)
        self._writes.clear()
        self._close_files()

    def _mapped(self, g: int) -> dict[tuple[str, str], np.ndarray]:
        """Each of group ``g``'s column files as one read-only array (:func:`_map_then_remove`)."""
        out = {}
        for key in [k for k in self.files if k[0] == g]:
            path = self.path(*key)
            _, name, type_name = key
            if self.files.pop(key)[1]:
                out[name, type_name] = np.frombuffer(_map_then_remove(path), np.dtype(type_name))
            else:
                path.unlink()
        return out

    def _kept_records(self, g: int) -> list[pa.RecordBatch | None]:
        slices = self.index[g]
        f = self.kept.pop(g, None)
        if f is None:
            return [None] * len(slices)
        if not f.closed:
            f.close()
        buf = _map_then_remove(self.kept_path(g))
        return [None if sl.kept is None else
                pa.ipc.open_stream(buf.slice(*sl.kept)).read_next_batch() for sl in slices]

    def _slices(self, g: int) -> tuple[list[_Slice], dict[tuple[str, str], np.ndarray]]:
        """Group ``g``'s slices, in input order, and its files mapped (the index forgotten)."""
        slices, self.index[g] = self.index[g], []
        return slices, self._mapped(g)

    def read(self, g: int) -> list[Scattered]:
        """Group ``g``'s slices, in input order, as chunks scattered by the whole plan (the
        pieces of other groups empty); its files are removed once read."""
        kept = self._kept_records(g)
        slices, cols = self._slices(g)
        a, b = int(self.bounds[g]), int(self.bounds[g + 1])
        return [Scattered(_slice_rows(sl, cols, rb), plan_offsets(sl.offsets, a, b, self.part.n),
                          self.part) for sl, rb in zip(slices, kept, strict=True)]

    def read_joined(self, g: int) -> Joined | list[Scattered]:
        """Group ``g``'s slices end to end, one array a column (:class:`Joined`, decision
        SW5): where every slice holds a column in one type, that column's file as it lies;
        as :meth:`read` gives them when they carry ``keep=`` columns. Its files are removed
        once read."""
        if not self.index[g]:
            return []
        if any(sl.kept is not None for sl in self.index[g]):
            return self.read(g)
        a, b = int(self.bounds[g]), int(self.bounds[g + 1])
        slices, cols = self._slices(g)
        base = np.concatenate(([0], np.cumsum([sl.rows for sl in slices])))
        n = int(base[-1])

        def column(name: str) -> np.ndarray | None:
            types = {sl.at[name][0] for sl in slices if name in sl.at}
            if not types:
                return None
            if len(types) == 1 and all(name in sl.at for sl in slices):
                return cols[name, types.pop()]  # (the file as it lies: slices end to end)
            out = np.zeros(n, np.result_type(*types))  # (a slice without it: none are set)
            for sl, lo in zip(slices, base[:-1].tolist(), strict=True):
                if (v := _view(sl, cols, name)) is not None:
                    out[lo:lo + sl.rows] = v
            return out

        whole = column("row") if all(sl.firsts is None for sl in slices) else None
        steps = None
        if whole is not None:
            row = whole
        elif all(sl.firsts is not None for sl in slices):  # (decoded piece by piece: SW8)
            row = column("row_step")  # type: ignore[assignment]
            steps = RowSteps(row, np.array([sl.firsts for sl in slices], np.int64),
                             np.result_type(*[sl.row_type for sl in slices]))
        else:
            row = np.empty(n, np.result_type(*[sl.row_type if sl.firsts is not None
                                               else np.dtype(sl.at["row"][0])
                                               for sl in slices]))
            for sl, lo in zip(slices, base[:-1].tolist(), strict=True):
                _slice_row(sl, cols, row[lo:lo + sl.rows])
        bad = column("bad")
        rows = Rows(row, column("batch_id"), column("scheduled"),  # type: ignore[arg-type]
                    column("computed"),  # type: ignore[arg-type]
                    np.broadcast_to(np.False_, (n,)) if bad is None else bad,
                    column("decode_threshold"), column("sm_budget"))
        offsets = np.array([sl.offsets for sl in slices], np.int64).reshape(len(slices),
                                                                            b - a + 1)
        offsets += base[:-1, None]
        return Joined(rows, offsets, a, self.part, steps)


def _map_then_remove(path: Path) -> pa.Buffer:
    """The file mapped, not read (a view of the page cache, no copy into fresh heap pages),
    its name removed at once: the mapping lives on until the last view of it is freed."""
    with pa.memory_map(str(path), "r") as f:
        buf = f.read_buffer()
    path.unlink()
    return buf


def _view(sl: _Slice, cols: dict[tuple[str, str], np.ndarray], name: str) -> np.ndarray | None:
    if name not in sl.at:
        return None
    t, at = sl.at[name]
    return cols[name, t][at:at + sl.rows]


def _slice_row(sl: _Slice, cols: dict[tuple[str, str], np.ndarray],
               out: np.ndarray | None = None) -> np.ndarray:
    """A slice's row numbers: as spilled, or decoded from their steps (into ``out``)."""
    if sl.firsts is None:
        row = _view(sl, cols, "row")
        assert row is not None
        if out is None:
            return row
        out[:] = row
        return out
    steps = _view(sl, cols, "row_step")
    assert steps is not None and sl.row_type is not None
    return rows_from_steps(steps, sl.offsets, sl.firsts, sl.row_type, out)


def _slice_rows(sl: _Slice, cols: dict[tuple[str, str], np.ndarray],
                kept: pa.RecordBatch | None) -> Rows:
    """A slice's rows, views of its group's mapped files (the row numbers decoded)."""
    bad = _view(sl, cols, "bad")
    extra = None if kept is None else {
        x[len(KEEP_PREFIX):]: kept.column(x) for x in kept.schema.names}
    return Rows(_slice_row(sl, cols), _view(sl, cols, "batch_id"),  # type: ignore[arg-type]
                _view(sl, cols, "scheduled"), _view(sl, cols, "computed"),  # type: ignore[arg-type]
                np.broadcast_to(np.False_, (sl.rows,)) if bad is None else bad,
                _view(sl, cols, "decode_threshold"), _view(sl, cols, "sm_budget"), extra)


def _allow_open_files(n: int) -> None:
    """Raise this process's soft limit on open files to make room for ``n`` more, where the
    hard limit allows (a spill keeps each group's column files open: up to ~2,300)."""
    try:
        import resource  # (optional: Unix only)
    except ImportError:  # (not a Unix)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if top > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


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
