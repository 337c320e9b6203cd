"""Streaming: price a trace of any size, in any row order, with bounded memory.

A run is a pipeline (``docs/traces.md`` "Streaming"):

1. **read**: :mod:`kernel.io.sources` yields Arrow chunks (parquet row-group fragments of
   pyarrow.dataset, decoded on Arrow's threads), taken :data:`READ_AHEAD` ahead on a reader
   thread (decision RO15);
2. **validate**: each chunk is checked row by row on a worker thread;
3. **group**: how depends on the source's layout, known before the first row is priced, so
   nothing is ever read twice:

   * ``grouped`` — the source's chunks split no batch (but one carried id, held back and
     prepended to the next chunk): each chunk is grouped on its own;
   * ``summed`` — rows near each other in batch id (a request-major log) with nothing that
     needs a batch's rows side by side: summed per batch as they stream by
     (:mod:`kernel.bulk.summed`);
   * ``sorted`` — anything else, while the validated rows fit ``memory_budget``: grouped in
     memory by batch id range without a comparison sort (:mod:`kernel.bulk.partition`), each
     chunk scattered to its pieces on the worker that validated it;
   * ``window`` — beyond that budget, when the parquet statistics show the batch ids
     advancing through the file (a request-major log) so that the rows of the pieces still
     open fit half of it: grouped in memory, each piece priced as soon as no later row group
     can reach it (:mod:`kernel.bulk.window`, decision SP1);
   * ``spill`` — beyond that budget otherwise, when the id range is known before reading: the rows
     partitioned to disk by batch-id range and grouped one spill group at a time
     (:mod:`kernel.bulk.spill`, decision BT1);
   * ``external`` — beyond that budget otherwise: validated rows go through DuckDB's
     external sort (``ORDER BY batch_id, row``, spilling to a temporary directory beyond
     ``sort_memory``) and come back grouped, batch ids increasing.
4. **price**: groups of whole batches are priced on a thread pool (numpy releases the GIL in
   the heavy loops), results taken in order;
5. **write**: a ``ParquetWriter`` on a writer thread (:mod:`kernel.bulk.sink`), so that the
   calling thread goes on submitting work; row groups of at least :data:`ROW_GROUP_ROWS`
   rows but for the last few results, each written as it comes, to a temporary name
   renamed at the end.

Output order: batch_id order in ``summed``, ``sorted``, ``window``, ``spill`` and ``external`` mode and in ``grouped``
mode when batch ids rise from chunk to chunk (then the parquet records ``sorting_columns``);
trace order otherwise.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from pipeline import safe_output

from ..io import stamp
from ..io.sources import TraceSource
from ..io.stamp import counts_metadata as stamp_counts
from ..io.trace import REJECT_SCHEMA, Rows
from ..model.resolved import ResolvedPool
from .ahead import prefetched
from .batch_table import BatchTable
from .columns import ColumnProducer, with_measured
from .engine import (
    PRICE_ROWS,
    Engine,
    PriceCounts,
    Priced,
    Validating,
    open_priced_trace,
    resolved,
)
from .groups import runs
from .options import ORDERS, SORT_MEMORY, OnReject, Tuning, reject_mode, size_bytes
from .over_limit import default_producers, over_limit_of
from .partition import (
    Partition,
    Scattered,
    cell_shift,
    fits,
    gather_piece,
    histogram,
    id_range,
    plan,
    plan_from_ranges,
    scatter,
)
from .sink import ROW_GROUP_ROWS, Sink
from .spill import local_plan, spill_plan, spill_units
from .summed import ChunkTerms, Summed, rows_stay_near, summed_for
from .window import fits_window, window_units

if TYPE_CHECKING:
    from ..io.protocols import TraceInput
    from ..model.pricer import Pricer

__all__ = ["ROW_GROUP_ROWS", "SORT_MEMORY", "price_file", "priced_stream"]

READ_AHEAD = 2  # chunks read and validated ahead of the one being grouped
PRICE_AHEAD = 2  # groups priced ahead, per worker (a worker never waits on the calling thread)

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)  # no handler here: the CLI attaches one (CF5)


def _ordered(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T],
             depth: int) -> Iterator[R]:
    """``map(fn, items)`` on ``pool``, up to ``depth`` items ahead, results in order."""
    pending: deque[Future[R]] = deque()
    try:
        for x in items:
            pending.append(pool.submit(fn, x))
            while len(pending) > depth or (pending and pending[0].done()):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _workers(n: int | None) -> int:
    return max(1, n if n is not None else min(os.cpu_count() or 1, 8))


# -- grouping the rows ---------------------------------------------------------------------

def _offsets(tables: Iterable[pa.Table]) -> Iterator[tuple[pa.Table, int]]:
    """Each table with the number of trace rows before it."""
    offset = 0
    for t in tables:
        yield t, offset
        offset += t.num_rows


def _grouped_units(eng: Validating, ts: TraceSource, pool: ThreadPoolExecutor
                   ) -> Iterator[Rows]:
    """Chunks of whole batches: each unit's carry id is held back for the next."""
    def task(item: tuple[pa.Table, int, Any]) -> tuple[Any, Any]:
        table, offset, carry = item
        return eng.coerce_task(table, offset), carry

    def items() -> Iterator[tuple[pa.Table, int, Any]]:
        offset = 0
        for table, carry in ts.units():
            yield table, offset, carry
            offset += table.num_rows

    held = Rows.empty()
    for c, carry in _ordered(pool, task, prefetched(items(), READ_AHEAD), READ_AHEAD):
        rows = eng.take_coerced(c)
        if len(rows) == 0:
            continue  # (an empty row group: a held batch goes on holding)
        if len(held):
            if carry is not None and held.batch_id[0] == carry:  # it goes on past this chunk
                rows = Rows.concat([held, rows])
            else:
                first, rows = _join_held(held, rows)
                if first is not None:
                    yield first
            held = Rows.empty()
        if carry is not None and len(rows):
            rows, held = _split_off(rows, rows.batch_id == carry)
        if len(rows):
            yield rows
    if len(held):
        yield held


