"""The pricing engine shared by every entry point: validate, group, check, price, count.

An :class:`Engine` takes raw chunks (:meth:`Engine.coerce`) and groups of rows that hold every
row of each batch they touch (:meth:`Engine.price`); it hands priced tables and rejects to
callbacks, so the same engine serves in-memory pricing and streaming to files, and keeps the
counts (``rows in = rows priced + rows rejected``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..io.sources import TraceSource, open_trace
from ..io.trace import BATCH_COLUMNS, Rows, TraceError, coerce
from ..model.resolved import ResolvedPool
from .batch_table import BatchTable
from .columns import OutputSpec, check_rows, price_grouped
from .groups import (
    Groups,
    batch_checks,
    group,
    groups_from_starts,
    groups_in_range,
    groups_of_grouped,
    runs,
    sums_fit,
)
from .over_limit import reject_over_limit
from .partition import group_piece
from .summary import priced_html

if TYPE_CHECKING:
    from ..model.limits import Limits
    from ..model.pricer import Pricer
    from ..model.resolved import ResolvedPool

# Request rows priced at once: bounds the walk's temporaries while keeping the per-batch
# work on arrays long enough that numpy, not Python (which holds the GIL), dominates. On 2
# cores 1 M rather than 256 k: CPU/wall 1.68 vs 1.59, a shuffled trace ~9% faster, peak RSS
# of a sorted 1 M-batch run 0.61 vs 0.55 GiB.
PRICE_ROWS = 1 << 20

__all__ = ["PRICE_ROWS", "Engine", "PriceCounts", "PricedResult", "piece_bounds", "resolved",
           "rows_of"]


def piece_bounds(starts: np.ndarray, n_rows: int) -> list[int]:
    """Batches cut into pieces of about :data:`PRICE_ROWS` rows: ``starts`` holds the rows
    before each batch (increasing), ``n_rows`` all the rows; piece ``i`` is batches
    ``bounds[i]`` up to ``bounds[i + 1]``."""
    n = int(starts.size)
    cut = np.unique(np.searchsorted(starts, np.arange(PRICE_ROWS, n_rows, PRICE_ROWS)))
    return [0, *(int(b) for b in cut if 0 < b < n), n]


@dataclass
class PriceCounts:
    """What a pricing run saw: ``rows_in == rows_priced + rows_rejected`` (request rows)."""

    rows_in: int = 0
    rows_priced: int = 0
    rows_rejected: int = 0
    batches_priced: int = 0
    batch_table_rows_rejected: int = 0  # rows of the per-batch table set aside
    batches_over_limit: int = 0  # priced batches over a deployment limit (kernel.model.limits)
    mode: str = "in-memory"  # grouped | summed | sorted | window | spill | external once run (docs/traces.md)
    seconds: float = 0.0

    def check(self) -> None:
        if self.rows_in != self.rows_priced + self.rows_rejected:
            raise AssertionError(f"rows in {self.rows_in} != priced {self.rows_priced} + "
                                 f"rejected {self.rows_rejected}")

    @property
    def steps_per_second(self) -> float:
        return self.batches_priced / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PricedResult:
    """The priced batches, the rejected rows and the counts of one in-memory run."""

    priced: pl.DataFrame
    rejects: pl.DataFrame
    counts: PriceCounts = field(default_factory=PriceCounts)

    def _repr_html_(self) -> str:
        c = self.counts
        return priced_html(self.priced, title="priced trace", extra=[
            ("rows", f"in {c.rows_in:,} = priced {c.rows_priced:,} + rejected "
                     f"{c.rows_rejected:,}"),
            ("rejects", f"{self.rejects.height:,} row(s) in .rejects")])


@dataclass
class Coerced:
    rows: Rows
    rejects: list[pa.Table]
    n_raw: int


class Validating(Protocol):
    """What grouping a stream of chunks needs: validate a chunk (on a worker), then take it."""

    def coerce_task(self, raw: pa.Table, offset: int) -> Coerced: ...

    def take_coerced(self, c: Coerced) -> Rows: ...


@dataclass
class Prepared:
    """Rows ready for any kernel to price: grouped by batch, whole batches checked."""

    rows: Rows
    groups: Groups
    rejects: list[pa.Table]


@dataclass
class Priced:
    table: pa.Table | None
    rejects: list[pa.Table]
    rows: int
    batches: int



def schedules_tokens(scheduled: np.ndarray, g: Groups) -> bool:
    """Every batch of ``g`` schedules a token (else the grouped path rejects the ones that do
    not: :func:`kernel.bulk.groups.batch_checks`, RL8)."""
    if scheduled.all():
        return True
    return bool(np.bincount(g.inv, weights=scheduled != 0, minlength=g.n).all())

class Engine:
    def __init__(self, r: ResolvedPool, names: Mapping[str, str], *, decode_threshold: int,
                 sm_budget: int, strict: bool, batch_table: BatchTable | None,
                 on_priced: Callable[[pa.Table], None],
                 on_rejects: Callable[[pa.Table], None], spec: OutputSpec | None = None,
                 over_limit: Limits | None = None):
        self.r = r
        self.over_limit = over_limit  # reject batches over these limits (else flag them)
        self.defaults = {"decode_threshold": int(decode_threshold), "sm_budget": int(sm_budget)}
        self.strict = strict
        self.inline = tuple(c for c in BATCH_COLUMNS if c in names)
        if batch_table is not None:
            both = set(self.inline) & set(batch_table.present)
            if both:
                raise TraceError(f"per-batch column(s) {sorted(both)} given both in the trace "
                                 "and in the per-batch table")
        self.bt = batch_table
        self.on_priced = on_priced
        self.on_rejects = on_rejects
        self.counts = PriceCounts()
        self.spec = spec or OutputSpec()

    def emit_rejects(self, parts: list[pa.Table]) -> None:
        for t in parts:
            if t.num_rows:
                if (t.column("source").to_pylist()[0] == "batches"):
                    self.counts.batch_table_rows_rejected += t.num_rows
                else:
                    self.counts.rows_rejected += t.num_rows
                self.on_rejects(t)

    # Tasks run on worker threads and touch no shared state but the per-batch table's
    # "seen" marks (idempotent); the take_* methods run on the calling thread, in order.
    def coerce_task(self, raw: pa.Table, offset: int) -> Coerced:
        rej: list[pa.Table] = []
        rows = coerce(raw, offset, rejects=rej, strict=self.strict)
        if self.bt is not None:
            self.bt.apply(rows, rej, self.strict)
        check_rows(self.spec, rows, rej, self.strict)
        return Coerced(rows, rej, raw.num_rows)

    def take_coerced(self, c: Coerced) -> Rows:
        self.counts.rows_in += c.n_raw
        self.emit_rejects(c.rejects)
        return c.rows

    def price_task(self, rows: Rows, starts: np.ndarray | None = None,
                   sort_output: bool = False) -> Priced:
        """Price rows holding every row of each batch they touch (``starts``: the first row
        of each batch when the rows are already grouped); ``sort_output`` orders the priced
        rows by batch id."""
        return self.price_prepared(self.prepare_task(rows, starts), sort_output)

    def prepare_task(self, rows: Rows, starts: np.ndarray | None = None) -> Prepared:
        """The part of :meth:`price_task` no kernel enters: rows grouped by batch, whole
        batches checked."""
        if len(rows) == 0:
            return Prepared(rows, groups_of_grouped(rows.batch_id), [])
        rows.widened()
        if starts is None:
            rows, g = group(rows)
        else:
            g = groups_from_starts(rows.batch_id, starts)
        return self.checked(rows, g)

    def checked(self, rows: Rows, g: Groups) -> Prepared:
        """Grouped rows (int64 columns) and their batches, whole batches checked."""
        rej: list[pa.Table] = []
        rows, g = batch_checks(rows, g, self.inline, rej, self.strict)
        return Prepared(rows, g, rej)

    def price_groups_task(self, rows: Rows, g: Groups) -> Priced:
        """:meth:`price_task` of rows already grouped, with int64 columns, and their
        batches (``g``, grouped, batch ids increasing): a spill piece gathered grouped
        (:mod:`kernel.bulk.joined`)."""
        return self.price_prepared(self.checked(rows, g))

    def price_prepared(self, prepared: Prepared, sort_output: bool = False) -> Priced:
        """The rest of :meth:`price_task`: this engine's kernel prices the prepared rows."""
        rows, g, rej = prepared.rows, prepared.groups, list(prepared.rejects)
        if g.n == 0:
            return Priced(None, rej, 0, 0)
        out = self._price_pieces(rows, g)
        if self.over_limit is not None:
            out, rows, g, over = reject_over_limit(self.over_limit, out, rows, g, self.strict)
            rej += over
            if g.n == 0:
                return Priced(None, rej, 0, 0)
        if sort_output and g.n > 1 and not bool(np.all(g.ids[1:] > g.ids[:-1])):
            out = out.take(pa.array(np.argsort(g.ids, kind="stable")))
        return Priced(out, rej, len(rows), g.n)

    def price_range_task(self, rows: Rows, lo: int, span: int) -> Priced:
        """Price rows, in input order, holding every row of the batches with ids in
        ``[lo, lo + span)``: in place when nothing needs them contiguous (no rejected row,
        no per-batch column in the trace, no over-limit rejection, sums that surely fit
        int64, a piece of ordinary size), else grouped first. Batches come out in id order."""
        if self._in_place(rows, span):
            g = groups_in_range(rows.batch_id, lo, span)
            if sums_fit(rows.scheduled, rows.computed, int(g.counts.max())) \
                    and schedules_tokens(rows.scheduled, g):
                out = price_grouped(self.r, rows, g, **self.defaults, spec=self.spec)
                return Priced(out, [], len(rows), g.n)
        rows = group_piece(rows, lo, span)
        return self.price_task(rows, runs(rows.batch_id))

    def _in_place(self, rows: Rows, span: int) -> bool:  # (and schedules_tokens, sums_fit)
        return (0 < len(rows) <= PRICE_ROWS * 3 // 2 and span <= max(1 << 16, 4 * len(rows))
                and self.over_limit is None and rows.decode_threshold is None
                and rows.sm_budget is None and not rows.bad.any())

    def _price_pieces(self, rows: Rows, g: Groups) -> pa.Table:
        """price_grouped in pieces of about PRICE_ROWS rows (whole batches), so the walk's
        temporaries stay small whatever the chunk size."""
        n = len(rows)
        if n <= PRICE_ROWS * 3 // 2:
            return price_grouped(self.r, rows, g, **self.defaults, spec=self.spec)
        bounds = piece_bounds(g.starts, n)
        pieces = []
        for b0, b1 in zip(bounds[:-1], bounds[1:], strict=True):
            r0 = int(g.starts[b0])
            r1 = int(g.starts[b1]) if b1 < g.n else n
            sub = rows.slice(r0, r1)
            pieces.append(price_grouped(self.r, sub,
                                        groups_from_starts(sub.batch_id, g.starts[b0:b1] - r0),
                                        **self.defaults, spec=self.spec))
        return pa.concat_tables(pieces)

    def take_priced(self, p: Priced) -> None:
        self.emit_rejects(p.rejects)
        if p.table is not None:
            self.counts.rows_priced += p.rows
            self.counts.batches_priced += p.batches
            if "limits" in p.table.column_names:
                flagged = pc.sum(pc.not_equal(p.table.column("limits"), "")).as_py()
                self.counts.batches_over_limit += int(flagged or 0)
            self.on_priced(p.table)

    def coerce(self, raw: pa.Table, offset: int) -> Rows:
        return self.take_coerced(self.coerce_task(raw, offset))

    def price(self, rows: Rows, starts: np.ndarray | None = None) -> None:
        self.take_priced(self.price_task(rows, starts))

    def finish(self) -> None:
        if self.bt is not None:
            rej: list[pa.Table] = []
            self.bt.unknown(rej, self.strict)
            self.emit_rejects(rej)


def rows_of(trace: Any) -> Rows:
    """A whole in-memory trace as coerced rows (bad rows marked, rejects dropped)."""
    src = open_trace(trace, chunk_rows=1 << 62)
    parts = [coerce(t, 0) for t in src.chunks()]
    return (Rows.concat(parts) if parts else Rows.empty()).widened()


def resolved(k: Pricer | ResolvedPool) -> ResolvedPool:

    return k if isinstance(k, ResolvedPool) else k.resolved_pool


def open_priced_trace(trace: Any, *, columns: Mapping[str, str] | None, chunk_rows: int,
                      producers: Any = None, keep: Any = None
                      ) -> tuple[TraceSource, OutputSpec]:
    """Open ``trace`` carrying the columns the output needs; the run's output spec."""
    spec = OutputSpec.make(producers, keep)
    ts = open_trace(trace, columns=columns, chunk_rows=chunk_rows, extra=spec.inputs)
    types = {k: ts.schema.field(k).type for k in spec.keep} if ts.schema is not None else {}
    return ts, spec.with_keep_types(types)
