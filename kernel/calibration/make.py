"""``kernel.calibrate``: price measured traces, fit, score held out, and write the document."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kernel.bulk import price_result
from kernel.io.sources import open_trace
from kernel.io.stamp import file_sha256

from ..bulk.calibrated import measured_producer
from ..facade.factory import open as open_kernel
from ..io.calibration_document import VERSION, Calibration, CalibrationError, from_document
from ..io.calibration_identity import NOT_STATED, layout_shape, parse_engine, rules_version
from ..io.fpm import fpm_to_requests
from ..io.measured import BAD_MEASURED, UNITS
from ..model.calibration_law import PHASES, STARTS, TERMS
from .fit import CONSTANT, PER_REQUEST, FitOptions, FitResult, fit

__all__ = ["calibrate", "calibration_document", "split_mask"]

ENGINE_COLUMNS = ("engine", "engine_version")


def _summary(s: Any) -> dict[str, Any]:
    d = s.as_dict()
    return {k: (int(d[k]) if k == "rows" else _num(d[k])) for k in d}


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(round(x, 6))


def _by_phase(summaries: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _summary(v) for k, v in summaries.items()}


def calibration_document(result: FitResult, *, name: str, model: str, chip: str,
                         priced: pl.DataFrame, sources: Mapping[str, Any],
                         options: FitOptions, seed: int,
                         engine: Mapping[str, Any] | None = None, rules: str = "",
                         layout: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The YAML document (``docs/calibration.md``) for a fit."""
    phases: dict[str, Any] = {}
    for p in PHASES:
        pf = result.phases[p]
        by = {t.name: t for t in pf.terms}
        ph: dict[str, Any] = {
            "rows": pf.rows,
            **({"fitted_on": pf.sampled} if pf.sampled else {}),
            "multipliers": {t: float(by[t].value) for t in TERMS},
            "per_request_ns": float(by[PER_REQUEST].value),
            "constant_ns": float(by[CONSTANT].value),
            "terms": {t.name: {"status": t.status,
                               "std_error": None if t.std_error is None else
                               float(t.std_error),
                               **({"reason": t.reason} if t.reason else {})}
                      for t in pf.terms},
        }
        if pf.tied:
            ph["tied"] = [{"terms": list(g.terms), "multiplier": float(g.multiplier),
                           "std_error": g.std_error} for g in pf.tied]
        if pf.floor_bound:
            ph["floor_bound"] = True
        if p in result.training:
            ph["training"] = _summary(result.training[p])
        if p in result.held_out:
            ph["held_out"] = _summary(result.held_out[p])
        if pf.reason:
            ph["note"] = pf.reason
        phases[p] = ph

    def span(col: str) -> list[int]:
        v = priced[col].to_numpy()
        return [int(v.min()), int(v.max())] if v.size else [0, 0]

    window: dict[str, Any] = {"steps": priced.height, "batch_id": span("batch_id"),
                              "requests": span("requests"), "tokens": span("tokens"),
                              "measured_ns": span("measured_ns")}
    if result.fold_by and result.fold_by in priced.columns:
        window["groups"] = sorted(str(v) for v in priced[result.fold_by].unique().to_list())
    doc: dict[str, Any] = {
        "kind": "Calibration",
        "version": VERSION,
        "name": name,
        "model": model,
        "chip": chip,
        "start": result.law.start,
        "engine": dict(engine or {"name": None, "version": None, "stated_by": NOT_STATED}),
        "rules": rules,
        "layout": dict(layout or {}),
        "law": ("x = Σ m_j·t_j (start no_overlap) or overlap_ns + Σ (m_j − 1)·t_j (start "
                "overlap); calibrated_ns = trunc(max(x + per_request_ns·requests + "
                "constant_ns, max_j m_j·t_j)), per phase class"),
        "phases": phases,
        "fit": {"method": "huber-irls bounded least squares on relative error; terms the "
                          "data cannot tell apart share one multiplier (tied); directions "
                          "still weak are shrunk toward the prior, never pinned",
                "options": {k: getattr(options, k) for k in
                            ("ridge", "huber_k", "max_iter", "min_share", "min_eigen",
                             "max_std_error", "shrink", "per_request", "tie_alone",
                             "min_rows", "max_rows")},
                "scored_by": result.scored_by, "start_chosen_by": result.start_chosen_by,
                "folds": result.folds, "fold_by": result.fold_by, "seed": seed},
        "window": window,
        "sources": dict(sources),
        "training": _summary(result.training["all"]),
        "held_out": _summary(result.held_out["all"]) if "all" in result.held_out else None,
        "starts": {s: {"uncalibrated": _by_phase(v["uncalibrated"]),
                       "calibrated": _by_phase(v["calibrated"])}
                   for s, v in result.starts.items()},
        "uncalibrated": {e: _by_phase(v) for e, v in result.uncalibrated.items()},
        "improved": result.improved,
        "warning": result.warning or None,
        "created_by": "blis-kernel",
    }
    return doc


