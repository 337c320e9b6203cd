"""Trace sources: anything Arrow can stream, opened for batched reading.

:func:`open_trace` accepts

* paths: a parquet file, a directory of parquet files (hive-partitioned or not), a glob
  (``"traces/*.parquet"``), a list of files; Arrow IPC (file or stream format); CSV/TSV;
* in memory: a polars ``DataFrame``, an Arrow ``Table`` / ``RecordBatch``, a pandas
  ``DataFrame``;
* streams: a polars ``LazyFrame`` (collected in batches by polars' streaming engine), a
  pyarrow ``Dataset`` or ``Scanner``, a ``RecordBatchReader``, and any object with the Arrow C
  stream interface (``__arrow_c_stream__``: DuckDB relations, ...).

Parquet goes through :mod:`pyarrow.dataset`: one row-group fragment at a time, decoded on
Arrow's threads, with the dataset's schema (which fills in hive partition keys); its scanner's
readahead is not held back by a slow consumer, so it is used only for other formats.

Each source also says how its rows are laid out (:attr:`TraceSource.layout`), which decides
how bulk pricing groups them without reading anything twice:

``"batches"``
    :meth:`TraceSource.units` yields chunks that never split a batch, except that rows of the
    chunk's *carry* id may continue in the next chunk. Known for in-memory tables whose batches
    are contiguous (checked on the ``batch_id`` column), and for parquet whose row-group
    statistics show ``batch_id`` ranges that increase (or decrease) from group to group,
    touching at most at one shared id — whatever the order inside each group; and, when the
    statistics overlap, for parquet whose ``batch_id`` column (read alone, first) shows every
    batch's rows together, e.g. whole batches out of place.
``"any"``
    nothing is known (one-shot streams, CSV, overlapping row groups): bulk pricing sorts.
"""

from __future__ import annotations

import glob as globlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from pipeline import safe_output

from .trace import (
    _CHECK_ONLY,
    CANONICAL,
    KEEP_PREFIX,
    OPTIONAL,
    REQUIRED,
    TraceError,
    all_distinct,
)

__all__ = ["TraceSource", "open_trace"]

_IPC = (".arrow", ".ipc", ".feather", ".arrows")
ROW_GROUP_FACTOR = 4  # a row group up to this many chunks is read whole (layout "batches")


def _resolve_names(schema_names: list[str], columns: Mapping[str, str] | None,
                   required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, str]:
    columns = dict(columns or {})
    unknown = set(columns) - set(CANONICAL)
    if unknown:
        raise TraceError(f"unknown trace column(s) in the column map: {sorted(unknown)}; "
                         f"known: {list(CANONICAL)}")
    names: dict[str, str] = {}
    have = set(schema_names)
    missing = []
    for canon in required:
        src = columns.get(canon, canon)
        if src not in have:
            missing.append(f"{src!r}" + (f" (mapped from {canon!r})" if src != canon else ""))
        names[canon] = src
    if missing:
        raise TraceError(f"missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}: the trace needs {', '.join(required)}; "
                         f"it has {', '.join(schema_names)}")
    for canon in optional:
        src = columns.get(canon, canon)
        if src in have:
            names[canon] = src
        elif canon in columns:
            raise TraceError(f"missing column {src!r} (mapped from {canon!r})")
    return names


# (a unit's rows, the carry id or None); read when the iterator reaches it (bulk pricing
# pulls the iterator on a reader thread of its own)
Unit = tuple[pa.Table | pa.RecordBatch, Any]


@dataclass
class TraceSource:
    """A trace opened for batched reading; chunks come renamed to the canonical names, with
    carried columns as ``keep:<name>``."""

    names: dict[str, str]  # canonical -> column in the source
    num_rows: int | None
    _iter: Callable[[], Iterator[Any]]
    label: str = "<table>"
    extra: tuple[str, ...] = ()  # other columns carried along, as ``keep:<name>``
    schema: pa.Schema | None = None  # the source's schema, where known
    layout: str = "any"  # "batches" or "any" (module docstring)
    sorted_ids: bool = False  # layout "batches" with batch ids increasing chunk to chunk
    in_memory: bool = False  # an Arrow table already in memory
    # (min, max, rows) of batch_id per part of the source (parquet row groups with integer
    # statistics; an in-memory table whole), when known before reading: bulk pricing plans
    # its in-memory grouping from them
    id_ranges: list[tuple[int, int, int]] | None = None
    _units: Callable[[], Iterator[Unit]] | None = None

    def _canon(self, part: pa.Table | pa.RecordBatch) -> pa.Table:
        if isinstance(part, pa.RecordBatch):
            part = pa.Table.from_batches([part])
        have = set(part.column_names)
        canon = [c for c in self.names if self.names[c] in have]
        cols = [part.column(self.names[c]) for c in canon]
        cols += [part.column(x) for x in self.extra]
        return pa.table(cols, names=canon + [KEEP_PREFIX + x for x in self.extra])

    def chunks(self) -> Iterator[pa.Table]:
        for part in self._iter():
            yield self._canon(part)

    def units(self) -> Iterator[tuple[pa.Table, Any]]:
        """Layout "batches": chunks that split no batch but their carry id's."""
        if self._units is None:
            raise TypeError("units() needs layout 'batches'")
        for part, carry in self._units():
            yield self._canon(part), carry