def _join_held(held: Rows, rows: Rows) -> tuple[Rows | None, Rows]:
    """The held batch completed with its rows from ``rows``: (that batch alone when its rows
    lead ``rows`` — no copy of the chunk — else None, and the rest)."""
    bid = held.batch_id[0]
    idx = np.flatnonzero(rows.batch_id == bid)
    if idx.size == 0:
        return held, rows
    if idx[-1] == idx.size - 1:  # a prefix (the usual case)
        k = int(idx.size)
        return Rows.concat([held, rows.slice(0, k)]), rows.slice(k, len(rows))
    return None, Rows.concat([held, rows])


def _split_off(rows: Rows, mask: np.ndarray) -> tuple[Rows, Rows]:
    """(rows not in mask, rows in mask), both in input order; the second copied so the
    chunk's memory can go."""
    idx = np.flatnonzero(mask)
    n = len(rows)
    if idx.size == 0:
        return rows, Rows.empty()
    if idx[0] == n - idx.size:  # a suffix (the usual case)
        lo = int(idx[0])
        return rows.slice(0, lo), rows.take(np.arange(lo, n))
    return rows.take(np.flatnonzero(~mask)), rows.take(idx)


_NARROW = ("scheduled", "computed", "decode_threshold", "sm_budget")


def _sort_schema(rows: Rows, ts: TraceSource) -> pa.Schema:
    """The rows' Arrow schema for the sort, narrowed where values provably fit int32: counts
    whose source type is a narrow integer, row numbers of a trace under 2**31 rows (half the
    bytes to sort and to fetch)."""
    out = []
    for f in rows.to_arrow().schema:
        if pa.types.is_integer(f.type):
            f = pa.field(f.name, pa.int64())  # (rows may arrive narrowed by value)
        src = ts.names.get(f.name)
        typ = ts.schema.field(src).type if (ts.schema is not None and src is not None
                                              and src in ts.schema.names) else None
        narrow = (f.name in _NARROW and typ is not None and pa.types.is_integer(typ)
                  and typ.bit_width <= (32 if pa.types.is_signed_integer(typ) else 16))
        if f.name == "row" and ts.num_rows is not None and ts.num_rows < 2**31:
            narrow = True
        out.append(pa.field(f.name, pa.int32()) if narrow else f)
    return pa.schema(out)


Unit = Callable[[], Priced]  # the pricing of one group of whole batches, run on the pool


