"""In-memory pricing: :func:`price` and :func:`price_result`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from ..trace import REJECT_SCHEMA, Rows
from .batch_table import BatchTable
from .columns import ColumnProducer
from .engine import Engine, PricedResult, open_priced_trace, resolved

if TYPE_CHECKING:
    from ..kernel import Kernel
    from ..resolved import ResolvedPool

__all__ = ["price", "price_result"]


def price_result(k: Kernel | ResolvedPool, trace: Any, *, decode_threshold: int = 1,
                 sm_budget: int = 0, columns: Mapping[str, str] | None = None,
                 batches: Any = None, strict: bool = False,
                 keep: Iterable[str] | None = None,
                 producers: Iterable[ColumnProducer] | None = None) -> PricedResult:
    """Price an in-memory trace (or a file, read whole): priced rows, rejects and counts.

    Batches come out in order of their first row. ``batches`` is an optional per-batch table
    (``batch_id`` + ``decode_threshold`` and/or ``sm_budget``). ``keep`` passes trace columns
    through (each batch takes its first row's value); ``producers`` add computed columns
    (:mod:`kernel.bulk.columns`).
    """
    t0 = time.perf_counter()
    src, spec = open_priced_trace(trace, columns=columns, chunk_rows=1 << 62,
                                  producers=producers, keep=keep)
    priced: list[pa.Table] = []
    rejects: list[pa.Table] = []
    bt_rej: list[pa.Table] = []
    bt = (BatchTable(batches, columns, bt_rej, strict, decode_threshold, sm_budget)
          if batches is not None else None)
    eng = Engine(resolved(k), src.names, decode_threshold=decode_threshold,
                 sm_budget=sm_budget, strict=strict, batch_table=bt,
                 on_priced=priced.append, on_rejects=rejects.append, spec=spec)
    eng.emit_rejects(bt_rej)
    parts = [eng.coerce(raw, 0) for raw in src.chunks()]
    eng.price(Rows.concat(parts) if parts else Rows.empty())
    eng.finish()
    counts = eng.counts
    counts.seconds = time.perf_counter() - t0
    counts.check()
    table = pa.concat_tables(priced) if priced else spec.schema().empty_table()
    rtable = pa.concat_tables(rejects) if rejects else REJECT_SCHEMA.empty_table()
    rframe = pl.from_arrow(rtable)
    assert isinstance(rframe, pl.DataFrame)
    rframe = rframe.sort("source", "row", descending=[True, False])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return PricedResult(frame, rframe, counts)


def price(k: Kernel | ResolvedPool, trace: Any, *, decode_threshold: int = 1,
          sm_budget: int = 0, columns: Mapping[str, str] | None = None, batches: Any = None,
          strict: bool = False, keep: Iterable[str] | None = None,
          producers: Iterable[ColumnProducer] | None = None) -> pl.DataFrame:
    """One row per batch: batch_id, overlap_ns, no_overlap_ns, bottleneck, <resource>_ns,
    tokens, requests, prefill_requests, decode_requests — equal to ``k.step_time`` per batch
    — then any producers' and kept columns.

    Bad rows are set aside (see :func:`price_result` to get them); ``strict`` raises instead.
    """
    return price_result(k, trace, decode_threshold=decode_threshold, sm_budget=sm_budget,
                        columns=columns, batches=batches, strict=strict, keep=keep,
                        producers=producers).priced