def open_trace(src: Any, *, columns: Mapping[str, str] | None = None,
               chunk_rows: int = 1 << 20, required: tuple[str, ...] = REQUIRED,
               optional: tuple[str, ...] = OPTIONAL,
               extra: tuple[str, ...] = ()) -> TraceSource:
    """Open ``src`` (module docstring) for batched reading of about ``chunk_rows`` rows.

    ``extra`` names other columns to carry along unvalidated (``keep=``, column producers'
    inputs); each must exist."""
    ts = _open(src, columns, max(int(chunk_rows), 1), required, optional, tuple(extra))
    if extra:
        have = ts.schema.names if ts.schema is not None else []
        missing = [x for x in extra if x not in have]
        if missing:
            raise TraceError(f"{ts.label}: no column {', '.join(map(repr, missing))} to carry "
                             f"to the output; the trace has {', '.join(have)}")
        ts.extra = tuple(extra)
    return ts


def _open(src: Any, columns: Mapping[str, str] | None, chunk_rows: int,
          required: tuple[str, ...], optional: tuple[str, ...],
          extra: tuple[str, ...]) -> TraceSource:
    def names_of(schema: pa.Schema) -> dict[str, str]:
        return _resolve_names(schema.names, columns, required, optional)

    if isinstance(src, pl.DataFrame):
        src = src.to_arrow()
    elif isinstance(src, pa.RecordBatch):
        src = pa.Table.from_batches([src])
    elif type(src).__module__.split(".")[0] == "pandas" and hasattr(src, "columns"):
        src = pa.Table.from_pandas(src, preserve_index=False)
    if isinstance(src, pa.Table):
        return _from_table(src, names_of(src.schema), chunk_rows, extra, "<table>")
    if isinstance(src, pl.LazyFrame):
        return _from_lazy(src, names_of(src.collect_schema().to_arrow()), chunk_rows, extra)
    if isinstance(src, ds.Dataset):
        return _from_dataset(src, names_of(src.schema), chunk_rows, extra, "<dataset>")
    if isinstance(src, ds.Scanner):
        src = src.to_reader()
    if not isinstance(src, pa.RecordBatchReader) and hasattr(src, "__arrow_c_stream__"):
        src = pa.RecordBatchReader.from_stream(src)
    if isinstance(src, pa.RecordBatchReader):
        reader = src
        return TraceSource(names_of(reader.schema), None, lambda: iter(reader),
                           f"<{type(src).__name__}>", schema=reader.schema)
    if isinstance(src, str | Path | list | tuple):
        return _open_paths(src, columns, chunk_rows, required, optional, extra)
    raise TraceError(f"cannot read a trace from {type(src).__name__}: give a path, a "
                     "directory or glob, a polars/pandas/Arrow table, a LazyFrame, a pyarrow "
                     "Dataset/Scanner/RecordBatchReader or an Arrow C stream")


# -- in memory --------------------------------------------------------------------------------

