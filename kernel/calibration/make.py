"""``kernel.calibrate``: price measured traces, fit, cross-validate, and write the document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .columns import measured_producer
from .document import VERSION, Calibration, CalibrationError, from_document
from .fit import CONSTANT, FitOptions, FitResult, fit
from .law import PHASES, TERMS
from .measured import BAD_MEASURED, UNITS

__all__ = ["calibrate", "calibration_document"]


def _summary(s: Any) -> dict[str, Any]:
    d = s.as_dict()
    return {k: (int(d[k]) if k == "rows" else _num(d[k])) for k in d}


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(round(x, 6))


def calibration_document(result: FitResult, *, name: str, model: str, chip: str,
                         priced: pl.DataFrame, sources: Mapping[str, Any],
                         options: FitOptions, seed: int) -> dict[str, Any]:
    """The YAML document (``docs/calibration.md``) for a fit."""
    phases: dict[str, Any] = {}
    for p in PHASES:
        pf = result.phases[p]
        by = {t.name: t for t in pf.terms}
        ph: dict[str, Any] = {
            "rows": pf.rows,
            **({"fitted_on": pf.sampled} if pf.sampled else {}),
            "multipliers": {t: float(by[t].value) for t in TERMS},
            "constant_ns": float(by[CONSTANT].value),
            "terms": {t.name: {"status": t.status,
                               "std_error": None if t.std_error is None else
                               float(t.std_error),
                               **({"reason": t.reason} if t.reason else {})}
                      for t in pf.terms},
        }
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
                              "tokens": span("tokens"), "measured_ns": span("measured_ns")}
    if result.fold_by and result.fold_by in priced.columns:
        window["groups"] = sorted(str(v) for v in priced[result.fold_by].unique().to_list())
    doc: dict[str, Any] = {
        "kind": "Calibration",
        "version": VERSION,
        "name": name,
        "model": model,
        "chip": chip,
        "law": ("calibrated_ns = trunc(m_sm*sm_ns + m_hbm*hbm_ns + m_nvlink*nvlink_ns + "
                "m_nic*nic_ns + m_host*host_ns + constant_ns), per phase class"),
        "phases": phases,
        "fit": {"method": "huber-irls non-negative least squares on relative error, weak "
                          "directions pinned to the prior",
                "options": {k: getattr(options, k) for k in
                            ("ridge", "huber_k", "max_iter", "min_share", "min_eigen", "max_std_error",
                             "min_rows", "max_rows")},
                "folds": result.folds, "fold_by": result.fold_by, "seed": seed},
        "window": window,
        "sources": dict(sources),
        "training": _summary(result.training["all"]),
        "held_out": _summary(result.held_out["all"]) if "all" in result.held_out else None,
        "created_by": "blis-kernel",
    }
    return doc


def calibrate(scenario: str | Path | Sequence[str | Path], trace: Any, measured: str, *,
              unit: str = "ns", repos: Any = None, pool: int = 0,
              columns: Mapping[str, str] | None = None, trace_format: str = "requests",
              folds: int = 5, fold_by: str | None = None, name: str | None = None,
              options: FitOptions | None = None, seed: int = 0,
              decode_threshold: int = 1) -> Calibration:
    """Price measured trace(s) on their scenario(s), fit a calibration and cross-validate it.

    ``trace`` is one trace or a list (one per scenario, or several for one scenario);
    ``measured`` names the per-batch column of measured step times in ``unit``
    (ns/us/ms/s). ``fold_by`` names a per-batch column whose values are held out whole
    (e.g. a configuration label); otherwise steps are dealt to ``folds`` folds at random.
    Every scenario must be the same model and chip.
    """
    import kernel
    from kernel.bulk import price_result
    from kernel.stamp import file_sha256

    if unit not in UNITS:
        raise CalibrationError(f"measured unit {unit!r} is not one of {list(UNITS)}")
    traces = list(trace) if isinstance(trace, list | tuple) else [trace]
    scenarios = (list(scenario) if isinstance(scenario, list | tuple) else [scenario])
    if len(scenarios) == 1:
        scenarios = scenarios * len(traces)
    if len(scenarios) != len(traces):
        raise CalibrationError(f"{len(scenarios)} scenarios for {len(traces)} traces: give "
                               "one scenario, or one per trace")
    opts = options or FitOptions()
    parts = []
    model = chip = None
    scen_src: list[dict[str, Any]] = []
    trace_src: list[dict[str, Any]] = []
    rejected_steps = 0  # steps (batches, FPM passes) set aside for their measured value
    rejected_rows = 0
    for scen, tr in zip(scenarios, traces, strict=True):
        k = kernel.open(str(scen), repos, pool)
        r = k.resolved_pool
        if model is None:
            model, chip = r.model_name, r.chip_name
        elif (model, chip) != (r.model_name, r.chip_name):
            raise CalibrationError(f"scenario {str(scen)!r} is {r.model_name} on "
                                   f"{r.chip_name}, the others {model} on {chip}: a "
                                   "calibration is for one model and one chip")
        scen_src.append({"scenario": r.scenario, "pool": pool,
                         "documents": {role: d["sha256"]
                                       for role, d in sorted(k.documents().items())}})
        if trace_format == "fpm":
            from kernel.fpm import fpm_to_requests

            req, batches, fpm_rej = fpm_to_requests(tr, columns=columns)
            rejected_steps += fpm_rej.height
            tr_rows: Any = req.join(batches.select(
                ["batch_id", *[c for c in (measured, fold_by) if c and c in batches.columns]]),
                on="batch_id", how="left")
        elif trace_format == "requests":
            tr_rows = tr
        else:
            raise CalibrationError(f"trace format {trace_format!r} is not one of "
                                   "['requests', 'fpm']")
        # one pricing pass reads the measured column too (bad values -> rejects)
        res = price_result(k, tr_rows, columns=None if trace_format == "fpm" else columns,
                           decode_threshold=decode_threshold,
                           producers=[measured_producer(measured, unit)],
                           keep=[fold_by] if fold_by else None, on_reject="ignore")
        p = res.priced
        rejected_rows += res.counts.rows_rejected
        bad = res.rejects.filter(pl.col("reason") == BAD_MEASURED)
        rejected_steps += bad["batch_id"].n_unique()
        if fold_by:
            p = p.with_columns(pl.col(fold_by).cast(pl.String))
        priced = p
        parts.append(p)
        if isinstance(tr, str | Path):
            trace_src.append({"path": Path(tr).name, "sha256": file_sha256(tr),
                              "steps": priced.height})
        else:
            trace_src.append({"path": "(in memory)", "steps": priced.height})
    data = pl.concat(parts, how="vertical_relaxed")
    if data.height == 0:
        raise CalibrationError("no step has both a price and a good measured value")
    groups = (data[fold_by].to_numpy() if fold_by else None)
    result = fit(data, "measured_ns", folds=folds, groups=groups, fold_by=fold_by, seed=seed,
                 options=opts)
    assert model is not None and chip is not None
    sources = {"traces": trace_src, "scenarios": scen_src,
               "measured": {"column": measured, "unit": unit, "rejected_steps": rejected_steps,
                            "rejected_rows": rejected_rows}}
    doc = calibration_document(result, name=name or f"{model}-{chip}", model=model, chip=chip,
                               priced=data, sources=sources, options=opts, seed=seed)
    return from_document(doc)
