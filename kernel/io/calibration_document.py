"""The calibration document (``docs/calibration.md``): writing, reading and checking it.

A calibration is YAML. Only ``kind``, ``version``, ``name``, ``model``, ``chip``, ``start``
and each phase's ``multipliers``, ``per_request_ns`` and ``constant_ns`` decide prices;
``engine``, ``rules`` and ``layout`` decide where it may be applied (:mod:`.identity`); the
rest records how it was made (term status, ties, errors from both starts, the fit window,
digests of the trace and scenario documents). Reading is strict: an unknown key, a missing
one or a value of the wrong kind is an error naming the file and the key path.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline import safe_output

from ..model.calibration_law import PHASES, STARTS, TERMS, Law, PhaseCorrection
from .calibration_identity import applies, kernel_identity, parse_engine, warn

__all__ = ["Calibration", "CalibrationError", "bind", "law_document", "load_calibration"]

KIND = "Calibration"
VERSION = 1
STATUSES = ("fitted", "tied", "shrunk", "held")
SUMMARY_KEYS = ("rows", "mape", "bias", "p50", "p90", "p99")

log = logging.getLogger(__name__)  # no handler here: the CLI attaches one (CF5)


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
    # what differed from the kernel it was applied to, applied anyway (force): provenance
    forced: tuple[str, ...] = ()

    def term_status(self, phase: str, term: str) -> str:
        terms = self.document.get("phases", {}).get(phase, {}).get("terms", {})
        status = terms.get(term, {}).get("status", "fitted")
        return str(status)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.document, sort_keys=False, allow_unicode=True, width=100)

    def write(self, path: str | Path) -> None:

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
_TOP_OPTIONAL = ("law", "start", "engine", "rules", "layout", "fit", "window", "sources",
                 "training", "held_out", "starts", "uncalibrated", "improved", "warning",
                 "created_by")
_PHASE_REQUIRED = ("multipliers", "constant_ns")
_PHASE_OPTIONAL = ("per_request_ns", "rows", "fitted_on", "terms", "tied", "floor_bound",
                   "training", "held_out", "note")


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
        c = _number(ph["constant_ns"], f, f"phases.{p}.constant_ns", nonneg=False)
        r = _number(ph.get("per_request_ns", 0.0), f, f"phases.{p}.per_request_ns",
                    nonneg=False)
        if "terms" in ph:
            terms = _mapping(ph["terms"], f, f"phases.{p}.terms", (),
                             (*TERMS, "per_request", "constant"))
            for t, info in terms.items():
                info = _mapping(info, f, f"phases.{p}.terms.{t}", ("status",),
                                ("std_error", "reason"))
                if info["status"] not in STATUSES:
                    raise _err(f, f"phases.{p}.terms.{t}.status",
                               f"{info['status']!r} is not one of {list(STATUSES)}")
        corrections[p] = PhaseCorrection(ms, c, r)  # type: ignore[arg-type]
    start = top.get("start", "no_overlap")
    if start not in STARTS:
        raise _err(f, "start", f"{start!r} is not one of {list(STARTS)}")
    for key in ("engine", "layout"):
        if key in top and top[key] is not None and not isinstance(top[key], dict):
            raise _err(f, key, f"must be a mapping, got {type(top[key]).__name__}")
    return Calibration(name, model, chip, Law(**corrections, start=start), source, top)


def law_document(law: Law, *, name: str, model: str, chip: str,
                 engine: dict[str, Any] | None = None, rules: str = "",
                 layout: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A valid calibration document for a law found some other way than :func:`.fit.fit`
    (e.g. an outer optimiser over a serving replay): the law's keys, what it may be applied
    to, and any further top-level keys of the document (``fit``, ``held_out``, …) in
    ``extra``. :func:`from_document` reads it back to the same law."""
    unknown = sorted(set(extra) - set(_TOP_OPTIONAL))
    if unknown:
        raise CalibrationError(f"unknown calibration key(s) {unknown}; allowed: "
                               f"{list(_TOP_OPTIONAL)}")
    doc: dict[str, Any] = {
        "kind": KIND, "version": VERSION, "name": name, "model": model, "chip": chip,
        "start": law.start,
        "engine": dict(engine or {"name": None, "version": None, "stated_by": "not stated"}),
        "rules": rules, "layout": dict(layout or {}),
        "phases": {p: {"multipliers": dict(zip(TERMS, law.phase(p).multipliers, strict=True)),
                       "per_request_ns": law.phase(p).per_request_ns,
                       "constant_ns": law.phase(p).constant_ns} for p in PHASES},
    }
    doc.update(extra)
    return doc


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


def bind(cal: Calibration, k: Any, force: bool = False, engine: str | None = None
         ) -> Calibration:
    """``cal`` checked against kernel ``k`` (:mod:`.identity`): refused when it is for another
    model, chip, rules pack, layout shape or (when ``engine``, ``NAME[:VERSION]``, says what
    the kernel prices) engine, unless ``force`` — then the differences are recorded in
    ``forced`` (and so in provenance). Warns (:class:`CalibrationWarning`) for a TP width
    outside the fit window."""


    try:
        who = parse_engine(engine)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    wrong, notes = applies(cal.document or {"model": cal.model, "chip": cal.chip},
                           kernel_identity(k), who)
    if wrong and not force:
        where = cal.source or cal.name
        raise CalibrationError(f"{where}: refusing to apply calibration {cal.name!r} to "
                               f"{'; '.join(wrong)}; pass force=True (--force-calibration) "
                               "to apply it anyway")
    warn(notes)
    log.info("calibration %r applied (%s)%s", cal.name, cal.source or "in memory",
             f", forced over: {'; '.join(wrong)}" if wrong else "")
    return dataclasses.replace(cal, forced=tuple(wrong))


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
