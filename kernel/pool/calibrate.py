"""A calibration in a kernel's provenance (its columns: :mod:`.columns`)."""

from __future__ import annotations

from ..io.calibration_document import Calibration
from ..model.calibration_law import PHASES, TERMS
from ..model.resolved import Origin

__all__ = ["provenance_entries"]


def provenance_entries(cal: Calibration) -> list[Origin]:
    """One ``fitted`` entry per phase and parameter, its set naming the calibration's source;
    then, when it was applied although something differed (force), one ``assumed`` entry
    ``calibration.forced`` naming every difference."""
    source = f"calibration:{cal.source or cal.name}"
    out = [Origin("calibration.start", source, "fitted",
                  f"starts from {cal.law.start} (the estimate the multipliers correct)")]
    for p in PHASES:
        corr = cal.law.phase(p)
        for t, m in zip(TERMS, corr.multipliers, strict=True):
            out.append(Origin(f"calibration.{p}.{t}", source, "fitted",
                              f"{p} steps: x{m:.6g} ({cal.term_status(p, t)})"))
        out.append(Origin(f"calibration.{p}.per_request_ns", source, "fitted",
                          f"{p} steps: {corr.per_request_ns:+.6g} ns per running request "
                          f"({cal.term_status(p, 'per_request')})"))
        out.append(Origin(f"calibration.{p}.constant_ns", source, "fitted",
                          f"{p} steps: {corr.constant_ns:+.6g} ns "
                          f"({cal.term_status(p, 'constant')})"))
    if cal.forced:
        out.append(Origin("calibration.forced", source, "assumed",
                          "applied by force despite: " + "; ".join(cal.forced)))
    return out
