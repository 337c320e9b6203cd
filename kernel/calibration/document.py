"""The calibration document (``docs/calibration.md``): writing, reading and checking it.

A calibration is YAML. Only ``kind``, ``version``, ``name``, ``model``, ``chip`` and each
phase's ``multipliers`` and ``constant_ns`` decide prices; the rest records how it was made
(term status, errors, the fit window, digests of the trace and scenario documents). Reading
is strict: an unknown key, a missing one or a value of the wrong kind is an error naming the
file and the key path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .law import PHASES, TERMS, Law, PhaseCorrection

__all__ = ["Calibration", "CalibrationError", "load_calibration",
           "check_applies"]

KIND = "Calibration"
VERSION = 1
STATUSES = ("fitted", "tied", "held")
SUMMARY_KEYS = ("rows", "mape", "bias", "p50", "p90", "p99")


class CalibrationError(ValueError):
    """A calibration document is malformed, or does not apply to this kernel."""


@dataclass(frozen=True)
class Calibration:
    """A loaded calibration: the law, what it applies to, and its whole document."""

    name: str
    model: str
    chip: str
    law: Law
    source: str = ""  # the file it was read from ("" when built in memory)
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def term_status(self, phase: str, term: str) -> str:
        terms = self.document.get("phases", {}).get(phase, {}).get("terms", {})
        status = terms.get(term, {}).get("status", "fitted")
        return str(status)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.document, sort_keys=False, allow_unicode=True, width=100)

    def write(self, path: str | Path) -> None:
        from pipeline import safe_output

        safe_output.write_text(path, self.to_yaml())


# -- reading --------------------------------------------------------------------------------

def _err(file: str, path: str, msg: str) -> CalibrationError:
    where = f"{file}: " if file else ""
    return CalibrationError(f"{where}{path}: {msg}")


def _mapping(v: Any, file: str, path: str, required: tuple[str, ...],
             optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _err(file, path or "(document)", f"must be a mapping, got {type(v).__name__}")
    unknown = sorted(set(v) - set(required) - set(optional))
    if unknown:
        raise _err(file, path or "(document)", f"unknown key(s) {unknown}; allowed: "
                   f"{list(required) + list(optional)}")
    missing = [k for k in required if k not in v]
    if missing:
        raise _err(file, f"{path}.{missing[0]}" if path else missing[0], "required")
    return v


def _number(v: Any, file: str, path: str, *, nonneg: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise _err(file, path, f"must be a finite number, got {v!r}")
    if nonneg and float(v) < 0:
        raise _err(file, path, f"must be >= 0, got {v!r}")
    return float(v)


def _string(v: Any, file: str, path: str) -> str:
    if not isinstance(v, str) or not v:
        raise _err(file, path, f"must be a non-empty string, got {v!r}")
    return v


_TOP_REQUIRED = ("kind", "version", "name", "model", "chip", "phases")
_TOP_OPTIONAL = ("law", "fit", "window", "sources", "training", "held_out", "created_by")
_PHASE_REQUIRED = ("multipliers", "constant_ns")
_PHASE_OPTIONAL = ("rows", "fitted_on", "terms", "training", "held_out", "note")


def from_document(doc: Any, source: str = "") -> Calibration:
    """Validate a parsed document and build the :class:`Calibration`."""
    f = source
    top = _mapping(doc, f, "", _TOP_REQUIRED, _TOP_OPTIONAL)
    if top["kind"] != KIND:
        raise _err(f, "kind", f"must be {KIND!r}, got {top['kind']!r}")
    if top["version"] != VERSION:
        raise _err(f, "version", f"must be {VERSION}, got {top['version']!r}")
    name = _string(top["name"], f, "name")
    model = _string(top["model"], f, "model")
    chip = _string(top["chip"], f, "chip")
    phases = _mapping(top["phases"], f, "phases", PHASES)
    corrections = {}
    for p in PHASES:
        ph = _mapping(phases[p], f, f"phases.{p}", _PHASE_REQUIRED, _PHASE_OPTIONAL)
        mult = _mapping(ph["multipliers"], f, f"phases.{p}.multipliers", TERMS)
        ms = tuple(_number(mult[t], f, f"phases.{p}.multipliers.{t}") for t in TERMS)
        c = _number(ph["constant_ns"], f, f"phases.{p}.constant_ns")
        if "terms" in ph:
            terms = _mapping(ph["terms"], f, f"phases.{p}.terms", (), (*TERMS, "constant"))
            for t, info in terms.items():
                info = _mapping(info, f, f"phases.{p}.terms.{t}", ("status",),
                                ("std_error", "reason"))
                if info["status"] not in STATUSES:
                    raise _err(f, f"phases.{p}.terms.{t}.status",
                               f"{info['status']!r} is not one of {list(STATUSES)}")
        corrections[p] = PhaseCorrection(ms, c)  # type: ignore[arg-type]
    return Calibration(name, model, chip, Law(**corrections), source, top)


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise CalibrationError(f"{p}: cannot read the calibration: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CalibrationError(f"{p}: not valid YAML: {exc}") from None
    return from_document(doc, str(p))


def check_applies(cal: Calibration, model: str, chip: str, force: bool = False) -> None:
    """Refuse a calibration made for another model or chip (unless ``force``)."""
    wrong = [f"{what} {have!r} (the calibration is for {want!r})"
             for what, have, want in (("model", model, cal.model), ("chip", chip, cal.chip))
             if have != want]
    if wrong and not force:
        where = cal.source or cal.name
        raise CalibrationError(f"{where}: refusing to apply calibration {cal.name!r} to "
                               f"{' and '.join(wrong)}; pass force=True (--force-calibration) "
                               "to apply it anyway")


def as_calibration(value: Any) -> Calibration:
    """A :class:`Calibration`, a path to one, or a parsed document."""
    if isinstance(value, Calibration):
        return value
    if isinstance(value, str | Path):
        return load_calibration(value)
    if isinstance(value, dict):
        return from_document(value)
    raise CalibrationError(f"calibration must be a Calibration, a path or a mapping, got "
                           f"{type(value).__name__}")
