"""The immutable :class:`Kernel`: one resolved pool and the methods that price it.

Construction lives in :mod:`kernel.pool.build`; the cost laws in :mod:`kernel.model.laws`; the
per-call arithmetic in :mod:`kernel.model.step`, :mod:`kernel.model.memory`, :mod:`kernel.model.transfer` and
:mod:`kernel.model.host`. Every method is a pure function of its arguments and the resolved pool,
so a kernel is safe to share between threads.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io.calibration_document import as_calibration, bind
from ..model import host, memory, step, step_arrays, transfer, utilisation
from ..model import limits as _limits
from ..model.calibration_law import TERMS, calibrated_ns
from ..model.resolved import ResolvedPool
from ..model.types import (
    Batch,
    CoefficientOrigin,
    Direction,
    MemoryBreakdown,
    Placement,
    Resolution,
    Resource,
    StepEstimate,
    refuse_empty,
)
from ..pool.calibrate import provenance_entries

if TYPE_CHECKING:
    import polars as pl

    from pipeline.documents import Pool

    from ..bulk.columns import ColumnProducer
    from ..bulk.engine import PricedResult
    from ..bulk.options import OnReject, Tuning
    from ..io.calibration_document import Calibration
    from ..io.protocols import TraceInput
    from ..model.transfer import PDTransferDemand
    from ..model.utilisation import Utilisation

_HOST = Resource.HOST  # (read per call: a module global costs less than the enum member)


class Kernel:
    """Prices one pool of one deployment. Build it with :func:`kernel.new` or :func:`kernel.open`."""

    def __init__(self, resolved: ResolvedPool, pool: Pool, resolution: Resolution,
                 documents: Mapping[str, Mapping[str, str]] | None = None,
                 calibration: Calibration | None = None):
        self._r = resolved
        self._pool = pool
        self._resolution = resolution
        self._documents = {k: dict(v) for k, v in (documents or {}).items()}
        self._cal = calibration

    # -- pricing a step ----------------------------------------------------------------
    def step_time(self, batch: Batch) -> StepEstimate:
        """One forward pass over ``batch``: Overlap, NoOverlap, bottleneck and breakdown
        (and ``calibrated`` when the kernel carries a calibration)."""
        if self._cal is None:  # the simulator's per-step call: one level less
            est = step.step_time_into(self._r, batch, {})
            if est.bottleneck is _HOST:  # (only a host-bound step can be empty)
                refuse_empty(batch)
            return est
        return self.step_time_into(batch, {})

    def step_time_arrays(self, scheduled: Any, computed: Any, prompt_len: Any = None, *,
                         decode_threshold: int = 1, sm_budget: int = 0,
                         per_resource: bool = True) -> StepEstimate:
        """:meth:`step_time` of one step given as per-request columns (numpy integer arrays,
        Arrow integer arrays or sequences of ints): ``step_time(Batch(zip(scheduled, computed,
        prompt_len), decode_threshold, sm_budget))`` bit for bit, without a Python object per
        request (:mod:`kernel.model.step_arrays`). ``per_resource=False`` leaves the map out."""
        if self._cal is None:
            est = step_arrays.price(self._r, scheduled, computed, prompt_len, decode_threshold,
                                    sm_budget, {} if per_resource else None)
            if est.bottleneck is _HOST:  # (only a host-bound step can be empty: RL8)
                values = scheduled.to_pylist() if hasattr(scheduled, "to_pylist") else scheduled
                refuse_empty(Batch([(int(x), 0) for x in values]))
            return est
        sl, cl, _seen = step_arrays.counts_of(scheduled, computed, prompt_len)
        thr, budget = step_arrays.threshold_and_budget(decode_threshold, sm_budget)
        return self.step_time_into(step_arrays.as_batch(sl, cl, thr, budget),
                                   {} if per_resource else None)

    def step_time_into(self, batch: Batch, per: dict[Resource, int] | None) -> StepEstimate:
        """:meth:`step_time`, clearing and filling the caller's ``per`` dict (None: no map)."""
        if self._cal is None:
            est = step.step_time_into(self._r, batch, per)
            if est.bottleneck is Resource.HOST:
                refuse_empty(batch)
            return est
        refuse_empty(batch)

        s = step.summarise(self._r, batch)
        mine: dict[Resource, int] = {} if per is None else per
        est = step.finish(step.compose(self._r, s), mine)
        terms = tuple(mine.get(Resource(t), 0) for t in TERMS)
        cal = calibrated_ns(self._cal.law, terms, int(s.prefill_requests),
                            int(s.decode_requests), est.overlap)
        return dataclasses.replace(est, per_resource=per, calibrated=cal)

    # -- calibration -------------------------------------------------------------------
    @property
    def calibration(self) -> Calibration | None:
        """The calibration this kernel applies (None: the reference's two estimates only)."""
        return self._cal

    def with_calibration(self, calibration: Any, force: bool = False,
                         engine: str | None = None) -> Kernel:
        """This kernel with a calibration (a :class:`Calibration`, a path or a document);
        one made for another model, chip, rules pack, parallel layout or (``engine``,
        ``NAME[:VERSION]``, the engine this kernel stands for) engine is refused unless
        ``force``, which records the differences in provenance (docs/calibration.md)."""

        cal = bind(as_calibration(calibration), self, force, engine)
        return Kernel(self._r, self._pool, self._resolution, self._documents, cal)

    def utilisation(self, batch: Batch) -> Utilisation:
        """Per-rank FLOPs, HBM and network bytes of one step as its terms count them, and
        MFU/MBU against the chip's catalog peaks over its NoOverlap time."""
        refuse_empty(batch)
        est = step.step_time_into(self._r, batch, None)
        return utilisation.step_utilisation(self._r, batch, est.no_overlap)

    # -- deployment limits ---------------------------------------------------------------
    @cached_property
    def limits(self) -> _limits.Limits:
        """What this pool can schedule in one step (:mod:`kernel.model.limits`)."""
        return _limits.Limits.of(self)

    def check(self, batch: Batch) -> list[_limits.Breach]:
        """Every deployment limit ``batch`` breaks (empty when the deployment could run it):
        max_num_seqs, max_num_batched_tokens, max_model_len, kv_capacity, duration. The price
        of such a step is still the reference's; this only says it is impossible."""
        return _limits.check(self.limits, batch, self.step_time_into(batch, None).no_overlap)

    # -- memory ----------------------------------------------------------------------
    @cached_property
    def _fixed(self) -> MemoryBreakdown:
        return memory.fixed_bytes(self._r)

    def fixed_bytes(self) -> MemoryBreakdown:
        """Per-rank bytes inside the gpu_memory_utilization budget before any request."""
        return self._fixed

    def pre_snapshot_bytes(self) -> int:
        """Communicator reservation + engine workspace, held before vLLM's memory snapshot."""
        return memory.pre_snapshot_bytes(self._r)

    def sequence_variable_bytes(self, tokens: int) -> int:
        return memory.sequence_variable_bytes(self._r, tokens)

    def sequence_fixed_bytes(self) -> int:
        return memory.sequence_fixed_bytes(self._r)

    def sequence_admission_bytes(self) -> int:
        return memory.sequence_admission_bytes(self._r)

    def sequence_bounded_bytes(self, in_flight: int) -> int:
        return memory.sequence_bounded_bytes(self._r, in_flight)

    def sequence_bounded_bytes_at(self, computed: int, in_flight: int) -> int:
        return memory.sequence_bounded_bytes_at(self._r, computed, in_flight)

    def kv_capacity(self) -> memory.KVCapacity:
        """KV blocks in the budget and max concurrent requests at max_model_len (vLLM's report)."""
        return memory.kv_capacity(self._r, self._fixed,
                                  self._pool.engine.gpu_memory_utilization or None)

    # -- whole traces -------------------------------------------------------------------
    def price(self, trace: TraceInput, *, decode_threshold: int = 1, sm_budget: int = 0,
              columns: Mapping[str, str] | None = None, batches: Any = None,
              keep: Iterable[str] | None = None,
              producers: Iterable[ColumnProducer] | None = None,
              measured: str | None = None, measured_unit: str = "ns",
              reject_over_limit: bool = False, identity: bool = True,
              on_reject: OnReject = "warn", tuning: Tuning | None = None,
              strict: bool | None = None, trace_format: str = "requests") -> pl.DataFrame:
        """Price every batch of a trace as columns; see :func:`kernel.bulk.price` (every
        option: :mod:`kernel.bulk.options`).

        A calibrated kernel adds ``calibrated_ns``; ``measured`` (a trace column, in
        ``measured_unit``) adds ``measured_ns`` and each estimate's relative error, and sends
        rows with a bad measured value to the rejects (:mod:`kernel.bulk.calibrated`).
        ``trace_format="fpm"`` reads one row per forward pass with aggregates
        (:mod:`kernel.io.fpm`; its other columns are kept; impossible passes are left out)."""
        return self.price_result(
            trace, decode_threshold=decode_threshold, sm_budget=sm_budget, columns=columns,
            batches=batches, keep=keep, producers=producers, measured=measured,
            measured_unit=measured_unit, reject_over_limit=reject_over_limit,
            identity=identity, on_reject=on_reject, tuning=tuning, strict=strict,
            trace_format=trace_format).priced

    def price_result(self, trace: TraceInput, *, decode_threshold: int = 1,
                     sm_budget: int = 0, columns: Mapping[str, str] | None = None,
                     batches: Any = None, keep: Iterable[str] | None = None,
                     producers: Iterable[ColumnProducer] | None = None,
                     measured: str | None = None, measured_unit: str = "ns",
                     reject_over_limit: bool = False, identity: bool = True,
                     on_reject: OnReject = "warn", tuning: Tuning | None = None,
                     strict: bool | None = None,
                     trace_format: str = "requests") -> PricedResult:
        """:meth:`price` with the rejected rows and the counts (a
        :class:`kernel.bulk.PricedResult`); see :func:`kernel.bulk.price_result`."""
        from ..bulk import price_result  # (heavy: polars and pyarrow)

        options: dict[str, Any] = {
            "decode_threshold": decode_threshold, "sm_budget": sm_budget, "columns": columns,
            "batches": batches, "keep": keep, "producers": producers,
            "reject_over_limit": reject_over_limit, "identity": identity,
            "on_reject": on_reject, "tuning": tuning, "strict": strict}
        trace = self._requests(trace, trace_format, measured, options)
        return price_result(self, trace,
                            **self._with_producers(measured, measured_unit, options))

    @staticmethod
    def _requests(trace: Any, trace_format: str, measured: str | None,
                  options: dict[str, Any]) -> Any:
        """An FPM trace as request rows (its other columns kept); a request trace as is."""
        if trace_format == "requests":
            return trace
        if trace_format != "fpm":
            raise ValueError(f"trace_format must be 'requests' or 'fpm', not {trace_format!r}")
        from ..io.fpm import fpm_to_requests  # (heavy: polars)

        req, batches, _rejected = fpm_to_requests(trace, columns=options.pop("columns", None))
        options["keep"] = [*(options.get("keep") or ()),
                           *(c for c in batches.columns if c not in ("batch_id", measured))]
        return req.join(batches, on="batch_id", how="left")

    def _with_producers(self, measured: str | None, measured_unit: str,
                        options: dict[str, Any]) -> dict[str, Any]:
        if self._cal is not None or measured is not None:
            from ..bulk.calibrated import producers_for  # (heavy: polars and pyarrow)

            law = self._cal.law if self._cal is not None else None
            options["producers"] = [*producers_for(law, measured, measured_unit),
                                    *(options.get("producers") or ())]
        return options

    # -- transfers and host ------------------------------------------------------------
    def tier_time(self, tier: str, direction: Direction | str, nbytes: int, depth: int) -> int:
        return transfer.tier_time(self._r, tier, Direction(direction), nbytes, depth)

    def pd_transfer_demand(self, tokens: int, src: Placement, dst: Placement) -> PDTransferDemand:
        return transfer.pd_transfer_demand(self._r, tokens, src, dst)

    def pd_transfer_time(self, tokens: int, src: Placement, dst: Placement) -> int:
        return self.pd_transfer_demand(tokens, src, dst).alone_time()

    def admission_overhead(self, prompt_tokens: int) -> int:
        return host.admission_overhead(self._r, prompt_tokens)

    def output_token_overhead(self) -> int:
        return self._r.coefficients.host_output_token_ns

    def completion_overhead(self) -> int:
        return self._r.coefficients.host_completion_ns

    # -- engine introspection ------------------------------------------------------------
    def capture_tokens(self) -> int:
        return self._r.capture_tokens

    def graph_modes(self) -> tuple[str, str]:
        """(uniform-decode mode, every other step's mode): FULL, PIECEWISE or NONE."""
        return (self._r.decode_graph_mode, self._r.other_graph_mode)

    def decode_context_parallel_width(self) -> int:
        return max(self._r.layout.dcp, 1)

    def prefill_context_parallel_width(self) -> int:
        return max(self._r.layout.pcp, 1)

    # -- provenance ---------------------------------------------------------------------
    def provenance(self) -> list[CoefficientOrigin]:
        """Every coefficient in scope (name order), then the kernel's own assumptions, then
        the calibration's entries (method ``fitted``) when there is one."""
        if self._cal is None:
            return list(self._r.provenance)

        return [*self._r.provenance, *provenance_entries(self._cal)]

    def evidence(self) -> tuple[int, int, list[str]]:
        """(entries resting on evidence, all entries, names of assumed entries): the SQL
        ``evidence`` view's row, read when the kernel was built (catalog-origin rows, which
        say where a document came from, are not provenance entries there)."""
        table = self._r.tables.get("evidence")
        if table is None:  # pragma: no cover - every kernel built by kernel.pool.build has it
            raise LookupError("this kernel carries no evidence row (build it with kernel.pool.build)")
        rows = table.to_pylist()
        if not rows:  # a pool without provenance entries
            return 0, 0, []
        row = rows[0]
        return int(row["evidenced"]), int(row["total"]), list(row["assumed_names"])

    def resolved(self) -> Resolution:
        return self._resolution

    def deployment(self) -> Pool:
        """The pool exactly as the document stated it (a deep copy)."""
        return copy.deepcopy(self._pool)

    def documents(self) -> dict[str, dict[str, str]]:
        """Role → {file, sha256} of every document the kernel was built from (a copy)."""
        return {k: dict(v) for k, v in self._documents.items()}


    @property
    def resolved_pool(self) -> ResolvedPool:
        """The full resolution record pricing reads (read-only)."""
        return self._r

    # -- notebooks --------------------------------------------------------------------
    def provenance_frame(self) -> pl.DataFrame:
        """:meth:`provenance` typed, as a polars frame: ``value`` float64 with ``units``,
        ``method`` and ``scope_kind`` enums, ``scope_values`` lists, ``reason`` (the columns
        of the SQL ``provenance`` view, docs/tables.md)."""
        frame = self._frame("provenance")
        if self._cal is None:
            return frame
        import polars as pl  # (heavy: polars, loaded only on this path)


        fitted = pl.DataFrame(
            [{"position": frame.height + i + 1, "name": o.name, "set": o.set,
              "method": o.method, "scope": o.scope, "kind": "calibration"}
             for i, o in enumerate(provenance_entries(self._cal))],
            schema_overrides={"method": frame.schema["method"]})
        return pl.concat([frame, fitted], how="diagonal")

    def resolved_frame(self) -> pl.DataFrame:
        """The pool's resolved configuration as a one-row polars frame (``resolved_pools``)."""
        return self._frame("resolved")

    def overrides_frame(self) -> pl.DataFrame:
        """The engine's overrides of stated settings (``pool_overrides``)."""
        return self._frame("overrides")

    def _frame(self, name: str) -> pl.DataFrame:
        import polars as pl  # (heavy: polars, loaded only on this path)

        table = self._r.tables.get(name)
        if table is None:  # pragma: no cover - every kernel built by kernel.pool.build has them
            raise LookupError(f"this kernel carries no {name} table")
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        # A DuckDB ENUM arrives as an Arrow dictionary holding every member: keep it an enum.
        enums = {f.name: pl.Enum(table.column(f.name).combine_chunks().dictionary.to_pylist())
                 for f in table.schema if str(f.type).startswith("dictionary")}
        return frame.with_columns(pl.col(n).cast(pl.String).cast(e) for n, e in enums.items())

    def save(self, path: str | os.PathLike[str]) -> Path:
        """This kernel in a file :func:`kernel.load_kernel` reads back without YAML, DuckDB or
        resolution (:mod:`kernel.facade.saved`)."""
        from .saved import save_kernel  # (saved.py builds Kernels: the pair reads each other)

        return save_kernel(self, path)

    def _repr_html_(self) -> str:

        from .notebook import kernel_html  # (heavy: DuckDB, for notebooks only)

        return kernel_html(self)

    def __repr__(self) -> str:
        r = self._r
        cal = f", calibration={self._cal.name!r}" if self._cal is not None else ""
        return (f"Kernel({r.scenario!r}, pool={r.pool_index}, model={r.model_name!r}, "
                f"chip={r.chip_name!r}, tp={r.layout.tp}{cal})")
