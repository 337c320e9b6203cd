"""One in-memory trace priced under several kernels, its rows validated and grouped once.

A sweep prices each partition under many scenarios. Nothing of validating the rows, grouping
them by batch or checking whole batches depends on the kernel, and on a partition of a
synthetic trace that work is about a third of a ``price_file`` run's CPU: :func:`price_table_many`
does it once, then every kernel prices the prepared rows. Each kernel's files hold exactly what
:func:`kernel.bulk.price_file` writes for it — the same priced rows in the same order, the same
rejects (in an order that, as between two ``price_file`` runs, follows how far validation ran
ahead of pricing), counts and stamps (``tests/test_price_many.py``).

Only a trace whose batches are contiguous (``grouped`` mode, ``docs/traces.md``) is shared
this way; any other is priced by :func:`price_file` once per kernel, as are kernels whose output
checks rows differently.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ..io.trace import REJECT_SCHEMA, Rows
from .columns import OutputSpec
from .engine import Coerced, Engine, PriceCounts, open_priced_trace, resolved
from .options import CHUNK_ROWS, Tuning
from .over_limit import default_producers
from .sink import Sink
from .stream import _grouped_units, _workers, abort_files, close_files, price_file

if TYPE_CHECKING:
    from ..model.pricer import Pricer

__all__ = ["Output", "price_table_many"]

@dataclass(frozen=True)
class Output:
    """One kernel's share of the run: where its priced rows and rejects go, with metadata."""

    kernel: Pricer
    dst: Path
    rejects: Path | None = None
    metadata: Mapping[str, str | bytes] | None = None
    rejects_metadata: Mapping[str, str | bytes] | None = None


class _FanOut:
    """Validation done once, its rows counted and its rejects written for every kernel."""

    def __init__(self, engines: Sequence[Engine]):
        self.engines = engines

    def coerce_task(self, raw: pa.Table, offset: int) -> Coerced:
        return self.engines[0].coerce_task(raw, offset)

    def take_coerced(self, c: Coerced) -> Rows:
        for eng in self.engines:
            rows = eng.take_coerced(c)
        return rows


def _row_checks(spec: OutputSpec) -> tuple[object, ...]:
    return spec.inputs, tuple(p.check for p in spec.producers if p.check is not None)


def price_table_many(outputs: Sequence[Output], table: pa.Table, *, decode_threshold: int = 1,
                     columns: Mapping[str, str] | None = None, workers: int | None = None,
                     identity: bool = True) -> list[PriceCounts]:
    """Price ``table`` under each output's kernel into its files, as
    ``price_file(o.kernel, table, o.dst, rejects=o.rejects, metadata=o.metadata,
    rejects_metadata=o.rejects_metadata, decode_threshold=…, columns=…, workers=…,
    progress=False)`` would for each ``o`` in turn; the counts, in order."""
    if not outputs:
        return []
    t0 = time.perf_counter()
    ts, first = open_priced_trace(table, columns=columns, chunk_rows=CHUNK_ROWS,
                                  producers=default_producers(outputs[0].kernel, None, identity),
                                  keep=None)
    specs = [first, *(OutputSpec.make(default_producers(o.kernel, None, identity))
                      for o in outputs[1:])]
    if ts.layout != "batches" or len({_row_checks(s) for s in specs}) > 1:
        return [price_file(o.kernel, table, o.dst, rejects=o.rejects, metadata=o.metadata,
                           rejects_metadata=o.rejects_metadata, progress=False,
                           decode_threshold=decode_threshold, columns=columns,
                           tuning=Tuning(workers=workers), identity=identity)
                for o in outputs]
    sinks: list[tuple[Sink, Sink | None]] = []
    engines: list[Engine] = []
    pool = ThreadPoolExecutor(_workers(workers), thread_name_prefix="blis-price")
    try:
        for o, spec in zip(outputs, specs, strict=True):
            rej = (Sink(Path(o.rejects), REJECT_SCHEMA, metadata=o.rejects_metadata)
                   if o.rejects is not None else None)
            out = Sink(Path(o.dst), spec.schema(), metadata=o.metadata,
                       sorted_by=("batch_id",) if ts.sorted_ids else ())
            sinks.append((out, rej))
            engines.append(Engine(resolved(o.kernel), ts.names, decode_threshold=decode_threshold,
                                  sm_budget=0, strict=False, batch_table=None,
                                  on_priced=out.write,
                                  on_rejects=rej.write if rej is not None else lambda t: None,
                                  spec=spec))
        for rows in _grouped_units(_FanOut(engines), ts, pool):
            prepared = engines[0].prepare_task(rows)
            priced = [pool.submit(e.price_prepared, prepared, ts.sorted_ids) for e in engines]
            for eng, p in zip(engines, priced, strict=True):
                eng.take_priced(p.result())
        for eng, (out, rej) in zip(engines, sinks, strict=True):
            eng.counts.mode = "grouped"
            close_files(eng.counts, out, rej)
    except BaseException:
        abort_files(*(sink for pair in sinks for sink in pair))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    seconds = time.perf_counter() - t0
    for eng in engines:
        eng.counts.seconds = seconds
        eng.counts.check()
    return [eng.counts for eng in engines]
