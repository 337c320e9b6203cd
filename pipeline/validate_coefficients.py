"""Field checks on a coefficient set (model.md §12.5). Entry paths are
``coefficients[i].<name>.<key>``, the way the decoder records them."""

from __future__ import annotations

import math
from collections.abc import Mapping

from .documents import CoefficientEntry, CoefficientSet
from .errors import Problem
from .validate_common import METHODS, SOURCE_KINDS, SOURCE_ROLES, UNITS, Collector, go_float

# Companion fields each method requires (model.md §12.5): rationale, sources, copied_from.
_NEEDS_RATIONALE = {"literature", "vendor_spec", "copied", "assumed", "not_charged"}
_NEEDS_SOURCES = {"literature", "vendor_spec"}
_NEEDS_COPIED_FROM = {"copied"}


def validate_coefficient_set(doc: CoefficientSet, file: str,
                             lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one coefficient set."""
    c = Collector(file, lines)
    c.kind(doc.kind, "CoefficientSet")
    c.required("name", doc.name)
    if not doc.coefficients:
        c.error("coefficients", "at least one coefficient is required")
    first: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(doc.coefficients):
        if entry is None:  # a malformed entry the decoder already reported
            continue
        if not entry.name:
            c.error(f"coefficients[{i}]", "required: an entry is a single-key map naming it")
            continue
        at = c.at(f"coefficients[{i}].{entry.name}")
        scope = entry.scope.describe()
        ident = (entry.name, scope)
        if ident in first:
            at.error("scope", f"repeats coefficients[{first[ident]}]: same name and scope "
                     f"({scope})")
        else:
            first[ident] = i
        _entry(at, entry)
    return c.problems


def _entry(c: Collector, e: CoefficientEntry) -> None:
    c.one_of("units", e.units, UNITS)
    c.one_of("method", e.method, METHODS)
    if c.finite("value", e.value):
        if e.method == "not_charged" and e.value != 0:
            c.error("value", f"must be 0 for a not_charged coefficient, got {go_float(e.value)}")
        elif e.method != "not_charged" and e.value == 0:
            c.error("value", "required: only a not_charged coefficient may be 0")
    if e.fitted and e.method != "measured":
        c.error("fitted", f"true only for a measured coefficient; method is {e.method!s}")
    if e.scope.describe() == "unscoped":
        c.error("scope", "at least one scope dimension is required")
    if e.method in _NEEDS_RATIONALE and not e.rationale.strip():
        c.error("rationale", f"required for method {e.method}")
    if e.method in _NEEDS_SOURCES and not e.sources:
        c.error("sources", f"required for method {e.method}: at least one source")
    if e.method in _NEEDS_COPIED_FROM and not e.copied_from:
        c.error("copied_from", "required for method copied: the scope the value was copied from")
    for k, source in enumerate(e.sources or ()):
        at = c.at(f"sources[{k}]")
        at.one_of("kind", source.kind, SOURCE_KINDS)
        at.one_of("role", source.role, SOURCE_ROLES)
        at.required("cite", source.cite)
    if e.ci95 is not None and len(e.ci95) == 2:
        low, high = e.ci95
        finite = c.finite("ci95[0]", low) & c.finite("ci95[1]", high)
        if finite and low > high:
            c.error("ci95", f"lower end {go_float(low)} exceeds upper end {go_float(high)}")
        elif finite and math.isfinite(e.value) and not low <= e.value <= high:
            c.error("ci95", f"[{go_float(low)}, {go_float(high)}] does not contain value "
                    f"{go_float(e.value)}")
