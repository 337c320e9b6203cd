"""Request sources read into a :class:`~kernel.replay.requests.RequestSet`.

Formats (docs/requests.md maps every column):

``table``
    parquet, CSV/TSV, Arrow IPC, a directory of parquet, or in memory (Arrow table or batch,
    polars or pandas frame, anything with ``__arrow_c_stream__``): ``arrival`` (in
    ``arrival_unit``) or ``arrival_s|ms|us|ns``, ``prompt_tokens``, ``output_tokens``, and
    optionally ``request_id``, ``prefix_hashes``, ``session_id``, ``think_ns``, ``stage``.
``azure``
    the Azure LLM inference trace CSV: ``TIMESTAMP`` (a datetime), ``ContextTokens``,
    ``GeneratedTokens``.
``mooncake``
    Mooncake JSON lines: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (one id per 512-token block).
``tracev2``
    BLIS TraceV2: a header YAML and a data CSV.

The format is found from the suffix and, for CSV and YAML, the header; ``format=`` overrides.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline import safe_output

from .hashes import HASH_TYPE, chain, list_array, mix
from .requests import (
    ARRIVAL_UNITS,
    Columns,
    RejectLog,
    RequestSet,
    assemble,
    parse_ints,
    parse_ns,
    reject_parsed,
)
from .yamlfile import load_yaml

__all__ = ["FORMATS", "detect_format", "read_requests", "write_requests",
           "MOONCAKE_BLOCK_TOKENS", "TRACEV2_HASH_BLOCK_TOKENS"]

FORMATS = ("table", "azure", "mooncake", "tracev2")
MOONCAKE_BLOCK_TOKENS = 512  # the published traces' block: one hash id per 512 prompt tokens
TRACEV2_HASH_BLOCK_TOKENS = 16  # block of the hashes made for TraceV2 prefix groups (RQ5)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".ipc", ".feather", ".csv", ".tsv")
_OPTIONAL = ("request_id", "prefix_hashes", "session_id", "think_ns", "stage")
_DATETIME_RE = r"^\s*[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?\s*$"


def read_requests(source: Any, *, format: str | None = None, arrival_unit: str = "s",
                  on_reject: str = "collect", max_model_len: int | None = None,
                  hash_block_tokens: int | None = None) -> RequestSet:
    """Read requests from ``source`` (a path, a (header, data) pair, or an Arrow-able object).

    Bad rows are left out and listed in ``RequestSet.rejects`` (``on_reject="collect"``) or
    raise a ``ValueError`` naming the file, row and column (``on_reject="raise"``).
    ``max_model_len`` rejects longer prompts. ``hash_block_tokens`` gives the tokens per
    ``prefix_hashes`` entry of a table (else read from the parquet metadata key of that name);
    for TraceV2 it sets the block of the hashes made for prefix groups (default 16).
    """
    if arrival_unit not in ARRIVAL_UNITS:
        raise ValueError(f"arrival_unit must be one of {', '.join(ARRIVAL_UNITS)}, not "
                         f"{arrival_unit!r}")
    if on_reject not in ("collect", "raise"):
        raise ValueError(f"on_reject must be 'collect' or 'raise', not {on_reject!r}")
    if hash_block_tokens is not None and hash_block_tokens <= 0:
        raise ValueError(f"hash_block_tokens must be > 0, not {hash_block_tokens}")

    for part in (source if isinstance(source, tuple | list) else (source,)):
        if isinstance(part, str | os.PathLike):  # no output of the command lands on it (RL1)
            safe_output.note_read("the requests", part)
    fmt = format or detect_format(source)
    if fmt not in FORMATS:
        raise ValueError(f"unknown request format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "azure":
        return _read_azure(Path(source), on_reject=on_reject, max_model_len=max_model_len)
    if fmt == "mooncake":
        return _read_mooncake(Path(source), on_reject=on_reject, max_model_len=max_model_len)
    if fmt == "tracev2":
        header, data = _tracev2_paths(source)
        return _read_tracev2(header, data, hash_block_tokens or TRACEV2_HASH_BLOCK_TOKENS,
                             on_reject=on_reject, max_model_len=max_model_len)
    return _read_table(source, arrival_unit, hash_block_tokens, on_reject=on_reject,
                       max_model_len=max_model_len)


def detect_format(source: Any) -> str:
    """The format of ``source`` from its type, suffix and (CSV, YAML, JSON) first line."""
    if isinstance(source, (tuple, list)) and len(source) == 2 and \
            all(isinstance(s, (str, Path)) for s in source):
        return "tracev2"
    if not isinstance(source, (str, Path)):
        return "table"
    path = Path(source)
    if path.is_dir():
        return "table"
    if not path.exists():
        raise FileNotFoundError(f"request source {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        first = _first_json(path)
        if all(k in first for k in MOONCAKE_KEYS):
            return "mooncake"
        raise ValueError(f"{path}: JSON lines without the Mooncake keys "
                         f"{', '.join(MOONCAKE_KEYS)} (first record has {sorted(first)}); "
                         "pass format= if it is one of " + ", ".join(FORMATS))
    if suffix in (".yaml", ".yml"):
        return "tracev2"
    if suffix in (".csv", ".tsv"):
        names = _csv_names(path)
        if all(c in names for c in AZURE_COLUMNS):
            return "azure"
        if "arrival_time_us" in names and "input_tokens" in names:
            return "tracev2"
        return "table"
    if suffix in _TABLE_SUFFIXES:
        return "table"
    raise ValueError(f"{path}: cannot tell the request format from the suffix {suffix!r}; "
                     "pass format= (one of " + ", ".join(FORMATS) + ")")


def write_requests(requests: RequestSet, path: str | Path) -> None:
    """Write a request set's table to parquet, keeping ``hash_block_tokens`` in its metadata
    so :func:`read_requests` reads it back unchanged."""
    meta = {b"source": requests.source.encode()}
    if requests.hash_block_tokens is not None:
        meta[b"hash_block_tokens"] = str(requests.hash_block_tokens).encode()
    table = requests.table.replace_schema_metadata(meta)
    pq.write_table(table, str(path))


# ----------------------------------------------------------------------------------- helpers

def _first_json(path: Path) -> dict[str, Any]:
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: first line is not JSON: {e}") from None
                return rec if isinstance(rec, dict) else {}
    return {}


def _csv_names(path: Path) -> list[str]:
    with path.open("r", encoding="utf-8-sig", newline="") as f:
        delim = "\t" if path.suffix.lower() == ".tsv" else ","
        first = next(csv.reader(f, delimiter=delim), [])
    return [c.strip() for c in first]


def _read_csv_text(path: Path) -> tuple[pa.Table, RejectLog, int]:
    """Every column as text, rows with the wrong field count rejected: (table, log, rows_in)."""
    names = _csv_names(path)
    if not names:
        raise ValueError(f"{path}: empty file (no header row)")
    log = RejectLog()
    skipped: list[int] = []

    def on_bad(row: Any) -> str:
        at = int(row.number) - 2  # 1-based line number, header first: 0-based data row
        skipped.append(at)
        log.add(np.array([at]), f"unreadable row: {row.actual_columns} fields where the "
                f"header has {row.expected_columns}", None, [row.text])
        return "skip"

    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        t = pcsv.read_csv(
            str(path), read_options=pcsv.ReadOptions(use_threads=False),
            parse_options=pcsv.ParseOptions(delimiter=delim, invalid_row_handler=on_bad),
            convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                strings_can_be_null=True))
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: not a readable CSV: {e}") from None
    t = t.rename_columns([c.strip() for c in t.column_names])
    return t, log, t.num_rows + len(skipped)


def _kept_rows(n_kept: int, log: RejectLog) -> np.ndarray:
    """Source row numbers of the rows a CSV read kept (the skipped ones are in ``log``)."""
    skipped = log.table()["row"].to_numpy()
    allrows = np.arange(n_kept + skipped.size, dtype=np.int64)
    return np.setdiff1d(allrows, skipped, assume_unique=True)


def _require(path: Any, names: Sequence[str], needed: Sequence[str], what: str) -> None:
    missing = [c for c in needed if c not in names]
    if missing:
        raise ValueError(f"{path}: {what} needs column(s) {', '.join(missing)}; it has "
                         f"{', '.join(names) or 'none'}")


# ------------------------------------------------------------------------------------- table

def _load_table(source: Any) -> tuple[pa.Table, str, RejectLog | None, int | None]:
    """An Arrow table from any table source: (table, description, csv rejects, rows_in)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix in (".csv", ".tsv"):
            t, log, n = _read_csv_text(path)
            return t, str(path), log, n
        try:
            if suffix in (".arrow", ".ipc", ".feather"):
                return ds.dataset(str(path), format="ipc").to_table(), str(path), None, None
            if path.is_dir():
                return ds.dataset(str(path), format="parquet").to_table(), str(path), None, None
            return pq.read_table(str(path)), str(path), None, None
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{path}: not a readable table: {e}") from None
    if isinstance(source, pa.Table):
        return source, "in-memory table", None, None
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source]), "in-memory record batch", None, None
    if hasattr(source, "to_arrow"):  # polars
        return source.to_arrow(), f"in-memory {type(source).__name__}", None, None
    if type(source).__module__.startswith("pandas"):
        return pa.Table.from_pandas(source, preserve_index=False), "in-memory pandas frame", \
            None, None
    if hasattr(source, "__arrow_c_stream__"):
        return pa.table(source), f"in-memory {type(source).__name__}", None, None
    raise TypeError(f"cannot read requests from a {type(source).__name__}: give a path, a "
                    "(header, data) pair, or an Arrow table / polars or pandas frame")


