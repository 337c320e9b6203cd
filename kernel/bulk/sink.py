"""The output file of :func:`kernel.bulk.price_file`: parquet, Arrow IPC, CSV or JSON Lines by
suffix (:mod:`kernel.io.outputs`; ``-`` streams to stdout), encoded on a writer
thread of its own, to a temporary name renamed at the end.

The writer thread is what lets the calling thread keep the pricing workers fed: encoding a
262k-row group takes tens of milliseconds (Arrow does it without the GIL), and a calling
thread busy with it submitted no new work, so the workers sat idle for about half the run
(``docs/decisions.md`` RO15).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline import safe_output

from ..io.outputs import TableWriter, is_stdout, stdout_sink, table_format
from .columns import dictionary_on_disk

__all__ = ["ROW_GROUP_ROWS", "Sink"]

ROW_GROUP_ROWS = 1 << 18  # priced rows per parquet row group (DuckDB scans like >= 128k)
WRITE_AHEAD = 2  # row groups waiting for the writer thread before write() blocks

log = logging.getLogger(__name__)  # no handler here: the CLI attaches one (CF5)


class Sink:
    """A parquet (Arrow IPC, CSV, JSON Lines: by suffix, or ``fmt``) file written to a
    temporary name, then renamed; ``-`` is stdout (a run that fails there has already
    written part of its rows, as any pipe does).

    Tables are gathered into row groups of at least ``row_group_rows`` rows (but those
    :meth:`flush` ends early: a run flushes each of its last few results as it comes, so
    that little is left to encode after the last one is priced); ``metadata`` goes into the
    file's key-value metadata; ``sorted_by`` columns are recorded as the row groups'
    ``sorting_columns``. Row groups are encoded in order on a writer thread, at most
    :data:`WRITE_AHEAD` waiting; a failure there is raised by a later :meth:`flush` or by
    :meth:`close`.
    """

    def __init__(self, path: Path, schema: pa.Schema, *, compression: str = "lz4",
                 row_group_rows: int = ROW_GROUP_ROWS,
                 metadata: Mapping[str, str | bytes] | None = None,
                 sorted_by: tuple[str, ...] = (), fmt: str | None = None):

        self.path = path
        self.to_stdout = is_stdout(path)  # ``-``: streamed to stdout, nothing to rename
        # the format its suffix names (RL3): parquet, Arrow IPC, CSV or JSON Lines
        self.fmt = table_format(path, fmt, default="csv")
        self.tmp = None if self.to_stdout else safe_output.temp_name(path)  # (signal-safe)
        self.stamped = bool(metadata)  # a stamped file also gets the run's counts at the end
        if metadata:
            schema = schema.with_metadata({**(schema.metadata or {}), **metadata})
        self.schema = schema
        self.csv = self.fmt == "csv"
        self.compression = compression
        self.row_group_rows = max(int(row_group_rows), 1)
        log.debug("writing %s as %s, row groups of %d rows, %s", path, self.fmt,
                  self.row_group_rows, compression)
        self.sorted_by = sorted_by
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.w: Any = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="blis-write")  # (starts on use)
        self._writes: deque[Future[None]] = deque()

    def _open(self) -> None:
        if self.to_stdout:
            self.w = TableWriter(stdout_sink(), self.schema, self.fmt, to_stdout=True,
                                 compression=self.compression)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dict_cols = [f.name for f in self.schema if dictionary_on_disk(f)]
        self.w = TableWriter(str(self.tmp), self.schema, self.fmt,
                             compression=self.compression, use_dictionary=dict_cols,
                             sorting_columns=self.sorted_by)

    def _encode(self, t: pa.Table) -> None:
        """On the writer thread: ``t`` as one row group."""
        self.w.write(t)

    def _wait(self, keep: int) -> None:
        """Wait until at most ``keep`` row groups are still to encode (raising a failure)."""
        while len(self._writes) > keep:
            self._writes.popleft().result()

    def write(self, t: pa.Table) -> None:
        self.pending.append(t)
        self.pending_rows += t.num_rows
        if self.pending_rows >= self.row_group_rows:
            self.flush()

    def flush(self) -> None:
        """Send the tables given so far to the writer thread (as one row group, however few
        their rows)."""
        if self.w is None:
            self._open()
        if not self.pending:
            return
        t = pa.concat_tables(self.pending).replace_schema_metadata(self.schema.metadata)
        self.pending, self.pending_rows = [], 0
        self._wait(WRITE_AHEAD - 1)
        self._writes.append(self._writer.submit(self._encode, t))

    def close(self, extra: Mapping[str, str] | None = None) -> None:
        """Finish the file; ``extra`` key-value metadata (known only now, e.g. the row
        counts) is added to a parquet footer, replacing keys of the same name."""
        self.flush()
        self._wait(0)
        self._writer.shutdown()
        self.w.close(extra)
        if self.tmp is not None:
            safe_output.commit(self.tmp, self.path)

    def abort(self) -> None:
        self.pending = []
        self._writes.clear()
        self._writer.shutdown(wait=True, cancel_futures=True)
        if self.w is not None:
            with contextlib.suppress(Exception):  # never over the failure being handled
                self.w.close()
            self.w = None
        if self.tmp is not None:
            safe_output.discard(self.tmp)


def _plain(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns as their values (for CSV)."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type)
                      else f for f in schema], metadata=schema.metadata)