def split_mask(values: Sequence[Any] | np.ndarray, fraction: float) -> np.ndarray:
    """True for the steps held out by a deterministic split on a column: each distinct value
    is held out when the first 8 bytes of the SHA-256 of its text, as a fraction of 2^64,
    are below ``fraction`` (the same on every machine and polars version)."""
    if not 0.0 < fraction < 1.0:
        raise CalibrationError(f"a split fraction must be between 0 and 1 (exclusive), got "
                               f"{fraction!r}")
    vals = np.asarray(values, dtype=object)
    uniq, inv = np.unique(vals.astype(str), return_inverse=True)
    held = np.array([int.from_bytes(hashlib.sha256(u.encode()).digest()[:8], "big") / 2**64
                     < fraction for u in uniq.tolist()], bool)
    return held[inv.reshape(-1)]


def parse_split(text: str) -> tuple[str, float]:
    """``COL:FRACTION`` → (column, fraction held out)."""
    col, sep, frac = text.rpartition(":")
    try:
        f = float(frac)
    except ValueError:
        f = float("nan")
    if not sep or not col or not np.isfinite(f):
        raise CalibrationError(f"a split is COL:FRACTION (e.g. config:0.5, the share held "
                               f"out), got {text!r}")
    return col, f


@dataclass
class _Priced:
    parts: list[pl.DataFrame] = field(default_factory=list)
    model: str | None = None
    chip: str | None = None
    rules: set[str] = field(default_factory=set)
    tps: set[int] = field(default_factory=set)
    shapes: list[dict[str, Any]] = field(default_factory=list)
    scen_src: list[dict[str, Any]] = field(default_factory=list)
    trace_src: list[dict[str, Any]] = field(default_factory=list)
    engines: set[tuple[str | None, str | None]] = field(default_factory=set)
    rejected_steps: int = 0  # steps (batches, FPM passes) set aside for their measured value
    rejected_rows: int = 0

    def frame(self) -> pl.DataFrame:
        if not self.parts:
            return pl.DataFrame()
        return pl.concat(self.parts, how="vertical_relaxed")


def _columns_of(tr: Any, columns: Mapping[str, str] | None) -> list[str]:

    if isinstance(tr, pl.DataFrame):
        return tr.columns
    ts = open_trace(tr, columns=columns)
    return list(ts.schema.names) if ts.schema is not None else []


