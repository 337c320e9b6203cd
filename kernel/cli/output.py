"""Where a command's rows go: a rich table, or parquet / Arrow IPC / CSV / JSON / JSON Lines.

``--format`` picks the format; without it ``-o FILE`` infers it from the suffix, and no
``-o`` (or ``-o -``) writes to stdout, binary formats included. A suffix that names another
format than ``--format`` is an error (RL3). Parquet and IPC files carry
the stamp (:mod:`kernel.io.stamp`). A table never truncates its key column: it is printed whole,
without wrapping, and a console that is not a terminal is made wide enough for every row.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from kernel.io.stamp import Stamp, stamped
from pipeline import safe_output

FORMATS = ("table", "parquet", "arrow", "csv", "json", "jsonl")
TEXT_FORMATS = ("table", "json", "csv")
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".ipc": "arrow",
            ".feather": "arrow", ".csv": "csv", ".json": "json", ".jsonl": "jsonl",
            ".ndjson": "jsonl", ".txt": "table"}

F = TypeVar("F", bound=Callable[..., Any])


def format_options(formats: tuple[str, ...] = FORMATS, output: bool = True) -> Callable[[F], F]:
    """``--format`` (and ``-o/--output`` when ``output``) for a command."""
    def deco(func: F) -> F:
        if output:
            func = click.option("-o", "--output", "out", type=click.Path(dir_okay=False,
                                                                         allow_dash=True),
                                help="File to write (format from the suffix unless --format "
                                     "is given; '-' or absent: stdout).")(func)
        return click.option("--format", "fmt", type=click.Choice(formats), default=None,
                            help=f"{' | '.join(formats)} (default: from -o's suffix, else "
                                 "table).")(func)
    return deco


def resolve_format(fmt: str | None, out: str | None, formats: tuple[str, ...] = FORMATS) -> str:
    """The explicit ``--format``, else the one ``out``'s suffix names, else ``table``."""
    if fmt:
        named = SUFFIXES.get(Path(out).suffix.lower()) if out and out != "-" else None
        if named is not None and named != fmt:
            raise click.BadParameter(f"{out}: the suffix {Path(str(out)).suffix} says {named}, but "
                                     f"--format is {fmt}; make them agree",
                                     param_hint="-o/--output")
        return fmt
    if out and out != "-":
        suffix = Path(out).suffix.lower()
        inferred = SUFFIXES.get(suffix)
        if inferred is None or inferred not in formats:
            known = ", ".join(s for s, f in SUFFIXES.items() if f in formats)
            raise click.BadParameter(f"{out}: cannot tell the format from {suffix or 'no'} "
                                     f"suffix; use one of {known} or give --format",
                                     param_hint="-o/--output")
        return inferred
    return "table"


def cell(value: Any) -> str:
    """A value as a table or CSV cell."""
    if value is None:
        return ""
    if isinstance(value, float):
        # Integral values (byte counts, widths) in full; others as the shortest exact repr.
        return f"{int(value):,}" if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def console(stderr: bool = False) -> Console:
    """A rich console; piped or captured, it is wide enough that no row is squeezed."""
    con = Console(stderr=stderr)
    if not con.is_terminal:
        con = Console(stderr=stderr, width=max(con.width, 240), soft_wrap=False)
    return con


def rich_table(table: pa.Table, title: str = "", transpose: bool = False,
               key: str | None = None, cells: Callable[[str, Any], str] | None = None) -> Table:
    """A rich table of ``table``; ``key`` (default: the first column) is never cut or wrapped."""
    show = cells or (lambda _name, v: cell(v))
    rich = Table(title=title or None, show_lines=False)
    rows = table.to_pylist()
    if transpose and len(rows) == 1:
        rich.add_column("field", no_wrap=True, overflow="ignore")
        rich.add_column("value", overflow="fold", max_width=120)
        for k, v in rows[0].items():
            rich.add_row(k, show(k, v))
        return rich
    key = key or (table.column_names[0] if table.column_names else None)
    for name in table.column_names:
        if name == key:
            width = max([len(name), *(len(show(name, r[name])) for r in rows)])
            rich.add_column(name, no_wrap=True, overflow="ignore", min_width=width)
        else:
            rich.add_column(name, overflow="fold")
    for row in rows:
        rich.add_row(*(show(n, v) for n, v in row.items()))
    return rich


def protect_key(table: Table, index: int = 0) -> Table:
    """Make column ``index`` of a built rich table (its key) unwrappable and wide enough for
    its longest cell, so no console width can cut it."""
    col = table.columns[index]
    cells = [str(c) for c in col._cells]
    col.no_wrap = True
    col.overflow = "ignore"
    col.min_width = max([len(str(col.header)), *(len(c) for c in cells)])
    return table


def _flat(table: pa.Table) -> pa.Table:
    """Nested columns (lists, structs) as text, for CSV."""
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        t = col.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) \
                or pa.types.is_map(t):
            cols[name] = pa.array([None if v is None else cell(v) for v in col.to_pylist()],
                                  pa.string())
        elif pa.types.is_dictionary(t):
            cols[name] = col.cast(t.value_type)
        else:
            cols[name] = col
    return pa.table(cols)


def encode(table: pa.Table, fmt: str, sink: BinaryIO, stamp: Stamp | None = None) -> None:
    """Write ``table`` as ``fmt`` (parquet, arrow, csv, json) to a binary stream."""
    if fmt == "parquet":
        pq.write_table(stamped(table, stamp), sink)
    elif fmt == "arrow":
        t = stamped(table, stamp)
        with pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t)
    elif fmt == "csv":
        pacsv.write_csv(_flat(table), sink)
    elif fmt == "json":
        sink.write((json.dumps(table.to_pylist(), indent=2, default=_json_default) + "\n")
                   .encode())
    elif fmt == "jsonl":
        for row in table.to_pylist():
            sink.write((json.dumps(row, default=_json_default) + "\n").encode())
    else:  # pragma: no cover - the choices are fixed
        raise ValueError(fmt)


def emit(table: pa.Table, fmt: str | None, out: str | None, *, title: str = "",
         transpose: bool = False, stamp: Stamp | None = None, key: str | None = None,
         formats: tuple[str, ...] = FORMATS) -> None:
    """Print or write ``table`` (see the module docstring)."""
    fmt = resolve_format(fmt, out, formats)
    to_stdout = not out or out == "-"
    if fmt == "table":
        rich = rich_table(table, title, transpose, key)
        if to_stdout:
            console().print(rich)
        else:
            with safe_output.atomic(str(out), "-o") as tmp, open(tmp, "w", encoding="utf-8") as f:
                Console(file=f, width=240, soft_wrap=False).print(rich)
        return
    if to_stdout:
        buf = io.BytesIO()  # parquet needs a seekable sink; write whole, then copy
        encode(table, fmt, buf, stamp)
        sys.stdout.flush()
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.buffer.flush()
        return
    path = Path(out)  # type: ignore[arg-type]
    with safe_output.atomic(path, "-o") as tmp, open(tmp, "wb") as f:  # renamed on success
        encode(table, fmt, f, stamp)
    click.echo(f"wrote {table.num_rows} row(s) to {path}", err=True)


def emit_rows(rows: list[dict[str, Any]], fmt: str | None, out: str | None = None,
              **kwargs: Any) -> None:
    """:func:`emit` for plain Python rows (types inferred by Arrow)."""
    emit(pa.Table.from_pylist(rows), fmt, out, **kwargs)