Held = Rows | Scattered  # validated rows, scattered to their pieces once a plan is known


def _validated(eng: Engine, tables: Iterator[pa.Table], pool: ThreadPoolExecutor,
               failure: list[BaseException], part: Partition | None,
               summed: Summed | None = None, *, again: bool = False, compiled: bool = True
               ) -> Iterator[tuple[Held, ChunkTerms | None, int]]:
    """Every chunk with rows validated on the pool (one ahead), in order, with its terms for
    ``summed`` and its index among the source's chunks; columns narrowed (uint16 or int32)
    where the values fit, since these rows wait to be grouped (not while ``summed`` takes
    them: it holds none); scattered by ``part`` too when a plan is known before reading
    (while the chunk is still in cache). ``again``: chunks read a second time, neither
    counted nor their rejects emitted again; ``compiled``: scattered by compiled loops where
    they are on (else by Arrow, CS1)."""
    def task(item: tuple[pa.Table, int]) -> tuple[Any, Scattered | None, ChunkTerms | None]:
        c = eng.coerce_task(item[0], item[1])
        terms = summed.terms(c.rows) if summed is not None else None
        narrow = summed is None or not summed.ok
        if part is not None and len(c.rows) and fits(part, c.rows.batch_id):
            # (narrowed as it is scattered: one copy of each column, SW3)
            s = scatter(c.rows, part, fresh=True, narrow=narrow, compiled=compiled)
            c.rows = s.rows  # (the wide rows go now: only their count is read)
            return c, s, terms
        if narrow:
            c.rows.narrowed()
        return c, None, terms

    try:
        for i, (c, scattered, terms) in enumerate(_ordered(
                pool, task, _offsets(prefetched(tables, READ_AHEAD)), READ_AHEAD)):
            rows = c.rows if again else eng.take_coerced(c)
            if len(rows):
                yield (rows if scattered is None else scattered), terms, i
    except BaseException as e:  # DuckDB would wrap it: keep the original
        failure.append(e)
        raise


def _read_again(eng: Engine, ts: TraceSource, pool: ThreadPoolExecutor,
                failure: list[BaseException], chunks: int | None
                ) -> Iterator[tuple[Held, ChunkTerms | None, int]]:
    """The source's first ``chunks`` chunks (None: all) validated again: rows mode
    ``summed`` took without holding them, wanted after all."""
    tables = ts.chunks() if chunks is None else islice(ts.chunks(), chunks)
    return _validated(eng, tables, pool, failure, None, again=True)


def _estimated_bytes(ts: TraceSource) -> int | None:
    """A lower bound of the validated rows' size, when the row count is known: held rows
    take at least 2 bytes a column (row number, batch-id offset, counts; no ``bad`` column
    when no row is bad)."""
    if ts.num_rows is None:
        return None
    per_row = 2 * (4 + sum(c in ts.names for c in _NARROW[2:]))
    return ts.num_rows * per_row