def _arrival_column(names: Sequence[str], unit: str) -> tuple[str, str]:
    for u in ("ns", "us", "ms", "s"):
        if f"arrival_{u}" in names:
            return f"arrival_{u}", u
    return "arrival", unit


def _read_table(source: Any, arrival_unit: str, hash_block_tokens: int | None, *,
                on_reject: str, max_model_len: int | None) -> RequestSet:
    t, where, log, rows_in = _load_table(source)
    names = t.column_names
    acol, unit = _arrival_column(names, arrival_unit)
    _require(where, names, (acol, "prompt_tokens", "output_tokens"), "a request table")
    log = log or RejectLog()
    rows = _kept_rows(t.num_rows, log) if rows_in is not None else \
        np.arange(t.num_rows, dtype=np.int64)
    rows_in = rows_in if rows_in is not None else t.num_rows
    arrival, a_ok, a_why = parse_ns(t[acol], unit)
    prompt, p_ok, p_why = parse_ints(t["prompt_tokens"])
    output, o_ok, o_why = parse_ints(t["output_tokens"])
    good = a_ok | (a_why == "missing")  # a null arrival may be a closed-loop follow-up
    reject_parsed(log, rows, good, a_why, acol, t[acol], f"arrival times in {unit}")
    reject_parsed(log, rows, p_ok | ~good, p_why, "prompt_tokens", t["prompt_tokens"],
                  "token counts are integers")
    good &= p_ok
    reject_parsed(log, rows, o_ok | ~good, o_why, "output_tokens", t["output_tokens"],
                  "token counts are integers")
    good &= o_ok
    c = Columns(rows, arrival, a_ok, prompt, output)
    if "request_id" in names:
        c.request_id = t["request_id"].combine_chunks().cast(pa.string())
    if "session_id" in names:
        c.session_id = t["session_id"].combine_chunks().cast(pa.string())
    if "think_ns" in names:
        think, th_ok, th_why = parse_ints(t["think_ns"])
        reject_parsed(log, rows, th_ok | (th_why == "missing") | ~good, th_why, "think_ns",
                      t["think_ns"], "think times are integer ns")
        good &= th_ok | (th_why == "missing")
        c.think_ns, c.think_ok = think, th_ok
    if "stage" in names:
        stage, s_ok, s_why = parse_ints(t["stage"])
        bad_range = s_ok & ((stage < 0) | (stage > np.iinfo(np.int32).max))
        s_why[bad_range] = "out of range"
        s_ok &= ~bad_range
        reject_parsed(log, rows, s_ok | ~good, s_why, "stage", t["stage"],
                      "a stage is an index >= 0")
        good &= s_ok
        c.stage = stage.astype(np.int32)
    if "prefix_hashes" in names and t["prefix_hashes"].null_count < t.num_rows:
        hbt = hash_block_tokens or _meta_block(t.schema, where)
        hashes, h_ok, h_why, h_raw = _parse_hashes(t["prefix_hashes"])
        reject_parsed(log, rows, h_ok | ~good, h_why, "prefix_hashes", h_raw,
                      "a list of integer block hashes in [0, 2**64)")
        good &= h_ok
        c.prefix_hashes = hashes
    else:
        hbt = None
    c = c.take(np.flatnonzero(good))
    return assemble(c, log, rows_in=rows_in, source=where, hash_block_tokens=hbt,
                    max_model_len=max_model_len, on_reject=on_reject)


