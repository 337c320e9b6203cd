"""How ``blis-kernel sql`` runs one query: under a time limit, with a row limit, and streamed.

A query runs on a timer that interrupts DuckDB at ``--timeout`` seconds. Its result is read
as Arrow record batches: to a file or a pipe in parquet, Arrow IPC, CSV or JSON Lines it is
written batch by batch (memory bounded by a batch, whatever the row count); a rich table or a
JSON array must hold every row, so they stop at ``--max-rows``. Past ``--max-rows`` the
command fails, a file output is not left behind, and the message says which option raises it
(docs/decisions.md RL4).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import click
import duckdb
import pyarrow as pa

from kernel.cli.output import emit, resolve_format
from kernel.io.outputs import TableWriter, stdout_sink
from kernel.io.stamp import Stamp
from pipeline import safe_output

BATCH_ROWS = 65_536
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_ROWS = 1_000_000
STREAMED = ("parquet", "arrow", "csv", "jsonl")


class SqlLimit(click.ClickException):
    """A query past its time or row limit."""


def _too_many(max_rows: int) -> SqlLimit:
    return SqlLimit(f"SQL: the result has more than {max_rows:,} rows, the --max-rows limit; "
                    "raise it (0: none) and write to a file (parquet, arrow, csv, jsonl), "
                    "which streams any number of rows")


class _Timer:
    """Interrupt ``con`` after ``seconds`` (0: never); ``fired`` says whether it did."""

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float):
        self.fired = False
        self.seconds = seconds
        self._t = threading.Timer(seconds, self._fire, args=(con,)) if seconds > 0 else None
        self._stop = safe_output.on_interrupt(con.interrupt)  # SIGINT stops it too

    def _fire(self, con: duckdb.DuckDBPyConnection) -> None:
        self.fired = True
        con.interrupt()

    def __enter__(self) -> _Timer:
        if self._t is not None:
            self._t.daemon = True
            self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._t is not None:
            self._t.cancel()
        safe_output.off_interrupt(self._stop)


def _batches(con: duckdb.DuckDBPyConnection, query: str) -> tuple[pa.Schema, Iterator[Any]]:
    rel = con.sql(query)
    if rel is None:  # (a statement without a result)
        return pa.schema([]), iter(())
    reader = rel.fetch_record_batch(BATCH_ROWS)
    return reader.schema, iter(reader)


def run_query(con: duckdb.DuckDBPyConnection, query: str, fmt: str | None, out: str | None,
              *, stamp: Stamp | None, timeout: float, max_rows: int | None) -> int:
    """Run ``query`` and print or write its rows; returns how many rows there were.
    ``max_rows`` None: :data:`DEFAULT_MAX_ROWS` for a held result, none for a streamed one."""
    chosen = resolve_format(fmt, out)
    if max_rows is None:
        max_rows = 0 if chosen in STREAMED else DEFAULT_MAX_ROWS
    metadata = stamp.to_metadata() if stamp is not None else None
    timer = _Timer(con, timeout)
    try:
        with timer:
            if chosen in STREAMED:
                return _stream(con, query, chosen, out, metadata, max_rows)
            schema, batches = _batches(con, query)
            held: list[Any] = []
            rows = 0
            for b in batches:
                rows += b.num_rows
                if max_rows and rows > max_rows:
                    raise _too_many(max_rows)
                held.append(b)
            table = pa.Table.from_batches(held, schema=schema)
            emit(table, chosen, out, stamp=stamp)
            return rows
    except duckdb.InterruptException:
        if timer.fired:
            raise SqlLimit(f"SQL: the query ran longer than {timeout:g} s, the --timeout limit; "
                           "raise it (0: none)") from None
        raise


def _stream(con: duckdb.DuckDBPyConnection, query: str, fmt: str, out: str | None,
            metadata: dict[str, str] | None, max_rows: int) -> int:
    schema, batches = _batches(con, query)
    if metadata and fmt in ("parquet", "arrow"):
        schema = schema.with_metadata({**(schema.metadata or {}), **metadata})
    to_stdout = not out or out == "-"

    def write_all(writer: TableWriter) -> int:
        rows = 0
        for b in batches:
            rows += b.num_rows
            if max_rows and rows > max_rows:
                raise _too_many(max_rows)
            writer.write(pa.Table.from_batches([b]).replace_schema_metadata(schema.metadata))
        return rows

    if to_stdout:
        writer = TableWriter(stdout_sink(), schema, fmt, to_stdout=True)
        rows = write_all(writer)
        writer.close()
        return rows
    with safe_output.atomic(str(out), "-o") as tmp:  # renamed into place only when complete
        writer = TableWriter(str(tmp), schema, fmt)
        try:
            rows = write_all(writer)
        finally:
            writer.close()
    click.echo(f"wrote {rows:,} row(s) to {out}", err=True)
    return rows