def _any_order_units(eng: Engine, ts: TraceSource, pool: ThreadPoolExecutor, st: Stream,
                     *, workers: int, chunk_rows: int, tmp_parent: Path, sort_memory: str,
                     memory_budget: int) -> Iterator[Unit]:
    """Rows of any order summed per batch as they stream by (:mod:`kernel.bulk.summed`) or
    grouped in memory (:mod:`kernel.bulk.partition`) while they fit in ``memory_budget``
    bytes; beyond it, everything goes through DuckDB's external sort — the rows gathered so
    far first, then the rest of the stream. Nothing is read twice but the chunks mode
    ``summed`` took without holding their rows, when its sums cannot stand (RO16)."""
    failure: list[BaseException] = []
    est = _estimated_bytes(ts)
    in_memory = st.mode != "external" and (est is None or est <= memory_budget)
    # (beyond the budget, a source whose id range is known is partitioned to disk: BT1)
    spill = (spill_plan(ts.id_ranges, memory_budget)
             if not in_memory and st.mode != "external" and ts.id_ranges is not None
             else None)
    # (ids that advance through the file, a request-major log: grouped in a moving window
    # of pieces, each priced once the statistics show it complete: SP1)
    window = spill is not None and fits_window(ts.id_ranges, spill, memory_budget)
    if spill is not None and not window and ts.id_ranges:  # (ids as 2 bytes on disk: SW4)
        spill = local_plan(ts.id_ranges, spill)
    total_rows = (ts.num_rows if ts.num_rows is not None
                  else sum(r[2] for r in ts.id_ranges or []))
    log.debug("any-order trace: about %s bytes against a memory budget of %d: %s", est,
              memory_budget, "in memory" if in_memory else
              "a moving window of batch-id pieces" if window else
              "spill to disk by batch-id range" if spill is not None else "DuckDB's sort")
    tables = ts.chunks()
    sizes: list[int] = []  # (rows of each source chunk, for the window)
    if window:
        tables = _sized(tables, sizes)
    summed = summed_for(eng, ts, memory_budget) if in_memory else None
    if summed is not None:  # rows far apart are grouped instead: decided on the first chunk
        first = next(tables, None)
        tables = chain([] if first is None else [first], tables)
        if first is not None and not rows_stay_near(first):
            summed = None
    prior = (plan_from_ranges(ts.id_ranges, PRICE_ROWS)
             if in_memory and ts.id_ranges is not None else None if window else spill)
    # (rows grouped in memory are scattered by Arrow: numba's start, ~0.4 s of CPU on the
    # critical path, costs such a run more than its compiled scatter saves; CS1)
    parts: Iterator[tuple[Held, ChunkTerms | None, int]] = _validated(
        eng, tables, pool, failure, None if summed is not None else prior, summed,
        compiled=not in_memory)
    if in_memory and summed is not None:
        # Summed as they come, no row held (each would be a fresh page to fault in: that was
        # most of what a request-major trace cost beyond a sorted one). Should the sums not
        # stand, the rows summed so far are read again and grouped with the rest below.
        for h, terms, i in parts:
            if terms is not None:
                summed.add(terms)
            if not summed.ok:  # (a rejected row, an id beyond the statistics)
                parts = chain(_read_again(eng, ts, pool, failure, i), [(h, None, i)], parts)
                break
        else:
            if summed.complete():
                st.mode = "summed"
                yield from summed.units()
                return
            parts = _read_again(eng, ts, pool, failure, None)  # (sums that might pass int64)
        summed.abandon()  # (the chunks still to come need no terms)
    held: list[Held] = []
    if in_memory:
        used = 0
        for h, _, _ in parts:
            held.append(h)
            used += h.nbytes()
            if used > memory_budget:
                break
        else:
            yield from _memory_units(eng, held, prior, pool, workers)
            return
        if prior is not None and all(isinstance(h, Scattered) and h.part is prior
                                     for h in held):
            spill = prior  # (the rows held so far are spilled first, scattered as they are)

    def external(rows: Iterator[Rows]) -> Iterator[Unit]:
        st.mode = "external"
        log.info("grouping by DuckDB's external sort (sort memory %s, temporary files in %s)",
                 sort_memory, tmp_parent)
        return _external_units(eng, ts, rows, failure, chunk_rows, tmp_parent, sort_memory)

    if window and spill is not None and ts.id_ranges is not None:
        st.mode = "window"
        log.info("beyond the memory budget (%d bytes): grouping %s rows in a moving window "
                 "of %d batch-id pieces", memory_budget, total_rows, spill.n)

        def spilled(rows: Iterator[Held], part: Partition = spill) -> Iterator[Unit]:
            st.mode = "spill"
            return spill_units(eng, rows, part, total_rows, memory_budget, tmp_parent,
                               external)

        yield from window_units(eng, parts, spill, ts.id_ranges, sizes, ts.label, pool,
                                spilled)
        return
    rest = chain(_drained(held), (p[0] for p in parts))
    if spill is not None:
        st.mode = "spill"
        log.info("beyond the memory budget (%d bytes): spilling %s rows to disk in %d "
                 "batch-id pieces", memory_budget, total_rows, spill.n)
        yield from spill_units(eng, rest, spill, total_rows, memory_budget, tmp_parent,
                               external)
        return
    yield from external(_unscattered(h) for h in rest)


def _sized(tables: Iterator[pa.Table], sizes: list[int]) -> Iterator[pa.Table]:
    """The tables, each one's row count appended to ``sizes`` as it is taken."""
    for t in tables:
        sizes.append(t.num_rows)
        yield t


