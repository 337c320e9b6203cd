"""The trace format: reading request-level step traces and setting bad rows aside.

A trace has one row per request per step (``docs/traces.md``):

=================  ========  =========================================================
column             needed    meaning
=================  ========  =========================================================
batch_id           yes       the step; integer. Rows of one batch need not be contiguous
scheduled          yes       tokens scheduled for this request this step
computed           yes       tokens of this request already computed
prompt_len         yes       the request's prompt length (carried, not priced)
cached_tokens      no        prefix-cache hits (carried, not priced)
decode_threshold   no        per-batch: ``scheduled > threshold`` is a prefill
sm_budget          no        per-batch: SMs the step may use (0 = all)
=================  ========  =========================================================

Column names are configurable (``columns={"scheduled": "num_scheduled", ...}``). Sources
(files, directories, globs, datasets, tables, streams) are opened by :mod:`kernel.io.sources`.

Validation is in two stages. :func:`coerce` checks each row on its own (nulls, non-integers,
int64 overflow, negatives, ``computed + scheduled`` overflow) and records rejects with the
row number, the batch id, the column, the reason and the row's values. :func:`batch_checks`
runs on whole batches: per-batch int64 sums that overflow, per-batch columns whose values
disagree within a batch, and — so that no batch is ever priced with a request missing —
every other row of a batch that has a rejected row. Every input row ends up either priced or
in the rejects table: ``rows in = rows priced + rows rejected``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "BATCH_COLUMNS",
    "CANONICAL",
    "OPTIONAL",
    "REJECT_SCHEMA",
    "REQUIRED",
    "RejectedRowError",
    "Rows",
    "TraceError",
    "coerce",
    "narrow_type",
    "record_rejects",
    "reject_frame",
    "reject_table",
    "row_values",
]

REQUIRED = ("batch_id", "scheduled", "computed", "prompt_len")
OPTIONAL = ("cached_tokens", "decode_threshold", "sm_budget")
CANONICAL = REQUIRED + OPTIONAL
BATCH_COLUMNS = ("decode_threshold", "sm_budget")  # constant within a batch
# >= 0 (a trace's decode_threshold is validated like the option: RL8)
COUNTS = ("scheduled", "computed", "prompt_len", "cached_tokens", "sm_budget", "decode_threshold")
INT64_MAX = np.iinfo(np.int64).max
_I32_MIN, _I32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
_U16_MAX = int(np.iinfo(np.uint16).max)
KEEP_PREFIX = "keep:"  # carried (not validated) columns in a chunk: ``keep:<name>``

# Reason codes (the ``reason`` column of the rejects table).
NULL = "null"
NON_INTEGER = "non_integer"
NEGATIVE = "negative"
OVERFLOW = "overflow"
CONFLICT = "conflicting_batch_value"
UNKNOWN_BATCH = "unknown_batch_id"
DUPLICATE_BATCH = "duplicate_batch_id"
BATCH_REJECTED = "batch_rejected"
ZERO_TOKENS = "zero_tokens"  # a batch that schedules no token is no forward pass (RL8)

REJECT_SCHEMA = pa.schema([
    ("row", pa.int64()),  # 0-based row number in the input (per-batch table: in that table)
    ("batch_id", pa.int64()),  # null when the batch id itself is unreadable
    ("reason", pa.string()),
    ("column", pa.string()),
    ("detail", pa.string()),
    ("source", pa.string()),  # "trace" or "batches" (the per-batch table)
    ("values", pa.string()),  # the row as read: "name=value, ..."
])


class TraceError(ValueError):
    """The whole input is unusable (unreadable, a missing column, an unsupported type)."""


class RejectedRowError(TraceError):
    """Raised in strict mode at the first rejected row."""

    def __init__(self, reject: Mapping[str, Any]):
        self.reject = dict(reject)
        super().__init__(f"row {reject['row']} (batch {reject['batch_id']}) rejected: "
                         f"{reject['reason']}: {reject['detail']}")


def reject_table(row: Any, batch_id: Any, reason: str | Sequence[str],
                 column: str | Sequence[str], detail: str | Sequence[str],
                 values: Sequence[str], *, source: str = "trace",
                 batch_id_null: np.ndarray | None = None) -> pa.Table:
    """The one constructor of :data:`REJECT_SCHEMA` tables: one row per rejected input row.

    ``row`` and ``batch_id`` are integer arrays (``batch_id_null`` marks unreadable ids);
    ``reason``, ``column`` and ``detail`` are one value per row or one string for all;
    ``values`` is the row as read (``"name=value, ..."``), one per row.
    """
    n = len(values)

    def text(v: str | Sequence[str]) -> pa.Array:
        return pa.array([v] * n if isinstance(v, str) else list(v), pa.string())

    return pa.table({
        "row": pa.array(np.asarray(row, np.int64), pa.int64()),
        "batch_id": pa.array(np.asarray(batch_id, np.int64), pa.int64(), mask=batch_id_null),
        "reason": text(reason),
        "column": text(column),
        "detail": text(detail),
        "source": text(source),
        "values": pa.array(list(values), pa.string()),
    }, schema=REJECT_SCHEMA)


def row_values(rows: Rows) -> list[str]:
    """The ``values`` text of validated rows rejected with their batch."""
    return [f"batch_id={b}, scheduled={x}, computed={y}" for b, x, y in
            zip(rows.batch_id.tolist(), rows.scheduled.tolist(), rows.computed.tolist(),
                strict=True)]


def record_rejects(tbl: pa.Table, rejects: list[pa.Table] | None, strict: bool) -> None:
    """Strict mode raises :class:`RejectedRowError` at the table's first row; otherwise the
    table joins ``rejects`` (when collected)."""
    if strict and tbl.num_rows:
        raise RejectedRowError(tbl.slice(0, 1).to_pylist()[0])
    if rejects is not None:
        rejects.append(tbl)


# -- validated rows -----------------------------------------------------------------------

def narrow_type(v: np.ndarray, lo: int | None = None, hi: int | None = None) -> np.dtype:
    """The type :meth:`Rows.narrowed` stores an integer column in: uint16 when every value is
    in 0..65535, else int32 for an 8-byte column that fits, else its own (``lo``/``hi``: its
    least and greatest value when known)."""
    if v.dtype.itemsize <= 2 or not v.size:
        return v.dtype
    lo = int(v.min()) if lo is None else lo
    hi = int(v.max()) if hi is None else hi
    if lo >= 0 and hi <= _U16_MAX:
        return np.dtype(np.uint16)
    if v.dtype.itemsize > 4 and _I32_MIN <= lo and hi <= _I32_MAX:
        return np.dtype(np.int32)
    return v.dtype


@dataclass
class Rows:
    """Coerced rows; ``bad`` marks rows already rejected on their own.

    ``batch_id`` is int64; the other integer columns are int64 or, where every value fits
    (a narrow source type, or :meth:`narrowed`), int32, which halves the memory of rows that
    wait to be grouped; :meth:`widened` makes them int64 before pricing.

    ``decode_threshold`` / ``sm_budget`` are None when the trace has no such column (the
    pricing arguments apply). ``prompt_len`` and ``cached_tokens`` are validated, not kept.
    """

    row: np.ndarray
    batch_id: np.ndarray
    scheduled: np.ndarray
    computed: np.ndarray
    bad: np.ndarray  # bool
    decode_threshold: np.ndarray | None = None
    sm_budget: np.ndarray | None = None
    extra: dict[str, pa.Array] | None = None  # carried trace columns (``keep=``), unvalidated

    def __len__(self) -> int:
        return int(self.row.size)

    def narrowed(self) -> Rows:
        """Integer columns (but ``batch_id``) stored as uint16 or int32 where every value
        fits (rows waiting to be grouped: scheduled tokens and many per-batch settings fit
        16 bits; :func:`narrow_type`); in place."""
        for name in _NARROWABLE:
            v = getattr(self, name)
            if v is not None and (t := narrow_type(v)) != v.dtype:
                setattr(self, name, v.astype(t))
        return self

    def widened(self) -> Rows:
        """Every integer column as int64 (what the walk works in); in place."""
        for name in _NARROWABLE:
            v = getattr(self, name)
            if v is not None and v.dtype != np.int64:
                setattr(self, name, v.astype(np.int64))
        return self

    def nbytes(self) -> int:
        """Bytes the columns hold."""
        n = sum(v.nbytes for x in _ARRAY_FIELDS if (v := getattr(self, x)) is not None)
        return n + sum(a.nbytes for a in (self.extra or {}).values())

    def _map(self, f: Any, g: Any) -> Rows:
        vals: list[Any] = [None if (v := getattr(self, x)) is None else f(v)
                           for x in _ARRAY_FIELDS]
        extra = None if self.extra is None else {k: g(v) for k, v in self.extra.items()}
        return Rows(**dict(zip(_ARRAY_FIELDS, vals, strict=True)), extra=extra)

    def take(self, idx: np.ndarray) -> Rows:
        return self._map(lambda v: v[idx], lambda a: a.take(pa.array(idx, pa.int64())))

    def slice(self, lo: int, hi: int) -> Rows:
        """Rows lo..hi as views (no copy)."""
        return self._map(lambda v: v[lo:hi], lambda a: a.slice(lo, max(hi - lo, 0)))

    @staticmethod
    def concat(parts: list[Rows], *, wide: bool = False) -> Rows:
        """The rows of ``parts`` one after another; ``wide``: as :meth:`widened` (in the
        same pass)."""
        parts = [p for p in parts if len(p)] or parts[:1]
        if not parts:
            return Rows.empty()
        if len(parts) == 1:
            return parts[0].widened() if wide else parts[0]
        out: list[Any] = []
        for x in _ARRAY_FIELDS:
            vals = [getattr(p, x) for p in parts]
            dtype = np.int64 if wide and x in _NARROWABLE else None
            out.append(None if vals[0] is None else np.concatenate(vals, dtype=dtype))
        extra = None
        if parts[0].extra is not None:
            extra = {k: pa.concat_arrays([p.extra[k] for p in parts if p.extra is not None])
                     for k in parts[0].extra}
        return Rows(**dict(zip(_ARRAY_FIELDS, out, strict=True)), extra=extra)

    @staticmethod
    def empty() -> Rows:
        z = np.zeros(0, np.int64)
        return Rows(z, z, z, z, np.zeros(0, bool))

    def to_arrow(self) -> pa.Table:
        cols = {x: v for x in _ARRAY_FIELDS if (v := getattr(self, x)) is not None}
        cols.update({KEEP_PREFIX + k: v for k, v in (self.extra or {}).items()})
        return pa.table(cols)

    @staticmethod
    def from_arrow(t: pa.Table) -> Rows:
        names = set(t.column_names)
        vals: list[Any] = [t.column(x).to_numpy() if x in names else None
                           for x in _ARRAY_FIELDS]
        extra = {n[len(KEEP_PREFIX):]: t.column(n).combine_chunks() for n in t.column_names
                 if n.startswith(KEEP_PREFIX)}
        return Rows(**dict(zip(_ARRAY_FIELDS, vals, strict=True)), extra=extra or None)


def all_distinct(ids: np.ndarray) -> bool:
    """No value twice (batch ids of runs: each batch's rows together). Monotone arrays, the
    usual case, need no sort (np.unique hashes, which is slower still). In a column with
    repeats (a shuffled or request-major log) one shows within its first few thousand values,
    so growing prefixes are sorted first: a 1M-row group's answer then costs a 4,096-value
    sort, not a 1M one (at most ~7% more sorting when there is no repeat)."""
    if ids.size < 2:
        return True
    if bool(np.all(ids[1:] > ids[:-1])) or bool(np.all(ids[1:] < ids[:-1])):
        return True
    n = 1 << 12
    while True:
        s = np.sort(ids[:n])
        if not bool(np.all(s[1:] != s[:-1])):
            return False
        if n >= ids.size:
            return True
        n *= 16


_ARRAY_FIELDS = ("row", "batch_id", "scheduled", "computed", "bad", "decode_threshold",
                 "sm_budget")
_NARROWABLE = ("row", "scheduled", "computed", "decode_threshold", "sm_budget")


def _coerce_column(arr: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(int64 values, reason codes per row: 0 ok, 1 null, 2 non-integer, 3 overflow — or
    None when every value is fine)."""
    n = len(arr)
    t = arr.type
    nulls = arr.null_count
    code: np.ndarray | None = None
    if nulls:
        code = np.zeros(n, np.int8)
        code[arr.is_null().to_numpy(zero_copy_only=False)] = 1

    def mark(mask: np.ndarray, value: int) -> None:
        nonlocal code
        if mask.any():
            if code is None:
                code = np.zeros(n, np.int8)
            code[mask & (code == 0)] = value

    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            big = pc.fill_null(pc.greater(arr, pa.scalar(INT64_MAX, pa.uint64())), False)
            mark(big.to_numpy(zero_copy_only=False), 3)
            arr = pc.cast(arr, pa.int64(), safe=False)
        vals = (pc.fill_null(arr, 0) if nulls else arr).to_numpy(zero_copy_only=False)
        fits32 = t.bit_width <= (32 if pa.types.is_signed_integer(t) else 16)
        return vals.astype(np.int32 if fits32 else np.int64, copy=False), code
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        f = pc.cast(arr, pa.float64()) if not pa.types.is_float64(t) else arr
        fv = (pc.fill_null(f, 0.0) if nulls else f).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            nonint = ~np.isfinite(fv) | (np.floor(fv) != fv)
            over = ~nonint & (np.abs(fv) >= 2.0**63)
        mark(nonint, 2)
        mark(over, 3)
        ok = ~(nonint | over)
        return np.where(ok, fv, 0.0).astype(np.int64), code
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:  # fast path: every value is a plain integer
            vals = pc.cast(pc.fill_null(arr, "0") if nulls else arr, pa.int64())
            return vals.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), code
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        s = pl.Series(arr).str.strip_chars()
        as_int = s.cast(pl.Int64, strict=False)
        as_float = s.cast(pl.Float64, strict=False)
        iv = as_int.fill_null(0).to_numpy()
        fv = as_float.fill_null(np.nan).to_numpy()
        int_ok = as_int.is_not_null().to_numpy() & ~arr.is_null().to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            integral = np.isfinite(fv) & (np.floor(fv) == fv)
        over = ~int_ok & integral & (np.abs(fv) >= 2.0**63)
        fine_float = ~int_ok & integral & ~over
        mark(~int_ok & ~integral, 2)
        mark(over, 3)
        vals = np.where(int_ok, iv, np.where(fine_float, fv, 0.0).astype(np.int64))
        return vals.astype(np.int64), code
    if pa.types.is_null(t):
        return np.zeros(n, np.int64), np.ones(n, np.int8)
    raise TraceError(f"column {name!r} has type {t}; counts must be integers")


