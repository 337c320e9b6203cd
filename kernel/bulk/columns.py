"""The priced table: its base schema, and the extension point that adds per-batch columns.

One priced row per batch. The base columns (:data:`PRICED_SCHEMA`) are always there. Two
things can add columns after them, without editing the pricing core:

**Column producers** — a :class:`ColumnProducer` names the columns it adds (``fields``) and a
function that computes them for a whole set of batches at once::

    def produce(ctx: BatchContext) -> Mapping[str, np.ndarray | pa.Array]:
        # ctx.pool     the ResolvedPool being priced
        # ctx.summary  step.BatchSummary of arrays (one entry per batch)
        # ctx.totals   step.StepTotals of arrays (compose's result, before finish)
        # ctx.priced   the base columns as numpy arrays (overlap_ns, sm_ns, tokens, ...)
        # ctx.inputs   the trace columns named in ``inputs``, one value per batch (its first row)
        # ctx.row_totals  the producer's RowTotals, one value per batch
        # ctx.rows, ctx.starts    the request rows grouped by batch, and where each batch starts
        return {"limits": ...}  # one entry per field, each of length ctx.n

    price(pool, trace, producers=[ColumnProducer("limits", (pa.field("limits", pa.string()),),
                                                 produce)])

A producer passed as ``producers=[...]`` to :func:`kernel.bulk.price` / ``price_file`` adds its
columns to that run, in the order given. A producer
that needs trace columns lists them in ``inputs``; the trace must have them.

**Passed-through trace columns** — ``keep=["replica", "ts"]`` copies trace columns to the
output, keyed by batch: each batch takes the value of its first row (in input order).

A producer that needs of the rows only per-batch sums or maxima of a per-row quantity names
them as row totals (:class:`RowTotal`, ``totals=``) and declares ``needs_rows=False``: the
engine then computes them wherever the rows are, and a trace in no known order may be priced
as it streams, without its rows kept by batch (``docs/traces.md``, mode ``summed``).

A name may appear once in the output: a producer or ``keep`` column that repeats a base
column or another added column is an error before any row is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..io.trace import Rows, TraceError, record_rejects, reject_table
from ..model import limits, step
from .groups import Groups, regroup
from .walk import RESOURCE_NAMES, finish_columns, summarise_columns

if TYPE_CHECKING:
    from ..model.resolved import ResolvedPool

__all__ = [
    "BOTTLENECK_TYPE",
    "PRICED_SCHEMA",
    "KV_BLOCKS_HELD",
    "LONGEST_CONTEXT",
    "BatchContext",
    "ColumnProducer",
    "OutputSpec",
    "RowTotal",
    "DICTIONARY_ON_DISK",
    "check_rows",
    "dictionary_on_disk",
    "with_measured",
    "price_grouped",
    "priced_table",
]

# ``bottleneck`` is a dictionary column; the field metadata makes polars read it as
# pl.Enum(RESOURCE_NAMES) (pyarrow reads a dictionary either way).
BOTTLENECK_TYPE = pa.dictionary(pa.uint8(), pa.string(), ordered=True)
_ENUM_META = {b"_PL_ENUM_VALUES2": "".join(f"{len(n)};{n}" for n in RESOURCE_NAMES).encode()}
_BOTTLENECK_VALUES = pa.array(list(RESOURCE_NAMES), pa.string())

# A producer's field may ask parquet for dictionary encoding (strings and dictionary columns
# always get it): a per-run constant such as ``pool`` then costs one entry per row group.
DICTIONARY_ON_DISK = {b"blis.parquet_dictionary": b"1"}


def dictionary_on_disk(f: pa.Field) -> bool:
    """Whether parquet stores ``f`` dictionary-encoded."""
    return (pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)
            or (f.metadata or {}).get(b"blis.parquet_dictionary") == b"1")


PRICED_SCHEMA = pa.schema(
    [("batch_id", pa.int64()), ("overlap_ns", pa.int64()), ("no_overlap_ns", pa.int64()),
     pa.field("bottleneck", BOTTLENECK_TYPE, metadata=_ENUM_META)]
    + [(f"{n}_ns", pa.int64()) for n in RESOURCE_NAMES]
    + [("tokens", pa.int64()), ("requests", pa.int64()), ("prefill_requests", pa.int64()),
       ("decode_requests", pa.int64())])


@dataclass(frozen=True)
class BatchContext:
    """What a column producer sees: one entry per batch in every array.

    The priced request rows (``priced_rows``) are in request order within each batch but,
    from a trace in no known order, not necessarily contiguous; :attr:`rows` and
    :attr:`starts` give them grouped (batch ``b`` from ``starts[b]`` to the next start),
    grouping them on first use."""

    pool: ResolvedPool
    summary: step.BatchSummary
    totals: step.StepTotals
    priced: Mapping[str, np.ndarray]
    inputs: Mapping[str, pa.Array]
    priced_rows: Rows | None = None  # None when the rows streamed by (no producer needs them)
    groups: Groups | None = None
    # each producer's RowTotals by name, one value per batch
    row_totals: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.priced["batch_id"].size)

    @cached_property
    def _grouped(self) -> tuple[Rows, np.ndarray] | None:
        if self.priced_rows is None or self.groups is None:
            return None
        rows, g = regroup(self.priced_rows, self.groups)
        return rows, g.starts

    @property
    def rows(self) -> Rows | None:
        """The priced rows grouped by batch (None when the context carries none)."""
        return None if self._grouped is None else self._grouped[0]

    @property
    def starts(self) -> np.ndarray | None:
        """Where each batch starts in :attr:`rows`."""
        return None if self._grouped is None else self._grouped[1]


ROW_TOTAL_KINDS = ("sum", "max")


@dataclass(frozen=True)
class RowTotal:
    """A per-batch total a producer reads as ``ctx.row_totals[name]``: the ``kind`` ("sum":
    exact int64, or "max") over the batch's requests of ``per_row(pool, scheduled,
    computed)`` (int64 arrays in, one int64 value per row out)."""

    name: str
    kind: str
    per_row: Callable[[ResolvedPool, np.ndarray, np.ndarray], np.ndarray]

    def __post_init__(self) -> None:
        if self.kind not in ROW_TOTAL_KINDS:
            raise ValueError(f"RowTotal {self.name!r}: kind must be one of {ROW_TOTAL_KINDS}, "
                             f"not {self.kind!r}")


# Row totals more than one producer reads: one definition, computed once per run.
LONGEST_CONTEXT = RowTotal("longest_context", "max", lambda r, s, c: s + c)
KV_BLOCKS_HELD = RowTotal("kv_blocks_held", "sum",
                          lambda r, s, c: limits.blocks_held(s + c, limits.block_tokens(r)))


@dataclass(frozen=True)
class ColumnProducer:
    """Adds the columns ``fields`` to the priced table (see the module docstring)."""

    name: str
    fields: tuple[pa.Field, ...]
    produce: Callable[[BatchContext], Mapping[str, Any]]
    inputs: tuple[str, ...] = ()
    totals: tuple[RowTotal, ...] = ()  # per-batch totals of per-row values it reads
    # False: ``produce`` reads no row (only ctx.row_totals and per-batch values), so the
    # engine may price a trace without keeping its rows by batch.
    needs_rows: bool = True
    # Optional row check on the ``inputs`` (one array each, per request row): a detail per
    # row, "" where the row is good. A bad row is rejected with ``reason`` (its batch goes
    # with it, as for any rejected row), so rows in = priced + rejected still holds.
    check: Callable[[Mapping[str, pa.Array]], np.ndarray] | None = None
    reason: str = "bad_input"


def with_measured(producers: Iterable[ColumnProducer] | None, measured: str | None,
                  measured_unit: str = "ns") -> list[ColumnProducer]:
    """``producers`` plus the measured-column producer (:mod:`kernel.bulk.calibrated`)
    when ``measured`` names a trace column."""
    out = list(producers or ())
    if measured is not None:
        from .calibrated import measured_producer  # (calibrated.py builds on this module)

        out.append(measured_producer(measured, measured_unit))
    return out


def check_rows(spec: OutputSpec, rows: Rows, rejects: list[pa.Table], strict: bool) -> None:
    """Run the producers' row checks on coerced rows: mark failing rows bad, record why."""

    for p in spec.producers:
        if p.check is None or len(rows) == 0:
            continue
        extra = rows.extra or {}
        detail = np.asarray(p.check({n: extra[n] for n in p.inputs}), dtype=object)
        idx = np.flatnonzero((detail != "") & ~rows.bad)
        if idx.size == 0:
            continue
        col = p.inputs[0] if p.inputs else ""
        shown = extra[col].take(pa.array(idx)).to_pylist() if col else [None] * idx.size
        record_rejects(reject_table(
            rows.row[idx], rows.batch_id[idx], p.reason, col, [str(d) for d in detail[idx]],
            [f"batch_id={b}, {col}={v!r}" for b, v in
             zip(rows.batch_id[idx].tolist(), shown, strict=True)]), rejects, strict)
        rows.bad[idx] = True