def _drained(held: list[Held]) -> Iterator[Held]:
    """The held chunks, each let go as it is taken (a list would keep them all)."""
    held.reverse()
    while held:
        yield held.pop()


def _unscattered(h: Held) -> Rows:
    return h.absolute() if isinstance(h, Scattered) else h


def _memory_units(eng: Engine, held: list[Held], prior: Partition | None,
                  pool: ThreadPoolExecutor, workers: int) -> Iterator[Unit]:
    """Validated rows held in memory, scattered into pieces of whole batches in id order
    (by the plan made before reading when every chunk fitted it, else by one made now)."""
    if not held:
        return
    part = prior
    if part is None or not all(isinstance(h, Scattered) for h in held):
        part = _plan_held(held, pool)
        slots: list[Held | None] = list(held)
        held.clear()

        def scatter_task(i: int, p: Partition = part) -> Held:
            h, slots[i] = slots[i], None  # each chunk's memory goes once it is scattered
            assert h is not None
            # (rows scattered by another plan: each batch stays whole, in input order)
            return scatter(_unscattered(h), p, fresh=not isinstance(h, Scattered),
                           compiled=False)

        held = list(_ordered(pool, scatter_task, range(len(slots)), workers))
    chunks = [h for h in held if isinstance(h, Scattered)]
    held.clear()

    def piece(k: int, p: Partition = part) -> Priced:
        return eng.price_range_task(gather_piece(chunks, k, compiled=False), p.piece_lo(k),
                                    p.piece_span(k))

    sizes = sum(np.diff(c.offsets) for c in chunks)  # rows of each piece
    for k in np.flatnonzero(sizes).tolist():
        yield partial(piece, k)


def _plan_held(held: list[Held], pool: ThreadPoolExecutor) -> Partition:
    """A plan from the held rows' ids (a histogram, chunk by chunk on the pool)."""
    ranges = [id_range(_unscattered(h).batch_id) for h in held]
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    shift = cell_shift(lo, hi)
    counts = sum(pool.map(lambda h: histogram(_unscattered(h).batch_id, lo, shift), held))
    return plan(lo, shift, np.asarray(counts), PRICE_ROWS)


def _external_units(eng: Engine, ts: TraceSource, parts: Iterator[Rows],
                    failure: list[BaseException], chunk_rows: int, tmp_parent: Path,
                    sort_memory: str) -> Iterator[Unit]:
    """Every validated row through DuckDB's external sort by (batch_id, row)."""
    import duckdb  # (heavy: DuckDB, loaded only on this path)

    head = next(parts, None)
    if head is None:
        return
    schema = _sort_schema(head, ts)

    def batches() -> Iterator[pa.RecordBatch]:
        yield from head.to_arrow().cast(schema).to_batches()
        for rows in parts:
            yield from rows.to_arrow().cast(schema).to_batches()

    def unit(rows: Rows) -> Unit:
        return partial(eng.price_task, rows, runs(rows.batch_id), False)

    tmp = safe_output.make_temp_dir(tmp_parent, ".blis-sort-")  # removed on SIGINT/SIGTERM
    con: Any = None
    stop: Any = None
    try:
        try:
            con = duckdb.connect(config={"temp_directory": str(tmp),
                                         "memory_limit": sort_memory,
                                         "preserve_insertion_order": False})
        except duckdb.Error as e:
            raise ValueError(f"sort_memory={sort_memory!r}: {e}") from None
        con.execute("SET enable_progress_bar = false")
        stop = safe_output.on_interrupt(con.interrupt)  # a signal stops the sort's spilling
        con.register("blis_rows", pa.RecordBatchReader.from_batches(schema, batches()))
        try:
            out: Any = con.sql('SELECT * FROM blis_rows ORDER BY batch_id, "row"'
                               ).to_arrow_reader(chunk_rows)
        except duckdb.Error:
            if failure:
                raise failure[0] from None
            raise
        held = Rows.empty()
        for b in out:
            rows = Rows.from_arrow(pa.Table.from_batches([b]).cast(schema)).widened()
            if len(held):
                first, rows = _join_held(held, rows)  # sorted: its rows lead
                held = Rows.empty()
                if first is not None and len(rows) == 0:
                    held = first  # the batch may go on in the next output batch
                    continue
                if first is not None:
                    yield unit(first)
            ids = rows.batch_id
            cut = int(np.searchsorted(ids, ids[-1], "left"))  # the last batch may go on
            rows, held = rows.slice(0, cut), rows.take(np.arange(cut, len(rows)))
            if len(rows):
                yield unit(rows)
        if len(held):
            yield unit(held)
    finally:
        if stop is not None:
            safe_output.off_interrupt(stop)
        if con is not None:
            con.close()
        safe_output.remove_temp_dir(tmp)