_CHECK_ONLY = ("prompt_len", "cached_tokens")
_CODE_REASON = {1: NULL, 2: NON_INTEGER, 3: OVERFLOW, 4: NEGATIVE}


def _whole(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _values_text(raw: pa.Table, idx: np.ndarray) -> list[str]:
    sub = raw.select([c for c in raw.column_names if not c.startswith(KEEP_PREFIX)])
    sub = sub.take(pa.array(idx, pa.int64()))
    cols = {n: sub.column(n).to_pylist() for n in sub.column_names}
    return [", ".join(f"{n}={cols[n][i]!r}" for n in sub.column_names) for i in range(len(idx))]


def coerce(raw: pa.Table, offset: int, *, rejects: list[pa.Table] | None = None,
           strict: bool = False, source: str = "trace") -> Rows:
    """Row-local validation of one raw chunk (canonical names); row numbers start at ``offset``.

    Returns the rows that have a batch id (``bad`` marks the rejected ones) and appends the
    reject records of every rejected row.
    """
    n = raw.num_rows
    present = set(raw.column_names)
    values: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    for name in CANONICAL:
        if name not in present:
            continue
        col = raw.column(name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if name in _CHECK_ONLY and pa.types.is_signed_integer(arr.type) and not arr.null_count:
            lo = pc.min(arr).as_py()  # validated, not kept: no conversion needed
            if lo is None or lo >= 0:
                continue
        v, c = _coerce_column(arr, name)
        if name in COUNTS and v.size and int(v.min()) < 0:
            neg = v < 0
            if c is None:
                c = np.zeros(n, np.int8)
            c[neg & (c == 0)] = 4
        if c is not None:
            codes[name] = c
        values[name] = v
    # (a zero column only where one is missing: an 8 MiB calloc a chunk otherwise)
    if "scheduled" not in values or "computed" not in values:
        zeros = np.zeros(n, np.int64)
        values.setdefault("scheduled", zeros)
        values.setdefault("computed", zeros)
    sched, comp = values["scheduled"], values["computed"]
    bad = np.zeros(n, bool)
    for c in codes.values():
        bad |= c != 0
    if n and int(sched.max()) > INT64_MAX - int(comp.max()):
        ctx_over = ~bad & (comp > INT64_MAX - sched)
        bad |= ctx_over
    extra = {c[len(KEEP_PREFIX):]: _whole(raw.column(c)) for c in raw.column_names
             if c.startswith(KEEP_PREFIX)}
    row_type = np.int32 if offset + n <= _I32_MAX else np.int64
    rows = Rows(np.arange(offset, offset + n, dtype=row_type),
                values["batch_id"].astype(np.int64, copy=False), sched, comp,
                bad, values.get("decode_threshold"), values.get("sm_budget"), extra or None)
    if bad.any():
        idx = np.flatnonzero(bad)
        reasons, cols, details = [], [], []
        for i in idx:
            for name, c in codes.items():
                if c[i]:
                    reasons.append(_CODE_REASON[int(c[i])])
                    cols.append(name)
                    details.append(_detail(int(c[i]), name, raw.column(name)[int(i)].as_py()))
                    break
            else:
                reasons.append(OVERFLOW)
                cols.append("computed")
                details.append("computed + scheduled exceeds int64")
        id_bad = codes["batch_id"] != 0 if "batch_id" in codes else np.zeros(n, bool)
        tbl = reject_table(idx + offset, values["batch_id"][idx], reasons, cols, details,
                           _values_text(raw, idx), source=source, batch_id_null=id_bad[idx])
        record_rejects(tbl, rejects, strict)
        if id_bad.any():  # rows without a batch cannot take part in batch checks
            rows = rows.take(np.flatnonzero(~id_bad))
    return rows


def _detail(code: int, name: str, value: object) -> str:
    if code == 1:
        return f"{name} is null"
    if code == 2:
        return f"{name} = {value!r} is not an integer"
    if code == 3:
        return f"{name} = {value!r} does not fit int64"
    return f"{name} = {value!r} is negative"


def reject_frame(parts: list[pa.Table]) -> pl.DataFrame:
    if not parts:
        return pl.from_arrow(REJECT_SCHEMA.empty_table())  # type: ignore[return-value]
    return pl.from_arrow(pa.concat_tables(parts))  # type: ignore[return-value]


def __getattr__(name: str) -> Any:
    # the sources moved to kernel.io.sources (which imports this module)
    if name in ("open_trace", "TraceSource"):
        from . import sources  # (sources.py reads rows in this module's format)

        return getattr(sources, name)
    raise AttributeError(f"module 'kernel.io.trace' has no attribute {name!r}")