def _price(into: _Priced, scenarios: list[Any], traces: list[Any], measured: str, unit: str,
           repos: Any, pool: int, columns: Mapping[str, str] | None, trace_format: str,
           keep: list[str], decode_threshold: int) -> None:


    if len(scenarios) == 1:
        scenarios = scenarios * len(traces)
    if len(scenarios) != len(traces):
        raise CalibrationError(f"{len(scenarios)} scenarios for {len(traces)} traces: give "
                               "one scenario, or one per trace")
    for scen, tr in zip(scenarios, traces, strict=True):
        k = open_kernel(str(scen), repos, pool)
        r = k.resolved_pool
        if into.model is None:
            into.model, into.chip = r.model_name, r.chip_name
        elif (into.model, into.chip) != (r.model_name, r.chip_name):
            raise CalibrationError(f"scenario {str(scen)!r} is {r.model_name} on "
                                   f"{r.chip_name}, the others {into.model} on {into.chip}: a "
                                   "calibration is for one model and one chip")
        into.rules.add(rules_version(k))
        into.tps.add(int(r.layout.tp))
        shape = layout_shape(k)
        if shape not in into.shapes:
            into.shapes.append(shape)
        into.scen_src.append({"scenario": r.scenario, "pool": pool, "tp": int(r.layout.tp),
                              "documents": {role: d["sha256"]
                                            for role, d in sorted(k.documents().items())}})
        if trace_format == "fpm":
            req, batches, fpm_rej = fpm_to_requests(tr, columns=columns)
            into.rejected_steps += fpm_rej.height
            wanted = [c for c in (measured, *keep, *ENGINE_COLUMNS) if c in batches.columns]
            tr_rows: Any = req.join(batches.select(["batch_id", *dict.fromkeys(wanted)]),
                                    on="batch_id", how="left")
            have = tr_rows.columns
        elif trace_format == "requests":
            tr_rows = tr
            have = _columns_of(tr, columns)
        else:
            raise CalibrationError(f"trace format {trace_format!r} is not one of "
                                   "['requests', 'fpm']")
        missing = [c for c in keep if c not in have]
        if missing:
            raise CalibrationError(f"{_label(tr)}: no column {missing[0]!r} (for --fold-by / "
                                   f"--split); it has {', '.join(have)}")
        carry = [*keep, *[c for c in ENGINE_COLUMNS if c in have and c not in keep]]
        # one pricing pass reads the measured column too (bad values -> rejects)
        res = price_result(k, tr_rows, columns=None if trace_format == "fpm" else columns,
                           decode_threshold=decode_threshold,
                           producers=[measured_producer(measured, unit)],
                           keep=carry or None, on_reject="ignore")
        p = res.priced
        into.rejected_rows += res.counts.rows_rejected
        bad = res.rejects.filter(pl.col("reason") == BAD_MEASURED)
        into.rejected_steps += bad["batch_id"].n_unique()
        if keep:
            p = p.with_columns([pl.col(c).cast(pl.String) for c in keep])
        if any(c in p.columns for c in ENGINE_COLUMNS):
            e = p.select([pl.col(c).cast(pl.String) if c in p.columns else
                          pl.lit(None, pl.String).alias(c) for c in ENGINE_COLUMNS]).unique()
            into.engines.update((a, b) for a, b in e.iter_rows())
            p = p.drop([c for c in ENGINE_COLUMNS if c in p.columns and c not in keep])
        into.parts.append(p)
        if isinstance(tr, str | Path):
            into.trace_src.append({"path": Path(tr).name, "sha256": file_sha256(tr),
                                   "steps": p.height})
        else:
            into.trace_src.append({"path": "(in memory)", "steps": p.height})


def _label(tr: Any) -> str:
    return str(tr) if isinstance(tr, str | Path) else "the trace"


def _engine(stated: set[tuple[str | None, str | None]], option: str | None
            ) -> dict[str, Any]:
    """The engine as the measurements state it (one value), else the option, else unknown."""
    try:
        name, version = parse_engine(option)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    if stated:
        if len(stated) > 1:
            raise CalibrationError("the measurements state more than one engine "
                                   f"({sorted(map(str, stated))}): calibrate each separately")
        (m_name, m_version), = stated
        m_name = m_name.lower() if m_name else None
        if name is not None and (name != m_name or (version and version != m_version)):
            raise CalibrationError(f"--engine {option!r} contradicts the measurements, which "
                                   f"state {m_name} {m_version}")
        return {"name": m_name, "version": m_version or version,
                "stated_by": "measurements"}
    if name is not None:
        return {"name": name, "version": version, "stated_by": "option"}
    return {"name": None, "version": None, "stated_by": NOT_STATED}


