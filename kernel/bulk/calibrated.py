"""The calibration's and the measured column's additions to the priced table, as column
producers (:mod:`kernel.bulk.columns`):

* ``calibrated_ns`` (int64) — the law applied to the batch's per-resource columns;
* ``measured_ns`` (int64) from a trace column in ns/us/ms/s (each batch takes its first row's
  value), and ``no_overlap_error``, ``overlap_error`` (and ``calibrated_error``), the
  relative error ``(estimate − measured) / measured`` of each estimate. A row whose measured
  value is null, not a number, non-finite, zero or negative is rejected (reason
  ``bad_measured``) and takes its batch with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl
import pyarrow as pa

from ..io.measured import BAD_MEASURED, UNITS, to_ns
from ..model.calibration_law import TERMS, Law, calibrated_ns
from .columns import BatchContext, ColumnProducer

__all__ = ["calibrated_producer", "measured_producer", "producers_for"]


def _calibrated(law: Law, ctx: BatchContext) -> np.ndarray:
    p = ctx.priced
    return calibrated_ns(law, [np.asarray(p[f"{t}_ns"]) for t in TERMS],
                         np.asarray(p["prefill_requests"]), np.asarray(p["decode_requests"]),
                         np.asarray(p["overlap_ns"]))


def calibrated_producer(law: Law) -> ColumnProducer:
    return ColumnProducer("calibrated", (pa.field("calibrated_ns", pa.int64()),),
                          lambda ctx: {"calibrated_ns": _calibrated(law, ctx)})


def _as_float(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with NaN where unusable, mask of non-null values that are not
    numbers)."""
    s = pl.Series(arr) if not isinstance(arr, pl.Series) else arr
    if s.dtype == pl.String:
        s = s.str.strip_chars()
    f = s.cast(pl.Float64, strict=False)
    notnum = (f.is_null() & s.is_not_null()).to_numpy()
    return f.fill_null(float("nan")).to_numpy().astype(np.float64), notnum


def measured_producer(column: str, unit: str = "ns", law: Law | None = None
                      ) -> ColumnProducer:
    """``measured_ns`` and the error columns from the trace column ``column`` in ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"measured unit {unit!r} is not one of {list(UNITS)}")
    names = ["no_overlap", "overlap"] + (["calibrated"] if law is not None else [])
    fields = (pa.field("measured_ns", pa.int64()),
              *(pa.field(f"{n}_error", pa.float64()) for n in names))

    def check(inputs: Mapping[str, pa.Array]) -> np.ndarray:
        v, notnum = _as_float(inputs[column])
        _, detail = to_ns(v, unit)
        detail[notnum] = f"{column} is not a number"
        return detail

    def produce(ctx: BatchContext) -> dict[str, np.ndarray]:
        v, _ = _as_float(ctx.inputs[column])
        ns, _ = to_ns(v, unit)
        m = ns.astype(np.float64)
        out: dict[str, np.ndarray] = {"measured_ns": ns}
        est = {"no_overlap": ctx.priced["no_overlap_ns"], "overlap": ctx.priced["overlap_ns"]}
        if law is not None:
            est["calibrated"] = _calibrated(law, ctx)
        for n in names:
            out[f"{n}_error"] = (np.asarray(est[n], np.float64) - m) / m
        return out

    return ColumnProducer("measured", fields, produce, inputs=(column,), check=check,
                          reason=BAD_MEASURED)


def producers_for(calibration: Law | None, measured: str | None, unit: str = "ns"
                  ) -> list[ColumnProducer]:
    out = []
    if calibration is not None:
        out.append(calibrated_producer(calibration))
    if measured is not None:
        out.append(measured_producer(measured, unit, calibration))
    return out