def _runs(ids: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.zeros(0, np.int64)
    return np.concatenate(([0], np.flatnonzero(ids[1:] != ids[:-1]) + 1)).astype(np.int64)


def _from_table(tbl: pa.Table, names: dict[str, str], chunk_rows: int,
                extra: tuple[str, ...], label: str) -> TraceSource:
    keep = [x for x in extra if x in tbl.column_names]
    tbl = tbl.select(list(dict.fromkeys([*names.values(), *keep])))
    n = tbl.num_rows

    def slices() -> Iterator[pa.Table]:
        for off in range(0, n, chunk_rows):
            yield tbl.slice(off, chunk_rows)
    ts = TraceSource(names, n, slices, label, schema=tbl.schema, in_memory=True)
    col = tbl.column(names["batch_id"])
    if n == 0 or col.null_count or not pa.types.is_integer(col.type):
        return ts
    ids = np.concatenate([c.to_numpy() for c in col.chunks]) if col.num_chunks != 1 \
        else col.chunk(0).to_numpy()
    ts.id_ranges = [(int(ids.min()), int(ids.max()), n)]
    starts = _runs(ids)
    run_ids = ids[starts]
    increasing = bool(np.all(run_ids[1:] > run_ids[:-1]))
    if not increasing and not all_distinct(run_ids):
        return ts  # a batch's rows are not together
    # cut at the batch start nearest after each multiple of chunk_rows: no batch is split
    cuts = np.unique(starts[np.minimum(np.searchsorted(starts, np.arange(chunk_rows, n,
                                                                         chunk_rows)),
                                       starts.size - 1)])
    bounds = [0, *[int(c) for c in cuts if c > 0], n]

    def units() -> Iterator[Unit]:
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                yield tbl.slice(lo, hi - lo), None
    ts.layout, ts.sorted_ids, ts._units = "batches", increasing, units
    return ts


def _from_lazy(lf: pl.LazyFrame, names: dict[str, str], chunk_rows: int,
               extra: tuple[str, ...]) -> TraceSource:
    schema = lf.collect_schema().to_arrow()
    cols = list(dict.fromkeys([*names.values(), *(x for x in extra if x in schema.names)]))

    def it() -> Iterator[pa.Table]:
        for df in lf.select(cols).collect_batches(chunk_size=chunk_rows, maintain_order=True,
                                                  engine="streaming"):
            yield df.to_arrow()
    return TraceSource(names, None, it, "<LazyFrame>", schema=schema)


# -- paths -------------------------------------------------------------------------------------

def _open_paths(src: Any, columns: Mapping[str, str] | None, chunk_rows: int,
                required: tuple[str, ...], optional: tuple[str, ...],
                extra: tuple[str, ...]) -> TraceSource:
    def names_of(schema: pa.Schema) -> dict[str, str]:
        return _resolve_names(schema.names, columns, required, optional)

    files: list[str] | None = None
    label = str(src)
    if isinstance(src, list | tuple):
        files = [str(p) for p in src]
        missing = [p for p in files if not Path(p).is_file()]
        if missing:
            raise TraceError(f"no such trace file: {missing[0]}")
        label = f"{len(files)} files"
    elif any(ch in str(src) for ch in "*?[") and not Path(src).exists():
        files = sorted(globlib.glob(str(src), recursive=True))
        if not files:
            raise TraceError(f"no file matches the glob {src}")
    path = Path(files[0]) if files else Path(src)
    for f in files or ():  # no output of this command may land on what it reads (RL1)
        safe_output.note_read("the trace", f)
    if files is None:
        (safe_output.note_read_dir if path.is_dir() else safe_output.note_read)("the trace",
                                                                                  path)
    try:
        if files is None and path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and not p.name.startswith((".", "_")))
            if not found:
                raise TraceError(f"no trace files in the directory {path}")
            fmt = _format(found[0])
            dset = ds.dataset(str(path), format=fmt, partitioning="hive",
                              exclude_invalid_files=False)
            return _from_dataset(dset, names_of(dset.schema), chunk_rows, extra, label)
        if files is None and not path.exists():
            raise TraceError(f"no such trace file: {path}")
        suffixes = [s.lower() for s in path.suffixes]
        if files is None and (".csv" in suffixes or ".tsv" in suffixes):
            return _open_csv(path, names_of, chunk_rows, extra)
        if files is None and suffixes and suffixes[-1] in _IPC:
            return _open_ipc(path, names_of, chunk_rows, extra)
        fmt = _format(path)
        dset = ds.dataset(files or str(path), format=fmt)
        return _from_dataset(dset, names_of(dset.schema), chunk_rows, extra, label)
    except TraceError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"cannot read trace {label}: {e}") from e


def _format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if ".csv" in suffixes or ".tsv" in suffixes:
        raise TraceError(f"{path}: a directory, glob or list of CSV files is not supported; "
                         "give one CSV file, or parquet")
    if suffixes and suffixes[-1] in _IPC:
        return "ipc"
    return "parquet"