@dataclass
class Stream:
    """A run's priced results, in output order; ``mode`` is grouped, summed, sorted, window,
    spill or external (known for sure once the results are consumed), ``sorted_ids`` whether the
    output is in batch_id order."""

    mode: str
    sorted_ids: bool
    results: Iterator[Priced] = iter(())
    all_submitted: bool = False  # every unit is on the pool: the results still due are few


def _marking_end(units: Iterator[Unit], st: Stream) -> Iterator[Unit]:
    yield from units
    st.all_submitted = True




def priced_stream(eng: Engine, ts: TraceSource, pool: ThreadPoolExecutor, *, workers: int,
                  chunk_rows: int, tmp_parent: Path, sort_memory: str = SORT_MEMORY,
                  memory_budget: int | str | None = None, order: str = "auto") -> Stream:
    """The pipeline of the module docstring, up to the priced tables."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, not {order!r}")
    budget = (size_bytes(sort_memory, "sort_memory") if memory_budget is None
              else size_bytes(memory_budget, "memory_budget"))
    units: Iterator[Unit]
    if ts.layout == "batches" and order == "auto":
        st = Stream("grouped", ts.sorted_ids)
        units = (partial(eng.price_task, rows, None, ts.sorted_ids)
                 for rows in _grouped_units(eng, ts, pool))
    else:
        st = Stream("external" if order == "external" else "sorted", True)
        units = _any_order_units(eng, ts, pool, st, workers=workers, chunk_rows=chunk_rows,
                                 tmp_parent=tmp_parent, sort_memory=sort_memory,
                                 memory_budget=budget)
    st.results = _ordered(pool, lambda u: u(), _marking_end(units, st), PRICE_AHEAD * workers)
    return st


# -- writing -------------------------------------------------------------------------------

def _progress(total: int | None, enabled: bool) -> Any:
    from ..io.progress import open_progress  # a terminal bar, a notebook bar, or nothing

    return open_progress(total, enabled)


def close_files(counts: PriceCounts, out: Sink, rejects: Sink | None) -> None:
    """Finish a run's output and rejects files; a stamped one gets the run's counts too."""
    for sink in (out, rejects):
        if sink is not None:
            sink.close(counts_metadata(counts) if sink.stamped else None)


def abort_files(*sinks: Sink | None) -> None:
    """Remove a failed run's files (their temporary names) and stop their writers."""
    for sink in sinks:
        if sink is not None:
            sink.abort()


def counts_metadata(counts: PriceCounts) -> dict[str, str]:
    """The run's row counts as the stamp's ``counts`` key (:mod:`kernel.io.stamp`)."""

    return stamp_counts(rows_in=counts.rows_in, rows_priced=counts.rows_priced,
                        rows_rejected=counts.rows_rejected,
                        batches_priced=counts.batches_priced,
                        batch_table_rows_rejected=counts.batch_table_rows_rejected)


# -- the entry point -------------------------------------------------------------------------

