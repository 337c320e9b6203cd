"""Streaming: price a trace of any size from files or streams into parquet, bounded memory.

See ``docs/traces.md`` "Streaming". Batched reads, a tail batch carried into the next chunk
while batch ids run in increasing order, and otherwise a fallback that hash-partitions rows by
batch id into temporary Arrow files and prices them bucket by bucket.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..trace import REJECT_SCHEMA, Rows
from .batch_table import BatchTable
from .columns import ColumnProducer
from .engine import Engine, PriceCounts, open_priced_trace, resolved
from .groups import runs

if TYPE_CHECKING:
    from ..kernel import Kernel
    from ..resolved import ResolvedPool

__all__ = ["ROW_GROUP_ROWS", "price_file"]

ROW_GROUP_ROWS = 1 << 18  # priced rows per parquet row group (DuckDB scans like >= 128k)


class _NotContiguous(Exception):
    pass


class _Sink:
    """A parquet (or CSV) file written incrementally to a temporary name, then renamed.

    Writes happen on a background thread (Arrow releases the GIL while encoding), with at
    most ``depth`` tables queued, so encoding overlaps pricing on a second core. Tables are
    gathered into row groups of at least ``row_group_rows`` rows (the last may be smaller).
    ``metadata`` goes into the file's key-value metadata.
    """

    def __init__(self, path: Path, schema: pa.Schema, *, compression: str = "lz4",
                 depth: int = 2, row_group_rows: int = ROW_GROUP_ROWS,
                 metadata: Mapping[str, str | bytes] | None = None):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        if metadata:
            schema = schema.with_metadata({**(schema.metadata or {}), **metadata})
        self.schema = schema
        self.row_group_rows = max(int(row_group_rows), 1)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
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
            self.w = pcsv.CSVWriter(str(self.tmp), _plain(self.schema))
        else:
            dict_cols = [f.name for f in self.schema
                         if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)]
            self.w = pq.ParquetWriter(str(self.tmp), self.schema, compression=self.compression,
                                      use_dictionary=dict_cols)

    def _loop(self) -> None:
        while True:
            t = self.q.get()
            if t is None:
                return
            if self.error is None:
                try:
                    if self.csv:
                        t = t.cast(_plain(t.schema))
                    self.w.write_table(t, row_group_size=max(t.num_rows, 1))
                except BaseException as e:  # reported on the caller's thread
                    self.error = e

    def write(self, t: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        self.pending.append(t)
        self.pending_rows += t.num_rows
        if self.pending_rows >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        t = pa.concat_tables(self.pending).replace_schema_metadata(self.schema.metadata)
        self.pending, self.pending_rows = [], 0
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
        self._flush()
        if self.w is None:
            self._open()
            w: Any = self.w
            w.write_table(self.schema.empty_table())
        self._drain()
        self.w.close()
        if self.error is not None:
            self.tmp.unlink(missing_ok=True)
            raise self.error
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.pending = []
        self._drain()
        if self.w is not None:
            self.w.close()
            self.w = None
        self.tmp.unlink(missing_ok=True)


def _plain(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns as their values (for CSV)."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type)
                      else f for f in schema], metadata=schema.metadata)


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
               batches: Any = None, tmp_dir: str | Path | None = None,
               keep: Iterable[str] | None = None,
               producers: Iterable[ColumnProducer] | None = None,
               metadata: Mapping[str, str | bytes] | None = None,
               rejects_metadata: Mapping[str, str | bytes] | None = None) -> PriceCounts:
    """Stream ``src`` (a trace file or table of any size) into parquet at ``dst``.

    Memory stays bounded by ``chunk_rows`` (plus the largest batch, and the per-batch table if
    given). While batch ids increase from batch to batch the tail batch of each chunk is
    carried into the next, so a batch split across chunks is priced whole, and output rows
    are in trace order. On the first batch id that is not larger than the one before it, the
    run restarts in partitioned mode: rows are hash-partitioned by batch id into temporary
    Arrow files and priced bucket by bucket (output ordered by bucket, then first row).
    ``rejects`` (parquet, or CSV by suffix) receives the rejected rows; ``strict`` raises
    :class:`RejectedRowError` at the first one. Returns the counts
    (``rows_in == rows_priced + rows_rejected``). ``keep`` and ``producers`` add columns
    (:mod:`kernel.bulk.columns`); ``metadata`` (``rejects_metadata``) is written into the
    output's (the rejects file's) key-value metadata.
    """
    t0 = time.perf_counter()
    _tune_malloc()
    r = resolved(k)
    dst = Path(dst)
    opts = {"keep": keep, "producers": producers, "metadata": metadata,
            "rejects_metadata": rejects_metadata}
    try:
        counts = _stream(r, src, dst, rejects, strict, chunk_rows, progress, decode_threshold,
                         sm_budget, columns, batches, tmp_dir, opts, partitioned=False)
    except _NotContiguous:
        counts = _stream(r, src, dst, rejects, strict, chunk_rows, progress, decode_threshold,
                         sm_budget, columns, batches, tmp_dir, opts, partitioned=True)
    counts.seconds = time.perf_counter() - t0
    counts.check()
    return counts


def _stream(r: ResolvedPool, src: Any, dst: Path, rejects: str | Path | None, strict: bool,
            chunk_rows: int, progress: bool, decode_threshold: int, sm_budget: int,
            columns: Mapping[str, str] | None, batches: Any, tmp_dir: str | Path | None,
            opts: dict[str, Any], *, partitioned: bool) -> PriceCounts:
    ts, spec = open_priced_trace(src, columns=columns, chunk_rows=chunk_rows,
                                 producers=opts["producers"], keep=opts["keep"])
    out = _Sink(dst, spec.schema(), metadata=opts["metadata"])
    rej_sink = (_Sink(Path(rejects), REJECT_SCHEMA, metadata=opts["rejects_metadata"])
                if rejects is not None else None)
    bt_rej: list[pa.Table] = []
    bt = (BatchTable(batches, columns, bt_rej, strict, decode_threshold, sm_budget)
          if batches is not None else None)
    eng = Engine(r, ts.names, decode_threshold=decode_threshold, sm_budget=sm_budget,
                 strict=strict, batch_table=bt, on_priced=out.write,
                 on_rejects=(rej_sink.write if rej_sink is not None else lambda t: None),
                 spec=spec)
    prog = _progress(ts.num_rows, progress)
    t0 = time.perf_counter()

    def tick() -> None:
        if prog is not None:
            el = max(time.perf_counter() - t0, 1e-9)
            prog.update(prog.task_ids[0], completed=eng.counts.rows_in,
                        rate=f"{eng.counts.rows_in / el:,.0f}")

    try:
        eng.emit_rejects(bt_rej)
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


def _coerced_chunks(eng: Engine, ts: Any) -> Iterator[Rows]:
    """The trace's chunks, read ahead on a thread, validated, empty ones dropped."""
    offset = 0
    for raw in _prefetch(ts.chunks()):
        rows = eng.coerce(raw, offset)
        offset += raw.num_rows
        if len(rows):
            yield rows


def _run_contiguous(eng: Engine, ts: Any, tick: Callable[[], None]) -> None:
    """Price chunk by chunk while batch ids increase; the last batch of each chunk is carried
    into the next (completed there with the next chunk's first run, without copying the
    chunk)."""
    carry = Rows.empty()
    last: int | None = None  # the largest batch id seen (the carried batch's, if any)
    for rows in _coerced_chunks(eng, ts):
        starts = runs(rows.batch_id)
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


def _run_partitioned(eng: Engine, ts: Any, chunk_rows: int, tmp_parent: str | Path,
                     tick: Callable[[], None]) -> None:
    total = ts.num_rows
    nb = 64 if total is None else max(1, min(256, -(-total // max(chunk_rows, 1))))
    Path(tmp_parent).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".blis-price-", dir=str(tmp_parent)))
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
        shutil.rmtree(tmp, ignore_errors=True)
