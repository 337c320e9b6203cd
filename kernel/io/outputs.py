"""Table outputs by suffix, the same for every command (docs/decisions.md RL3).

A table a command writes (priced steps, rejects, resolved rows, provenance, SQL results) is
parquet, Arrow IPC, CSV or JSON Lines, chosen by the target's suffix (or an explicit format),
and ``-`` streams it to stdout. An unknown suffix, or a suffix that names another format than
the one asked for, is a clear error before anything is read or priced.

:class:`TableWriter` writes a stream of Arrow tables in one of those formats to an open binary
sink; :func:`open_table_writer` opens it on a temporary name beside the target (renamed into
place by :mod:`pipeline.safe_output`) or on stdout. Parquet and Arrow IPC keep the schema's
key-value metadata (the stamp, :mod:`kernel.io.stamp`); CSV and JSON Lines carry none.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

__all__ = ["STDOUT", "TABLE_FORMATS", "TABLE_SUFFIXES", "FormatError", "TableWriter",
           "is_stdout", "plain_schema", "suffix_list", "table_format"]

STDOUT = "-"
TABLE_FORMATS = ("parquet", "arrow", "csv", "jsonl")
TABLE_SUFFIXES: dict[str, str] = {
    ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "arrow", ".ipc": "arrow", ".feather": "arrow",
    ".csv": "csv",
    ".jsonl": "jsonl", ".ndjson": "jsonl",
}


class FormatError(ValueError):
    """An output whose suffix names no format this output writes, or another one than asked."""


def is_stdout(path: str | Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def suffix_list(formats: Sequence[str] = TABLE_FORMATS) -> str:
    return ", ".join(s for s, f in TABLE_SUFFIXES.items() if f in formats)


def table_format(path: str | Path, fmt: str | None = None, *, label: str = "-o",
                 formats: Sequence[str] = TABLE_FORMATS, default: str | None = None,
                 bare: str | None = "parquet") -> str:
    """The format to write ``path`` in: ``fmt`` if given (the suffix must then agree, when it
    names a table format), else the one its suffix names (``bare`` for a name with no
    suffix); ``-`` (stdout) takes ``fmt`` or ``default``. Raises :class:`FormatError` for
    anything else."""
    if fmt is not None and fmt not in formats:
        raise FormatError(f"{label}: format {fmt!r} is not one of {', '.join(formats)}")
    if is_stdout(path):
        chosen = fmt or default
        if chosen is None:
            raise FormatError(f"{label} -: give --format ({', '.join(formats)}) to stream to "
                              "stdout")
        return chosen
    suffix = Path(path).suffix.lower()
    named = TABLE_SUFFIXES.get(suffix)
    if fmt is not None:
        if named is not None and named != fmt:
            raise FormatError(f"{label} {path}: the suffix {suffix} says {named}, but the "
                              f"format asked for is {fmt}; make them agree")
        return fmt
    if not suffix and bare is not None:
        return bare
    if named is None or named not in formats:
        hint = " (JSON Lines is .jsonl)" if suffix == ".json" and "jsonl" in formats else ""
        raise FormatError(f"{label} {path}: cannot tell the format from "
                          f"{suffix or 'no'} suffix{hint}; use one of {suffix_list(formats)}")
    return named


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns as their values (CSV and JSON Lines have no dictionaries)."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type)
                      else f for f in schema], metadata=schema.metadata)


class TableWriter:
    """Arrow tables written one after another as ``fmt`` to ``sink`` (a binary stream).

    ``to_stdout`` marks a pipe (every format is written front to back). Parquet keeps ``use_dictionary``, ``sorting_columns`` and ``compression``;
    :meth:`close` adds ``extra`` key-value metadata to a parquet footer (other formats fix
    their metadata when they start, or have none)."""

    def __init__(self, sink: BinaryIO | str, schema: pa.Schema, fmt: str, *,
                 to_stdout: bool = False, compression: str = "lz4",
                 use_dictionary: bool | list[str] = True,
                 sorting_columns: Sequence[str] = ()):
        self.fmt = fmt
        self.schema = schema
        self.sink = sink
        self.w: Any
        if fmt == "parquet":
            import pyarrow.parquet as pq  # (heavy: Arrow, loaded only on this path)

            sorting = [pq.SortingColumn(schema.get_field_index(c)) for c in sorting_columns]
            self.w = pq.ParquetWriter(sink, schema, compression=compression,
                                      use_dictionary=use_dictionary,
                                      sorting_columns=sorting or None)
        elif fmt == "arrow":
            # the IPC file format on stdout too (it is written front to back, no seek), as
            # the table commands always wrote it
            self.w = pa.ipc.new_file(sink, schema)
        elif fmt == "csv":
            import pyarrow.csv as pcsv  # (heavy: Arrow, loaded only on this path)

            self.w = pcsv.CSVWriter(sink, plain_schema(schema))
        elif fmt == "jsonl":
            self.w = None
            self._out: BinaryIO = (open(sink, "wb") if isinstance(sink, str)  # noqa: SIM115
                                   else sink)
        else:
            raise FormatError(f"unknown table format {fmt!r}; one of {', '.join(TABLE_FORMATS)}")

    def write(self, t: pa.Table) -> None:
        if self.fmt == "parquet":
            self.w.write_table(t, row_group_size=max(t.num_rows, 1))
        elif self.fmt == "arrow":
            self.w.write_table(t.cast(self.schema) if t.schema != self.schema else t)
        elif self.fmt == "csv":
            self.w.write_table(t.cast(plain_schema(t.schema)))
        else:
            import polars as pl  # (heavy: polars, loaded only on this path)

            frame = pl.from_arrow(t.cast(plain_schema(t.schema)))
            assert isinstance(frame, pl.DataFrame)
            if frame.height:
                frame.write_ndjson(self._out)

    def close(self, extra: Mapping[str, str] | None = None) -> None:
        if self.fmt == "parquet" and extra:
            self.w.add_key_value_metadata(dict(extra))
        if self.w is not None:
            self.w.close()
        elif isinstance(self.sink, str):
            self._out.close()
        else:
            self._out.flush()


def stdout_sink() -> BinaryIO:
    """The process's stdout as a binary stream (text written so far flushed first)."""
    sys.stdout.flush()
    return sys.stdout.buffer


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A table written by :class:`TableWriter` (by suffix), for round trips and for commands
    that read back what they wrote (the accuracy summary, ``price --db``)."""
    fmt = table_format(path, label="table")
    if fmt == "parquet":
        import pyarrow.parquet as pq  # (heavy: Arrow, loaded only on this path)

        return pq.read_table(path, columns=list(columns) if columns else None)
    if fmt == "arrow":
        with pa.memory_map(str(path)) as mm:
            t = pa.ipc.open_file(mm).read_all()
    elif fmt == "csv":
        import pyarrow.csv as pcsv  # (heavy: Arrow, loaded only on this path)

        t = pcsv.read_csv(path)
    else:
        import polars as pl  # (heavy: polars, loaded only on this path)

        t = (pl.read_ndjson(path, infer_schema_length=None).to_arrow()
             if Path(path).stat().st_size else pa.table({}))
    return t.select(list(columns)) if columns else t