def _from_dataset(dset: ds.Dataset, names: dict[str, str], chunk_rows: int,
                  extra: tuple[str, ...], label: str) -> TraceSource:
    schema = dset.schema
    frags = list(dset.get_fragments())
    parquet = bool(frags) and all(isinstance(f, ds.ParquetFileFragment) for f in frags)
    read = [n for canon, n in names.items()
            if not (parquet and canon in _CHECK_ONLY and _stats_prove_valid(frags, n))]
    read = list(dict.fromkeys([*read, *(x for x in extra if x in schema.names)]))
    num_rows = (sum(f.metadata.num_rows for f in frags) if parquet else None)

    def scan() -> Iterator[pa.RecordBatch]:
        yield from ds.Scanner.from_dataset(dset, columns=read, batch_size=chunk_rows,
                                           batch_readahead=2, fragment_readahead=1,
                                           use_threads=True).to_batches()
    ts = TraceSource(names, num_rows, scan, label, schema=schema)
    if not parquet:
        return ts
    # Parquet: one row group at a time (the scanner's readahead is not held back by a slow
    # consumer, so its memory would grow with the file), each decoded on Arrow's threads.
    groups = [(g, int(g.row_groups[0].num_rows)) for f in frags for g in f.split_by_row_group()]

    def read_group(g: Any) -> pa.Table:  # (the dataset schema fills in partition keys)
        return g.to_table(schema=schema, columns=read, use_threads=True)

    def chunks() -> Iterator[pa.Table]:
        for g, _ in groups:
            t = read_group(g)
            for off in range(0, t.num_rows, chunk_rows):
                yield t.slice(off, chunk_rows)
    ts._iter = chunks
    ts.id_ranges = _id_ranges(frags, names["batch_id"])
    plan = (_row_group_plan(groups, frags, names["batch_id"], chunk_rows)
            or _contiguity_plan(groups, names["batch_id"], chunk_rows))
    if plan is None:
        return ts
    carries, increasing = plan

    def units() -> Iterator[Unit]:
        for (g, _), carry in zip(groups, carries, strict=True):
            yield read_group(g), carry
    ts.layout, ts.sorted_ids, ts._units = "batches", increasing, units
    return ts


def _row_group_plan(groups: Sequence[tuple[Any, int]], frags: Sequence[Any], batch_col: str,
                    chunk_rows: int) -> tuple[list[Any], bool] | None:
    """The carry id of each row group when their batch_id ranges never overlap but at one
    shared id between neighbours (and whether they rise); None when statistics cannot show
    it."""
    lo: list[Any] = []
    hi: list[Any] = []
    for f in frags:
        md = f.metadata
        idx = md.schema.to_arrow_schema().get_field_index(batch_col)
        if idx < 0:
            return None
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            if rg.num_rows > ROW_GROUP_FACTOR * chunk_rows:
                return None
            st = rg.column(idx).statistics
            if rg.num_rows == 0:  # no rows: any range
                lo.append(None)
                hi.append(None)
                continue
            if st is None or not st.has_min_max:
                return None
            lo.append(st.min)
            hi.append(st.max)
    if len(lo) != len(groups):
        return None
    keep = [k for k in range(len(lo)) if lo[k] is not None]
    pairs = list(zip(keep[:-1], keep[1:], strict=True))
    inc = all(hi[a] <= lo[b] for a, b in pairs)
    dec = all(lo[a] >= hi[b] for a, b in pairs)
    if not (inc or dec):
        return None
    carries: list[Any] = [None] * len(lo)
    for a, b in pairs:  # (a carry passes over empty groups)
        if hi[a] == lo[b] if inc else lo[a] == hi[b]:
            carries[a] = hi[a] if inc else lo[a]
    return carries, inc


def _id_ranges(frags: Sequence[Any], batch_col: str) -> list[tuple[int, int, int]] | None:
    """(min, max, rows) of each non-empty row group's integer batch_id, from the statistics;
    None unless every such group has them."""
    out = []
    try:
        for f in frags:
            md = f.metadata
            schema = md.schema.to_arrow_schema()
            idx = schema.get_field_index(batch_col)
            if idx < 0 or not pa.types.is_integer(schema.field(idx).type):
                return None
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                if rg.num_rows == 0:
                    continue
                st = rg.column(idx).statistics
                if st is None or not st.has_min_max:
                    return None
                out.append((int(st.min), int(st.max), int(rg.num_rows)))
    except (KeyError, IndexError, TypeError, pa.ArrowException):
        return None
    return out