def calibrate(scenario: str | Path | Sequence[str | Path], trace: Any, measured: str, *,
              unit: str = "ns", repos: Any = None, pool: int = 0,
              columns: Mapping[str, str] | None = None, trace_format: str = "requests",
              folds: int = 5, fold_by: str | None = None, name: str | None = None,
              options: FitOptions | None = None, seed: int = 0,
              decode_threshold: int = 1, holdout: Any = None,
              holdout_scenario: str | Path | Sequence[str | Path] | None = None,
              split: str | None = None, start: str = "auto",
              engine: str | None = None) -> Calibration:
    """Price measured trace(s) on their scenario(s), fit a calibration and score it held out.

    ``trace`` is one trace or a list (one per scenario, or several for one scenario);
    ``measured`` names the per-batch column of measured step times in ``unit``
    (ns/us/ms/s). Held-out scoring, in this order of precedence: ``holdout`` (trace(s)
    priced on ``holdout_scenario``, default the scenario(s) of ``trace``); ``split``
    (``COL:FRACTION``: the steps whose per-batch ``COL`` value hashes below FRACTION are held
    out, :func:`split_mask`); ``folds`` ≥ 2 (``fold_by`` names a per-batch column whose
    values are held out whole; otherwise steps are dealt at random). ``start``:
    ``no_overlap``, ``overlap`` or ``auto`` (both, the lower held-out MAPE kept). ``engine``:
    ``NAME[:VERSION]`` when the measurements (columns ``engine``, ``engine_version``) do not
    state it. Every scenario must be the same model and chip. The result's document says
    (``improved``, ``warning``) when the calibration does not beat its start.
    """
    if unit not in UNITS:
        raise CalibrationError(f"measured unit {unit!r} is not one of {list(UNITS)}")
    if start not in (*STARTS, "auto"):
        raise CalibrationError(f"start {start!r} is not one of {[*STARTS, 'auto']}")
    if holdout is not None and split is not None:
        raise CalibrationError("give a holdout trace or a split, not both")
    traces = list(trace) if isinstance(trace, list | tuple) else [trace]
    scenarios = (list(scenario) if isinstance(scenario, list | tuple) else [scenario])
    split_col, split_frac = parse_split(split) if split else (None, 0.0)
    keep = [c for c in dict.fromkeys([fold_by, split_col]) if c]
    opts = options or FitOptions()
    got = _Priced()
    _price(got, scenarios, traces, measured, unit, repos, pool, columns, trace_format, keep,
           decode_threshold)
    data = got.frame()
    if data.height == 0:
        raise CalibrationError("no step has both a price and a good measured value")
    held: pl.DataFrame | None = None
    split_info: dict[str, Any] | None = None
    if holdout is not None:
        h_traces = list(holdout) if isinstance(holdout, list | tuple) else [holdout]
        h_scen = (scenarios if holdout_scenario is None else
                  list(holdout_scenario) if isinstance(holdout_scenario, list | tuple)
                  else [holdout_scenario])
        if holdout_scenario is None and len(scenarios) > 1 and len(h_traces) != len(scenarios):
            raise CalibrationError(f"{len(h_traces)} holdout trace(s) for {len(scenarios)} "
                                   "scenarios: name the holdout's scenario(s)")
        hp = _Priced()
        _price(hp, h_scen, h_traces, measured, unit, repos, pool, columns, trace_format, [],
               decode_threshold)
        if (hp.model, hp.chip) != (got.model, got.chip):
            raise CalibrationError(f"the holdout is {hp.model} on {hp.chip}, the training "
                                   f"traces {got.model} on {got.chip}")
        held = hp.frame()
        if held.height == 0:
            raise CalibrationError("no holdout step has both a price and a good measured "
                                   "value")
        got.engines |= hp.engines
    elif split_col is not None:
        mask = split_mask(data[split_col].to_numpy(), split_frac)
        if mask.all() or not mask.any():
            raise CalibrationError(f"--split {split}: every step falls on one side "
                                   f"({int(mask.sum())} of {mask.size} held out); there are "
                                   f"{data[split_col].n_unique()} distinct {split_col!r} "
                                   "values")
        held = data.filter(pl.Series(mask))
        data = data.filter(~pl.Series(mask))
        split_info = {"column": split_col, "fraction": split_frac,
                      "held_out_steps": held.height, "fitted_steps": data.height,
                      "held_out_values": int(held[split_col].n_unique()),
                      "fitted_values": int(data[split_col].n_unique()),
                      "hash": "sha256 of the value's text, first 8 bytes / 2^64 < fraction"}
    groups = (data[fold_by].to_numpy() if fold_by and held is None else None)
    try:
        result = fit(data, "measured_ns", folds=folds if held is None else 0, groups=groups,
                     fold_by=fold_by if held is None else None, seed=seed, options=opts,
                     start=start, holdout=held)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    assert got.model is not None and got.chip is not None
    if len(got.rules) > 1:
        raise CalibrationError(f"the scenarios use different rules packs "
                               f"({sorted(got.rules)}): calibrate each separately")
    sources: dict[str, Any] = {
        "traces": got.trace_src, "scenarios": got.scen_src,
        "measured": {"column": measured, "unit": unit, "rejected_steps": got.rejected_steps,
                     "rejected_rows": got.rejected_rows}}
    if holdout is not None:
        sources["holdout"] = {"traces": hp.trace_src, "scenarios": hp.scen_src}
    if split_info:
        sources["split"] = split_info
    doc = calibration_document(
        result, name=name or f"{got.model}-{got.chip}", model=got.model, chip=got.chip,
        priced=data, sources=sources, options=opts, seed=seed,
        engine=_engine(got.engines, engine), rules=next(iter(got.rules), ""),
        layout={"tp": sorted(got.tps), "shapes": got.shapes})
    return from_document(doc)