@dataclass(frozen=True)
class OutputSpec:
    """The priced table of one run: base columns, producers' columns, kept trace columns."""

    producers: tuple[ColumnProducer, ...] = ()
    keep: tuple[str, ...] = ()
    keep_fields: tuple[pa.Field, ...] = field(default=())  # known once the trace is open

    @staticmethod
    def make(producers: Iterable[ColumnProducer] | None = None,
             keep: Iterable[str] | None = None) -> OutputSpec:
        ps = tuple(producers or ())
        spec = OutputSpec(ps, tuple(keep or ()))
        seen = set(PRICED_SCHEMA.names)
        for name, where in ([(f.name, f"column producer {p.name!r}") for p in ps
                             for f in p.fields] + [(k, "keep=") for k in spec.keep]):
            if name in seen:
                raise TraceError(f"{where} adds a column {name!r} the priced table already has")
            seen.add(name)
        totals: dict[str, RowTotal] = {}
        for p in ps:
            for rt in p.totals:
                if totals.setdefault(rt.name, rt) is not rt:
                    raise TraceError(f"column producer {p.name!r} names a row total "
                                     f"{rt.name!r} another producer defines differently")
        return spec

    @property
    def row_totals(self) -> tuple[RowTotal, ...]:
        """Every producer's row totals (each name once)."""
        return tuple({rt.name: rt for p in self.producers for rt in p.totals}.values())

    @property
    def needs_rows(self) -> bool:
        """Whether the output needs the rows of each batch (a kept or input trace column, or
        a producer that reads rows), rather than per-batch sums of them."""
        return bool(self.keep or self.inputs) or any(p.needs_rows for p in self.producers)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Trace columns to carry along with the rows (kept or read by a producer)."""
        out = list(self.keep)
        for p in self.producers:
            out += [c for c in p.inputs if c not in out]
        return tuple(out)

    def with_keep_types(self, types: Mapping[str, pa.DataType]) -> OutputSpec:
        return OutputSpec(self.producers, self.keep,
                          tuple(pa.field(k, types[k]) for k in self.keep))

    def schema(self) -> pa.Schema:
        fields = list(PRICED_SCHEMA)
        for p in self.producers:
            fields += p.fields
        return pa.schema(fields + list(self.keep_fields))


def price_grouped(r: ResolvedPool, rows: Rows, g: Groups, decode_threshold: int = 1,
                  sm_budget: int = 0, spec: OutputSpec | None = None) -> pa.Table:
    """Price validated rows of whole batches (``g``: grouped or in any order, request order
    within each batch): one row per batch, in ``g``'s batch order.

    The arguments apply where ``rows`` has no per-batch column."""
    spec = spec or OutputSpec()
    if g.n == 0:
        return spec.schema().empty_table()
    thr: np.ndarray | int = (rows.decode_threshold[g.starts]
                             if rows.decode_threshold is not None else int(decode_threshold))
    sm = (rows.sm_budget[g.starts] if rows.sm_budget is not None
          else np.full(g.n, int(sm_budget), np.int64))
    summary = summarise_columns(r, g, rows.scheduled, rows.computed, thr, sm)
    row_totals: dict[str, np.ndarray] = {}
    if spec.row_totals:
        s = rows.scheduled.astype(np.int64, copy=False)
        c = rows.computed.astype(np.int64, copy=False)
        for rt in spec.row_totals:
            v = rt.per_row(r, s, c)
            row_totals[rt.name] = g.sum(v) if rt.kind == "sum" else g.max(v)
    extra = rows.extra or {}
    inputs = {n: extra[n].take(pa.array(g.starts)) for n in spec.inputs}
    return priced_table(r, g.ids, summary, spec, row_totals, inputs, rows, g)


def priced_table(r: ResolvedPool, ids: np.ndarray, summary: step.BatchSummary,
                 spec: OutputSpec, row_totals: Mapping[str, np.ndarray],
                 inputs: Mapping[str, pa.Array] | None = None, rows: Rows | None = None,
                 g: Groups | None = None) -> pa.Table:
    """The priced table of batches ``ids`` from their walk summary: compose, finish, the
    producers' columns and the kept columns (``inputs``: trace columns, one value per
    batch; ``rows``/``g``: the rows, for producers that read them)."""
    schema = spec.schema()
    totals = step.compose(r, summary)
    out = finish_columns(totals)
    code = out.pop("bottleneck")
    cols: dict[str, Any] = {"batch_id": ids, "overlap_ns": out["overlap_ns"],
                            "no_overlap_ns": out["no_overlap_ns"]}
    for n in RESOURCE_NAMES:
        cols[f"{n}_ns"] = out[f"{n}_ns"]
    cols["tokens"] = summary.tokens_all
    cols["requests"] = summary.n_requests.astype(np.int64)
    cols["prefill_requests"] = summary.prefill_requests
    cols["decode_requests"] = summary.decode_requests
    arrays: dict[str, Any] = dict(cols)
    arrays["bottleneck"] = pa.DictionaryArray.from_arrays(
        pa.array(code.astype(np.uint8), pa.uint8()), _BOTTLENECK_VALUES, ordered=True)
    inputs = inputs or {}
    if spec.producers:
        ctx = BatchContext(r, summary, totals, cols, inputs, rows, g, row_totals)
        for p in spec.producers:
            got = p.produce(ctx)
            for f in p.fields:
                if f.name not in got:
                    raise TypeError(f"column producer {p.name!r} did not return {f.name!r}")
                arrays[f.name] = _column(got[f.name], f, ids.size, p.name)
    for f in spec.keep_fields:
        arrays[f.name] = inputs[f.name]
    return pa.table([arrays[f.name] for f in schema], schema=schema)


def _column(v: Any, f: pa.Field, n: int, who: str) -> pa.Array:
    arr = v if isinstance(v, pa.Array | pa.ChunkedArray) else pa.array(v, f.type)
    if len(arr) != n:
        raise ValueError(f"column producer {who!r} returned {len(arr)} values for {f.name!r}, "
                         f"one per batch expected ({n})")
    return arr if arr.type == f.type else arr.cast(f.type)
