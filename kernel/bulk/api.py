"""In-memory pricing: :func:`price` and :func:`price_result`.

The trace streams through the same pipeline as :func:`kernel.bulk.price_file` (workers,
bounded memory, any source), only the priced rows are kept in memory: batches that are
contiguous in the source are priced in trace order; anything else is grouped in memory by
batch id range (:mod:`kernel.bulk.partition`), or sorted by DuckDB when it does not fit
``memory_budget``: batch_id order.

Rejected rows are never dropped silently: ``on_reject="warn"`` (the default) warns with
their count, ``"raise"`` raises :class:`kernel.io.trace.RejectedRowError` at the first one,
``"ignore"`` keeps quiet; :func:`price_result` returns them either way.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from ..io.trace import REJECT_SCHEMA
from .batch_table import BatchTable
from .columns import ColumnProducer, with_measured
from .engine import Engine, PricedResult, open_priced_trace, resolved
from .options import ON_REJECT, OnReject, Tuning, reject_mode
from .over_limit import default_producers, over_limit_of
from .stream import _workers, priced_stream

if TYPE_CHECKING:
    from ..io.protocols import TraceInput
    from ..model.pricer import Pricer
    from ..model.resolved import ResolvedPool

__all__ = ["ON_REJECT", "RejectedRowsWarning", "price", "price_result"]


class RejectedRowsWarning(UserWarning):
    """Some trace rows were set aside (``price_result(...).rejects`` has them)."""


def price_result(k: Pricer | ResolvedPool, trace: TraceInput, *, decode_threshold: int = 1,
                 sm_budget: int = 0, columns: Mapping[str, str] | None = None,
                 batches: Any = None, keep: Iterable[str] | None = None,
                 producers: Iterable[ColumnProducer] | None = None,
                 measured: str | None = None, measured_unit: str = "ns",
                 reject_over_limit: bool = False, identity: bool = True,
                 on_reject: OnReject = "warn", tuning: Tuning | None = None,
                 strict: bool | None = None) -> PricedResult:
    """Price a trace (any source :func:`kernel.io.sources.open_trace` takes): priced rows,
    rejects and counts, in memory.

    ``batches`` is an optional per-batch table (``batch_id`` + ``decode_threshold`` and/or
    ``sm_budget``). ``keep`` passes trace columns through (each batch takes its first row's
    value); ``producers`` add computed columns (:mod:`kernel.bulk.columns`); ``measured``
    names a trace column of measured step times in ``measured_unit`` (adds ``measured_ns`` and
    each estimate's relative error; bad values are rejects). A kernel's prices carry the
    ``limits`` column (:mod:`kernel.bulk.over_limit`); ``reject_over_limit`` sets those
    batches' rows aside instead. Every option: :mod:`kernel.bulk.options`; how the engine
    runs (order, memory, threads): :class:`~kernel.bulk.options.Tuning`.
    """
    on_reject = reject_mode(on_reject, strict, "price_result")
    strict_rows = on_reject == "raise"
    tune = tuning or Tuning()
    producers = with_measured(producers, measured, measured_unit)
    t0 = time.perf_counter()
    src, spec = open_priced_trace(trace, columns=columns, chunk_rows=tune.chunk_rows,
                                  producers=default_producers(k, producers, identity),
                                  keep=keep)
    priced: list[pa.Table] = []
    rejects: list[pa.Table] = []
    bt_rej: list[pa.Table] = []
    bt = (BatchTable(batches, columns, bt_rej, strict_rows, decode_threshold, sm_budget)
          if batches is not None else None)
    eng = Engine(resolved(k), src.names, decode_threshold=decode_threshold,
                 sm_budget=sm_budget, strict=strict_rows, batch_table=bt,
                 on_priced=priced.append, on_rejects=rejects.append, spec=spec,
                 over_limit=over_limit_of(k, reject_over_limit))
    eng.emit_rejects(bt_rej)
    n = _workers(tune.workers)
    with ThreadPoolExecutor(n, thread_name_prefix="blis-price") as pool:
        st = priced_stream(eng, src, pool, workers=n, chunk_rows=tune.chunk_rows,
                           tmp_parent=Path(tune.tmp_dir or tempfile.gettempdir()),
                           sort_memory=tune.sort_memory, memory_budget=tune.memory_budget,
                           order=tune.order)
        for p in st.results:
            eng.take_priced(p)
    eng.counts.mode = st.mode
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
    if on_reject == "warn" and (counts.rows_rejected or counts.batch_table_rows_rejected):
        warnings.warn(f"{counts.rows_rejected:,} of {counts.rows_in:,} trace rows rejected"
                      + (f" and {counts.batch_table_rows_rejected:,} per-batch table rows"
                         if counts.batch_table_rows_rejected else "")
                      + "; price_result(...).rejects has them with their reasons "
                      "(on_reject='ignore' silences this)", RejectedRowsWarning, stacklevel=3)
    return PricedResult(frame, rframe, counts)


def price(k: Pricer | ResolvedPool, trace: TraceInput, *, decode_threshold: int = 1,
          sm_budget: int = 0, columns: Mapping[str, str] | None = None, batches: Any = None,
          keep: Iterable[str] | None = None, producers: Iterable[ColumnProducer] | None = None,
          measured: str | None = None, measured_unit: str = "ns",
          reject_over_limit: bool = False, identity: bool = True,
          on_reject: OnReject = "warn", tuning: Tuning | None = None,
          strict: bool | None = None) -> pl.DataFrame:
    """One row per batch: batch_id, overlap_ns, no_overlap_ns, bottleneck, <resource>_ns,
    tokens, requests, prefill_requests, decode_requests — equal to ``k.step_time`` per batch
    — then any producers' columns, ``scenario`` and ``pool`` (unless ``identity`` is false;
    :mod:`kernel.bulk.identity`) and the kept columns.

    Bad rows are set aside with a warning (``on_reject``; :func:`price_result` returns them).
    """
    mode = reject_mode(on_reject, strict, "price")
    return price_result(k, trace, decode_threshold=decode_threshold, sm_budget=sm_budget,
                        columns=columns, batches=batches, keep=keep, producers=producers,
                        measured=measured, measured_unit=measured_unit,
                        reject_over_limit=reject_over_limit, identity=identity,
                        on_reject=mode, tuning=tuning).priced