def _meta_block(schema: pa.Schema, where: str) -> int:
    raw = (schema.metadata or {}).get(b"hash_block_tokens")
    if raw is None:
        raise ValueError(f"{where}: has prefix_hashes but no hash_block_tokens: pass "
                         "hash_block_tokens= (the prompt tokens each entry covers)")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{where}: metadata hash_block_tokens {raw!r} is not an integer"
                         ) from None
    if value <= 0:
        raise ValueError(f"{where}: metadata hash_block_tokens must be > 0, not {value}")
    return value


def _parse_hashes(col: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray, np.ndarray, pa.Array]:
    """``prefix_hashes`` as list<uint64>: from an integer list column or text ``"[1, 2]"``."""
    a = col.combine_chunks()
    n = len(a)
    why = np.full(n, "", dtype=object)
    if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
        if pa.types.is_integer(a.type.value_type):
            flat = pc.list_flatten(a)
            if pa.types.is_unsigned_integer(flat.type):
                neg = flat.is_null()
            else:
                neg = pc.fill_null(pc.less(flat, pa.scalar(0, flat.type)), True)
            parent = np.asarray(pc.list_parent_indices(a), dtype=np.int64)
            bad = np.zeros(n, dtype=bool)
            bad[parent[np.asarray(neg, dtype=bool)]] = True
            why[bad] = "has a negative or null entry"
            ok = ~bad
            fixed = pc.if_else(pa.array(ok), a, pa.scalar(None, a.type))
            return fixed.cast(HASH_TYPE), ok, why, a
        why[:] = f"is a list of {a.type.value_type}, not integers"
        return pa.nulls(n, HASH_TYPE), np.zeros(n, dtype=bool), why, a
    text = a.cast(pa.string())
    out: list[list[int] | None] = []
    ok = np.ones(n, dtype=bool)
    for i, s in enumerate(text.to_pylist()):
        if s is None or not s.strip():
            out.append(None)
            continue
        try:
            vals = [int(v) for v in s.strip().strip("[]").replace(",", " ").split()]
            if any(v < 0 or v >= 2**64 for v in vals):
                raise ValueError
            out.append(vals)
        except ValueError:
            out.append(None)
            ok[i] = False
            why[i] = "is not a list of integers in [0, 2**64)"
    return pa.array(out, HASH_TYPE), ok, why, text


