"""Calibration: how far the kernel's prices are from measured step times, and a small fitted
correction of its per-resource terms (``docs/calibration.md``, ``docs/accuracy.md``).

* :mod:`.law` — the pure law ``calibrated_ns`` (scalar and columns, bit-identical);
* :mod:`.fit` — the robust, bounded fit (tied terms share a multiplier), scored held out;
* :mod:`.document` — the YAML document, strict reading, binding to a kernel;
* :mod:`.identity` — engine, rules, layout: what a calibration may be applied to;
* :mod:`.make` — :func:`calibrate`: price measured traces, fit, document;
* :mod:`.accuracy` — relative errors and the accuracy table;
* :mod:`.measured` — a measured column's units and bad values;
* :mod:`.splitwise` — SplitwiseSim's profile as a measured trace;
* :mod:`.requests_fit` — :func:`from_requests`: the law fitted through the serving replay to
  a request log (:mod:`.requests_loo`: leave-one-experiment-out on sim-to-real).
"""

from __future__ import annotations

from typing import Any

from ..io.calibration_document import Calibration, CalibrationError, load_calibration
from ..io.calibration_identity import CalibrationWarning
from ..model.calibration_law import PHASES, STARTS, TERMS, Law, PhaseCorrection, calibrated_ns
from .make import calibrate
from .requests_fit import from_requests as fit


def from_requests(*args: Any, **kwargs: Any) -> Calibration:
    """:func:`kernel.calibration.requests_fit.from_requests` (imported on first use: it
    needs the serving replay)."""

    return fit(*args, **kwargs)


__all__ = ["PHASES", "STARTS", "TERMS", "Calibration", "CalibrationError",
           "CalibrationWarning", "Law", "PhaseCorrection", "calibrate", "calibrated_ns",
           "from_requests", "load_calibration"]
