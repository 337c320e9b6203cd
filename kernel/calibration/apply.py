"""Applying a calibration to priced output: the ``calibrated_ns`` column and provenance."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from ..resolved import Origin
from .document import Calibration
from .law import PHASES, TERMS, Law, calibrated_ns

__all__ = ["calibrated_column", "provenance_entries", "with_calibrated"]


def calibrated_column(table: pl.DataFrame | pa.Table, law: Law) -> pa.Array:
    """``calibrated_ns`` (int64) for a priced table (its ``*_ns`` and request columns)."""
    def col(name: str) -> np.ndarray:
        return np.asarray(table[name].to_numpy())

    out = calibrated_ns(law, [col(f"{t}_ns") for t in TERMS], col("prefill_requests"),
                        col("decode_requests"))
    return pa.array(out, pa.int64())


def with_calibrated(frame: pl.DataFrame, law: Law) -> pl.DataFrame:
    """The priced frame with ``calibrated_ns`` after ``no_overlap_ns``."""
    values = pl.Series("calibrated_ns", calibrated_column(frame, law))
    at = frame.columns.index("no_overlap_ns") + 1 if "no_overlap_ns" in frame.columns \
        else frame.width
    return frame.insert_column(at, values)


def provenance_entries(cal: Calibration) -> list[Origin]:
    """One ``fitted`` entry per phase and parameter, its set naming the calibration's source."""
    source = f"calibration:{cal.source or cal.name}"
    out = []
    for p in PHASES:
        corr = cal.law.phase(p)
        for t, m in zip(TERMS, corr.multipliers, strict=True):
            out.append(Origin(f"calibration.{p}.{t}", source, "fitted",
                              f"{p} steps: x{m:.6g} ({cal.term_status(p, t)})"))
        out.append(Origin(f"calibration.{p}.constant_ns", source, "fitted",
                          f"{p} steps: +{corr.constant_ns:.6g} ns "
                          f"({cal.term_status(p, 'constant')})"))
    return out