def _contiguity_plan(groups: Sequence[tuple[Any, int]], batch_col: str, chunk_rows: int
                     ) -> tuple[list[Any], bool] | None:
    """When statistics cannot tell (row groups overlap): read the batch_id column alone and
    check that each batch's rows are together (whole batches moved about, e.g. one written
    late). The carry of each row group is its last id when the next group starts with it.
    None as soon as a batch shows two runs — in the first row group for shuffled or
    request-major logs, so that costs one column of one row group."""
    first: list[Any] = []
    last: list[Any] = []
    seen: list[np.ndarray] = []
    prev = None
    for g, n in groups:
        if n > ROW_GROUP_FACTOR * chunk_rows or batch_col not in g.physical_schema.names:
            return None
        col = g.to_table(columns=[batch_col]).column(0)
        if col.null_count or not pa.types.is_integer(col.type):
            return None
        if n == 0:
            first.append(None)
            last.append(None)
            continue
        ids = np.concatenate([c.to_numpy() for c in col.chunks])
        run_ids = ids[_runs(ids)]
        if not all_distinct(run_ids):
            return None
        if prev is not None and run_ids[0] == prev:
            run_ids = run_ids[1:]  # the batch goes on from the group before
        seen.append(run_ids)
        first.append(ids[0])
        last.append(ids[-1])
        prev = ids[-1]
    every = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    if not all_distinct(every):
        return None
    nonempty = [k for k in range(len(first)) if first[k] is not None]
    carries: list[Any] = [None] * len(first)
    for a, b in zip(nonempty[:-1], nonempty[1:], strict=True):
        if last[a] == first[b]:
            carries[a] = last[a]
    return carries, bool(every.size < 2 or np.all(every[1:] > every[:-1]))


def _stats_prove_valid(frags: Sequence[Any], column: str) -> bool:
    """Whether every row group's statistics show a validated-only column (``prompt_len``,
    ``cached_tokens``) to be a non-null, non-negative integer: then it need not be read."""
    try:
        for f in frags:
            md = f.metadata
            schema = md.schema.to_arrow_schema()
            idx = schema.get_field_index(column)
            if idx < 0:
                return False
            typ = schema.field(idx).type
            if not pa.types.is_integer(typ) or pa.types.is_uint64(typ):
                return False
            for rg in range(md.num_row_groups):
                st = md.row_group(rg).column(idx).statistics
                if st is None or not st.has_min_max or st.null_count is None or st.null_count:
                    return False
                if st.min < 0:
                    return False
    except (KeyError, IndexError, TypeError, pa.ArrowException):
        return False
    return True


def _open_ipc(path: Path, names_of: Callable[[pa.Schema], dict[str, str]], chunk_rows: int,
              extra: tuple[str, ...]) -> TraceSource:
    try:  # the file format maps into memory: a zero-copy table
        with pa.memory_map(str(path)) as mm:
            tbl = pa.ipc.open_file(mm).read_all()
        return _from_table(tbl, names_of(tbl.schema), chunk_rows, extra, str(path))
    except pa.ArrowInvalid:
        pass
    with pa.OSFile(str(path)) as f:
        schema = pa.ipc.open_stream(f).schema
    names = names_of(schema)

    def it() -> Iterator[pa.Table]:
        with pa.memory_map(str(path)) as mm:
            for rb in pa.ipc.open_stream(mm):  # re-slice so chunks stay near chunk_rows
                for off in range(0, rb.num_rows, chunk_rows):
                    yield pa.Table.from_batches([rb.slice(off, chunk_rows)])
    return TraceSource(names, None, it, str(path), schema=schema)


def _open_csv(path: Path, names_of: Callable[[pa.Schema], dict[str, str]], chunk_rows: int,
              extra: tuple[str, ...]) -> TraceSource:
    import pyarrow.csv as pcsv  # (heavy: Arrow, loaded only on this path)

    delimiter = "\t" if ".tsv" in [s.lower() for s in path.suffixes] else ","
    parse = pcsv.ParseOptions(delimiter=delimiter)
    with pcsv.open_csv(str(path), parse_options=parse) as r:
        header_schema = r.schema
    names = names_of(header_schema)
    keep = [x for x in extra if x in header_schema.names and x not in names.values()]
    # Strings, so that a bad value anywhere in the file is a rejected row, not a read error.
    convert = pcsv.ConvertOptions(include_columns=[*names.values(), *keep],
                                  column_types={n: pa.string() for n in names.values()},
                                  strings_can_be_null=True)
    block = max(1 << 16, min(chunk_rows * 24, 1 << 26))  # ~bytes per chunk_rows rows

    def it() -> Iterator[pa.RecordBatch]:
        with pcsv.open_csv(str(path), parse_options=parse, convert_options=convert,
                           read_options=pcsv.ReadOptions(block_size=block)) as rd:
            for rb in rd:
                for off in range(0, rb.num_rows, chunk_rows):
                    yield rb.slice(off, chunk_rows)
    return TraceSource(names, None, it, str(path), schema=header_schema)