# ------------------------------------------------------------------------------------- azure

def _read_azure(path: Path, *, on_reject: str, max_model_len: int | None) -> RequestSet:
    t, log, rows_in = _read_csv_text(path)
    _require(path, t.column_names, AZURE_COLUMNS, "an Azure LLM inference trace")
    rows = _kept_rows(t.num_rows, log)
    ts = t["TIMESTAMP"].combine_chunks()
    is_dt = np.asarray(pc.fill_null(pc.match_substring_regex(ts, _DATETIME_RE), False),
                       dtype=bool)
    text = pc.if_else(pa.array(is_dt), pc.utf8_trim_whitespace(ts), pa.scalar("1970-01-01"))
    stamp = pc.cast(text, pa.timestamp("ns")).cast(pa.int64()).to_numpy(zero_copy_only=False)
    t_why = np.where(np.asarray(ts.is_null()), "missing", "is not a datetime").astype(object)
    reject_parsed(log, rows, is_dt, t_why, "TIMESTAMP", ts,
                  "YYYY-MM-DD HH:MM:SS[.fffffff] datetimes")
    good = is_dt.copy()
    prompt, p_ok, p_why = parse_ints(t["ContextTokens"])
    reject_parsed(log, rows, p_ok | ~good, p_why, "ContextTokens", t["ContextTokens"],
                  "token counts are integers")
    good &= p_ok
    output, o_ok, o_why = parse_ints(t["GeneratedTokens"])
    reject_parsed(log, rows, o_ok | ~good, o_why, "GeneratedTokens", t["GeneratedTokens"],
                  "token counts are integers")
    good &= o_ok
    start = int(stamp[good].min()) if good.any() else 0
    notes: tuple[str, ...] = ()
    if good.any():
        first = np.datetime64(start, "ns")
        notes = (f"time 0 is the earliest TIMESTAMP, {first}",)
    c = Columns(rows, stamp - start, good.copy(), prompt, output).take(np.flatnonzero(good))
    return assemble(c, log, rows_in=rows_in, source=str(path), hash_block_tokens=None,
                    max_model_len=max_model_len, on_reject=on_reject, notes=notes)


