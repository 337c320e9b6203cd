"""What a calibration is for, and whether it may be applied (decisions CH5, CH6).

A calibration records, besides its model and chip:

* ``engine`` — the serving engine and version **as the measurements state them** (trace
  columns ``engine`` / ``engine_version``), else as the caller states them (``engine=``,
  ``--engine NAME[:VERSION]``), else ``stated_by: not stated``;
* ``rules`` — the rules pack the steps were priced with (the scenario's ``engine_version``):
  the per-resource terms a calibration corrects are those rules' terms;
* ``layout`` — the parallel layout(s) it was fitted on: ``tp`` widths, and the shape of
  everything else (``pp``, ``dp``, ``pcp``, ``dcp``, expert parallelism).

Applying it to a kernel is **refused** (:class:`CalibrationError`, naming every difference)
when the model, the chip, the rules pack or the layout's shape differ, or when the caller
states the engine it prices and that is not the calibration's (an unstated calibration engine
counts as different). ``force`` applies it anyway; the differences are then recorded in the
kernel's provenance (``calibration.forced``). A TP width the calibration was not fitted on is
applied with a warning (extrapolation, or interpolation between fitted widths), and so is a
step whose request count is outside the fit window (:func:`window_warnings`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["CalibrationWarning", "EngineId", "applies", "kernel_identity", "layout_shape",
           "parse_engine", "window_warnings"]

SHAPE_KEYS = ("pp", "dp", "pcp", "dcp", "expert_parallel")
NOT_STATED = "not stated"


class CalibrationWarning(UserWarning):
    """A calibration is applied outside what it was fitted on (still applied)."""


EngineId = dict[str, Any]  # {"name", "version", "stated_by"}


def parse_engine(text: str | None) -> tuple[str | None, str | None]:
    """``NAME[:VERSION]`` (``vllm:0.15.1``) → (name, version)."""
    if text is None or text == "":
        return None, None
    name, _, version = text.partition(":")
    name, version = name.strip(), version.strip()
    if not name:
        raise ValueError(f"an engine is NAME[:VERSION] (e.g. vllm:0.15.1), got {text!r}")
    return name.lower(), version or None


def rules_version(k: Any) -> str:
    """The rules pack a kernel prices with (its scenario's ``engine_version``)."""
    f = k.documents().get("rules", {}).get("file", "")
    return f.removeprefix("<rules pack ").removesuffix(">") if f.startswith("<rules pack ") \
        else ""


def layout_shape(k: Any) -> dict[str, Any]:
    lay = k.resolved_pool.layout
    return {"pp": int(lay.pp), "dp": int(lay.dp), "pcp": int(lay.pcp), "dcp": int(lay.dcp),
            "expert_parallel": bool(lay.enable_expert_parallel)}


def kernel_identity(k: Any) -> dict[str, Any]:
    """model, chip, rules pack, TP width and layout shape of a kernel."""
    r = k.resolved_pool
    return {"model": r.model_name, "chip": r.chip_name, "rules": rules_version(k),
            "tp": int(r.layout.tp), "shape": layout_shape(k)}


def _engine_text(e: Mapping[str, Any] | None) -> str:
    if not e or not e.get("name"):
        return "an engine the measurements do not state"
    return f"{e['name']} {e.get('version') or '(version not stated)'}"


def applies(doc: Mapping[str, Any], ident: Mapping[str, Any],
            engine: tuple[str | None, str | None] = (None, None)
            ) -> tuple[list[str], list[str]]:
    """(differences that refuse the calibration, warnings) for applying the calibration
    document ``doc`` to a kernel of identity ``ident`` (:func:`kernel_identity`) that prices
    ``engine`` (name, version; (None, None) when the caller does not say)."""
    wrong: list[str] = []
    notes: list[str] = []
    for what in ("model", "chip"):
        if ident[what] != doc.get(what):
            wrong.append(f"{what} {ident[what]!r} (the calibration is for {doc.get(what)!r})")
    rules = doc.get("rules")
    if rules and ident.get("rules") and rules != ident["rules"]:
        wrong.append(f"rules pack {ident['rules']!r} (the calibration's steps were priced "
                     f"with {rules!r})")
    layout = doc.get("layout") or {}
    shapes = layout.get("shapes") or []
    if shapes and dict(ident["shape"]) not in [dict(s) for s in shapes]:
        want = "; ".join(_shape_text(s) for s in shapes)
        wrong.append(f"parallel layout {_shape_text(ident['shape'])} (the calibration was "
                     f"fitted on {want})")
    name, version = engine
    cal_engine = doc.get("engine") or {}
    if name is not None:
        same = (cal_engine.get("name") == name
                and (version is None or cal_engine.get("version") == version))
        if not same:
            mine = f"{name} {version or ''}".strip()
            wrong.append(f"engine {mine!r} (the calibration was measured on "
                         f"{_engine_text(cal_engine)})")
    tps = layout.get("tp") or []
    if tps and ident["tp"] not in tps:
        lo, hi = min(tps), max(tps)
        how = ("outside" if not lo <= ident["tp"] <= hi else "between the widths of")
        notes.append(f"TP {ident['tp']} is {how} the fit window (TP {_list(tps)}): the "
                     "calibration is extrapolated")
    return wrong, notes


def _list(v: list[int]) -> str:
    return ", ".join(str(x) for x in sorted(v))


def _shape_text(s: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {s.get(k)}" for k in SHAPE_KEYS)


def window_warnings(doc: Mapping[str, Any], requests: np.ndarray) -> list[str]:
    """A warning when steps' request counts fall outside the calibration's fit window."""
    win = (doc.get("window") or {}).get("requests")
    req = np.asarray(requests)
    if not win or req.size == 0:
        return []
    lo, hi = int(win[0]), int(win[1])
    below, above = int((req < lo).sum()), int((req > hi).sum())
    if not (below or above):
        return []
    return [f"{below + above:,} of {req.size:,} steps have a request count outside the "
            f"calibration's fit window ({lo}–{hi} requests per step: {below:,} below, "
            f"{above:,} above): the calibration is extrapolated there"]


def warn(messages: list[str]) -> None:
    for m in messages:
        warnings.warn(m, CalibrationWarning, stacklevel=3)
