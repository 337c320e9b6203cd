"""A calibration in a kernel's provenance (its columns: :mod:`.columns`)."""

from __future__ import annotations

from ..resolved import Origin
from .document import Calibration
from .law import PHASES, TERMS

__all__ = ["provenance_entries"]


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