# ---------------------------------------------------------------------------------- mooncake

def _read_mooncake(path: Path, *, on_reject: str, max_model_len: int | None) -> RequestSet:
    log = RejectLog()
    ts: list[str | None] = []
    inp: list[str | None] = []
    out: list[str | None] = []
    ids: list[list[int]] = []
    rows: list[int] = []
    n = 0
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue  # blank lines are not records
            i = n
            n += 1
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                log.add(np.array([i]), f"unreadable row: not JSON ({e.msg})", None,
                        [line.strip()[:200]])
                continue
            if not isinstance(rec, dict):
                log.add(np.array([i]), "unreadable row: not a JSON object", None,
                        [line.strip()[:200]])
                continue
            h = rec.get("hash_ids", [])
            if not isinstance(h, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  and 0 <= v < 2**63 for v in h):
                log.add(np.array([i]), "hash_ids is not a list of integers >= 0", "hash_ids",
                        [json.dumps(h)[:200]])
                continue
            rows.append(i)
            ts.append(_text(rec.get("timestamp")))
            inp.append(_text(rec.get("input_length")))
            out.append(_text(rec.get("output_length")))
            ids.append(h)
    r = np.asarray(rows, dtype=np.int64)
    ts_a, in_a, out_a = (pa.array(x, pa.string()) for x in (ts, inp, out))
    arrival, a_ok, a_why = parse_ns(ts_a, "ms")
    reject_parsed(log, r, a_ok, a_why, "timestamp", ts_a, "milliseconds from the start")
    good = a_ok.copy()
    prompt, p_ok, p_why = parse_ints(in_a)
    reject_parsed(log, r, p_ok | ~good, p_why, "input_length", in_a, "token counts are integers")
    good &= p_ok
    output, o_ok, o_why = parse_ints(out_a)
    reject_parsed(log, r, o_ok | ~good, o_why, "output_length", out_a,
                  "token counts are integers")
    good &= o_ok
    # Only whole blocks are hashed (the replay contract); the published lists also name the partial
    # last block. Re-chained so that equal entry i means an equal prefix whatever the ids.
    full = np.maximum(prompt, 0) // MOONCAKE_BLOCK_TOKENS
    keep = [h[: int(k)] for h, k in zip(ids, full, strict=True)]
    lens = np.array([len(h) for h in keep], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = np.fromiter((v for h in keep for v in h), dtype=np.uint64, count=int(lens.sum()))
    hashes = list_array(offsets, chain(offsets, flat))
    c = Columns(r, arrival, a_ok, prompt, output, prefix_hashes=hashes)
    c = c.take(np.flatnonzero(good))
    return assemble(c, log, rows_in=n, source=str(path), hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
                    max_model_len=max_model_len, on_reject=on_reject)


def _text(v: Any) -> str | None:
    if v is None or isinstance(v, (dict, list)):
        return None if v is None else json.dumps(v)
    return str(v)


# ----------------------------------------------------------------------------------- tracev2

_TRACEV2_NEEDED = ("request_id", "input_tokens", "output_tokens", "arrival_time_us")
_TIME_UNITS = ("us", "microseconds", "µs", "μs")


def _tracev2_paths(source: Any) -> tuple[Path, Path]:
    if isinstance(source, (tuple, list)):
        a, b = (Path(s) for s in source)
        header, data = (a, b) if a.suffix.lower() in (".yaml", ".yml") else (b, a)
        return header, data
    path = Path(source)
    if path.suffix.lower() in (".yaml", ".yml"):
        for cand in (path.with_suffix(".csv"), path.with_name(path.stem.replace("header", "data")
                                                             + ".csv")):
            if cand.exists() and cand != path:
                return path, cand
        raise ValueError(f"{path}: TraceV2 header without its data CSV (looked for "
                         f"{path.with_suffix('.csv').name}); pass (header, data)")
    for cand in (path.with_suffix(".yaml"), path.with_suffix(".yml"),
                 path.with_name(path.stem.replace("data", "header") + ".yaml")):
        if cand.exists() and cand != path:
            return cand, path
    raise ValueError(f"{path}: TraceV2 data without its header YAML (looked for "
                     f"{path.with_suffix('.yaml').name}); pass (header, data)")


def _read_header(header: Path) -> dict[str, Any]:
    doc = load_yaml(header)
    if not isinstance(doc, dict) or "trace_version" not in doc:
        raise ValueError(f"{header}: a TraceV2 header is a mapping with trace_version")
    if not isinstance(doc["trace_version"], int) or doc["trace_version"] < 2:
        raise ValueError(f"{header}: trace_version {doc['trace_version']!r}: expected an "
                         "integer >= 2")
    unit = doc.get("time_unit")
    if unit is not None and str(unit) not in _TIME_UNITS:
        raise ValueError(f"{header}: time_unit {unit!r}: the *_us columns are microseconds; "
                         f"expected one of {', '.join(_TIME_UNITS)}")
    return doc


def _read_tracev2(header: Path, data: Path, block: int, *, on_reject: str,
                  max_model_len: int | None) -> RequestSet:
    doc = _read_header(header)
    t, log, rows_in = _read_csv_text(data)
    names = t.column_names
    _require(data, names, _TRACEV2_NEEDED, "TraceV2 data")
    rows = _kept_rows(t.num_rows, log)
    n = t.num_rows

    def ints(name: str, default: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if name not in names:
            return np.full(n, default, np.int64), np.ones(n, bool), np.full(n, "", object)
        return parse_ints(t[name])

    good = np.ones(n, dtype=bool)
    parsed: dict[str, np.ndarray] = {}
    for name in ("arrival_time_us", "send_time_us", "input_tokens", "output_tokens",
                 "prefix_length", "server_input_tokens"):
        v, ok, why = ints(name)
        if name in names:
            reject_parsed(log, rows, ok | ~good, why, name, t[name], "integers")
        good &= ok
        parsed[name] = v
    arrival_us = parsed["arrival_time_us"]
    send_us = parsed["send_time_us"]
    # BLIS injects at send_time_us when recorded (> 0), else at arrival_time_us, shifted so
    # the earliest injection sits on the arrival clock's origin (inference-sim replay.go).
    inject = np.where(send_us > 0, send_us, arrival_us)
    shift = int(inject[good].min() - arrival_us[good].min()) if good.any() else 0
    arrival_ns = (inject - shift) * 1000
    group = t["prefix_group"].combine_chunks().fill_null("") if "prefix_group" in names else \
        pa.array([""] * n, pa.string())
    in_group = np.asarray(pc.not_equal(group, ""), dtype=bool)
    plen = parsed["prefix_length"]
    # input_tokens is the suffix after a group's shared prefix; without a group the server's
    # count, when recorded, is authoritative (inference-sim replay.go effectiveInputTokenCount).
    prompt = np.where(in_group, plen + parsed["input_tokens"],
                      np.where(parsed["server_input_tokens"] > 0,
                               parsed["server_input_tokens"], parsed["input_tokens"]))
    neg = good & in_group & (plen < 0)
    log.add(rows[neg], "prefix_length is negative", "prefix_length", plen[neg])
    good &= ~neg
    sess = t["session_id"].combine_chunks() if "session_id" in names else None
    if sess is not None:
        sess = pc.if_else(pc.equal(pc.fill_null(sess, ""), ""), pa.scalar(None, pa.string()),
                          sess)
    hashes = _group_hashes(group.to_pylist(), np.where(in_group, plen, 0), block)
    c = Columns(rows, arrival_ns, np.ones(n, dtype=bool), prompt, parsed["output_tokens"],
                request_id=t["request_id"].combine_chunks(), prefix_hashes=hashes,
                session_id=sess)
    c = c.take(np.flatnonzero(good))
    notes = (f"TraceV2 mode {doc.get('mode', '?')!r}, warm_up_requests "
             f"{doc.get('warm_up_requests', 0)} (kept: they loaded the server)",)
    return assemble(c, log, rows_in=rows_in, source=f"{header} + {data}",
                    hash_block_tokens=block, max_model_len=max_model_len, on_reject=on_reject,
                    notes=notes)


def _group_hashes(groups: list[str], prefix_len: np.ndarray, block: int) -> pa.Array:
    """Hash chains over each row's shared prefix: block b of group g has content id H(g, b)."""
    gid = np.array([_stable_id(g) for g in groups], dtype=np.uint64)
    nblocks = np.maximum(prefix_len, 0) // block
    offsets = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int64)
    parent = np.repeat(np.arange(len(groups)), nblocks)
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][parent]
    with np.errstate(over="ignore"):
        ids = mix(gid[parent] ^ mix(pos.astype(np.uint64)))
    return list_array(offsets, chain(offsets, ids))


def _stable_id(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