def price_file(k: Pricer | ResolvedPool, src: TraceInput, dst: str | Path, *,
               rejects: str | Path | None = None, progress: bool = True,
               out_format: str | None = None,
               metadata: Mapping[str, str | bytes] | None = None,
               rejects_metadata: Mapping[str, str | bytes] | None = None,
               decode_threshold: int = 1, sm_budget: int = 0,
               columns: Mapping[str, str] | None = None, batches: Any = None,
               keep: Iterable[str] | None = None,
               producers: Iterable[ColumnProducer] | None = None,
               measured: str | None = None, measured_unit: str = "ns",
               reject_over_limit: bool = False, identity: bool = True,
               on_reject: OnReject = "ignore", tuning: Tuning | None = None,
               strict: bool | None = None) -> PriceCounts:
    """Stream ``src`` (any source :func:`kernel.io.sources.open_trace` takes) into ``dst``, in
    bounded memory, whatever the row order (module docstring).

    ``dst`` and ``rejects`` are parquet, Arrow IPC, CSV or JSON Lines by suffix
    (:mod:`kernel.io.outputs`; ``dst`` ``-`` streams ``out_format``, default CSV, to stdout);
    ``rejects`` receives the rejected rows. ``metadata`` (``rejects_metadata``) is written
    into the output's (the rejects file's) key-value metadata; left out, a kernel's run writes
    the stamp :func:`kernel.io.stamp.for_pricing` makes (what :func:`kernel.read_priced`
    returns). The pricing options (``decode_threshold`` … ``on_reject``) are those of
    :func:`kernel.bulk.price`, documented once in :mod:`kernel.bulk.options`; ``tuning`` says
    how the engine runs (:class:`~kernel.bulk.options.Tuning`: order, memory, threads, spill
    folder — by default beside ``dst``). The allocator is the caller's: an application that
    streams big traces calls :func:`kernel.io.malloc.tune` itself (the CLI does). Returns the
    counts (``rows_in == rows_priced + rows_rejected``).
    """
    strict_rows = reject_mode(on_reject, strict, "price_file") == "raise"
    tune = tuning or Tuning()
    t0 = time.perf_counter()
    if metadata is None and not isinstance(k, ResolvedPool):  # a bare pool has no documents
        made = stamp.for_pricing(k, src, decode_threshold=decode_threshold, sm_budget=sm_budget,
                                 columns=columns, batches=batches, measured=measured,
                                 measured_unit=measured_unit)
        metadata = made.to_metadata()
        if rejects_metadata is None:
            rejects_metadata = made.as_kind("rejects").to_metadata()
    producers = with_measured(producers, measured, measured_unit)
    r = resolved(k)
    dst = Path(dst)
    n = _workers(tune.workers)
    ts, spec = open_priced_trace(src, columns=columns, chunk_rows=tune.chunk_rows,
                                 producers=default_producers(k, producers, identity),
                                 keep=keep)
    bt_rej: list[pa.Table] = []
    bt = (BatchTable(batches, columns, bt_rej, strict_rows, decode_threshold, sm_budget)
          if batches is not None else None)
    rej_sink = (Sink(Path(rejects), REJECT_SCHEMA, metadata=rejects_metadata)
                if rejects is not None else None)
    sinks: list[Sink] = []
    eng = Engine(r, ts.names, decode_threshold=decode_threshold, sm_budget=sm_budget,
                 strict=strict_rows, batch_table=bt, on_priced=lambda t: sinks[0].write(t),
                 on_rejects=(rej_sink.write if rej_sink is not None else lambda t: None),
                 spec=spec, over_limit=over_limit_of(k, reject_over_limit))
    prog = _progress(ts.num_rows, progress)
    pool = ThreadPoolExecutor(n, thread_name_prefix="blis-price")
    try:
        eng.emit_rejects(bt_rej)
        st = priced_stream(eng, ts, pool, workers=n, chunk_rows=tune.chunk_rows,
                           tmp_parent=Path(tune.tmp_dir) if tune.tmp_dir else dst.parent,
                           sort_memory=tune.sort_memory, memory_budget=tune.memory_budget,
                           order=tune.order)
        sinks.append(Sink(dst, spec.schema(), metadata=metadata, fmt=out_format,
                           sorted_by=("batch_id",) if st.sorted_ids else ()))
        for p in st.results:
            eng.take_priced(p)
            if st.all_submitted:  # write what is priced now, not all of it after the last
                sinks[0].flush()
            if prog is not None:
                el = max(time.perf_counter() - t0, 1e-9)
                prog.update(prog.task_ids[0], completed=eng.counts.rows_in,
                            rate=f"{eng.counts.rows_in / el:,.0f}")
        eng.finish()
        eng.counts.mode = st.mode
        log.info("ordering mode %s for %s (%d rows in)", st.mode, dst, eng.counts.rows_in)
        close_files(eng.counts, sinks[0], rej_sink)
    except BaseException:
        abort_files(*sinks, rej_sink)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if prog is not None:
            prog.stop()
    counts = eng.counts
    counts.seconds = time.perf_counter() - t0
    counts.check()
    return counts

