"""Calibration from client-side request logs, through the serving replay (issue 32 item 7).

Most users have no per-step measurements, only what their clients saw: per-request TTFT, ITL
and E2E, or the stage aggregates of a load generator (inference-perf). This module fits the
same law as :mod:`.fit` (``docs/calibration.md``) by replaying the logged requests
(:func:`kernel.replay.replay`, ``estimate="calibrated"``) under candidate laws and comparing
what the replay's clients see with what was measured.

* What is fitted (decision RC2): a few law parameters, each shared by the three phase
  classes — ``scale`` (one multiplier on all five resource terms), and optionally
  ``per_request_ns`` (the per-running-request slope) and ``constant_ns``. A log of latencies
  sees the step time only through queueing and token spacing, so finer parameters (one per
  resource and phase) are not identifiable from it.
* The loss (RC3): each compared value's log ratio ``ln(replayed / measured)``, soft-L1
  ``2(√(1 + (z/f)²) − 1)`` with ``f = 0.05`` (quadratic below ~5%, linear above, so a few
  requests stuck behind an outlier do not steer the fit), averaged per metric, then over
  metrics and runs.
* The search (RC4): numpy only. Per parameter, a coarse deterministic grid, the vertex of the
  parabola through the best grid point and its neighbours, then golden-section steps inside
  that bracket; parameters one after the other (coordinate descent). Every evaluation is one
  replay of every run; identical parameter values are replayed once (a cache shared across
  calls, so a leave-one-out over the same runs re-uses the grid replays).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..io.calibration_document import Calibration, CalibrationError, from_document, law_document
from ..io.calibration_identity import kernel_identity, layout_shape, rules_version
from ..model.calibration_law import PHASES, STARTS, Law, PhaseCorrection
from ..replay import read_requests
from ..replay.api import ReplayOptions, replay
from ..replay.simtoreal.metrics import stage_metrics
from ..replay.simtoreal.run import latencies

__all__ = ["GRIDS", "PARAMETERS", "STAGE_METRICS", "RequestRun", "Search", "from_requests",
           "law_for", "measured_per_request", "measured_stages", "request_log_run",
           "soft_l1"]

PARAMETERS = ("scale", "per_request_ns", "constant_ns")
# coarse grids (RC4): scale is geometric, the additive terms in ns
GRIDS: dict[str, tuple[float, ...]] = {
    "scale": tuple(round(0.35 * 1.15 ** i, 6) for i in range(10)),  # 0.35 … 1.23
    "per_request_ns": (-20_000.0, -10_000.0, 0.0, 10_000.0, 20_000.0, 40_000.0),
    "constant_ns": (-2_000_000.0, -1_000_000.0, -500_000.0, 0.0, 500_000.0, 1_000_000.0),
}
IDENTITY = {"scale": 1.0, "per_request_ns": 0.0, "constant_ns": 0.0}
STAGE_METRICS = ("ttft_mean", "itl_mean", "e2e_mean")
REQUEST_METRICS = ("ttft", "itl", "e2e")
SOFT_L1_SCALE = 0.05
_UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def soft_l1(z: np.ndarray, f: float = SOFT_L1_SCALE) -> np.ndarray:
    """The robust loss of a log ratio: ≈ (z/f)² near 0, ≈ 2|z|/f far out."""
    u = np.asarray(z, np.float64) / f
    return 2.0 * (np.sqrt(1.0 + u * u) - 1.0)


def law_for(values: dict[str, float], start: str = "no_overlap") -> Law:
    """The law of the fitted parameters: every phase class the same correction."""
    unknown = sorted(set(values) - set(PARAMETERS))
    if unknown:
        raise CalibrationError(f"unknown request-log parameter(s) {unknown}; "
                               f"allowed: {list(PARAMETERS)}")
    v = {**IDENTITY, **values}
    corr = PhaseCorrection((float(v["scale"]),) * 5, float(v["constant_ns"]),
                           float(v["per_request_ns"]))
    return Law(corr, corr, corr, start)


# -- what was measured ------------------------------------------------------------------------

def _unit_column(df: pl.DataFrame, stem: str) -> tuple[str, float] | None:
    for unit, factor in _UNITS.items():
        name = f"{stem}_{unit}"
        if name in df.columns:
            return name, factor
    return None


def measured_per_request(table: Any, where: str = "the request log") -> pl.DataFrame:
    """request_id and, in ns (float), each of ttft / itl / e2e the log has: columns
    ``ttft_<unit>``, ``itl_<unit>`` (the request's mean time between output tokens),
    ``e2e_<unit>``, unit one of ns, us, ms, s. A log with none of them, without
    ``request_id``, or with a value that is missing, not finite or not > 0 is refused, naming
    the column and row."""
    df = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    if "request_id" not in df.columns:
        raise CalibrationError(f"{where}: no request_id column; a request log needs one to "
                               f"match the replay's requests (have {df.columns})")
    found = {m: _unit_column(df, m) for m in REQUEST_METRICS}
    if not any(found.values()):
        raise CalibrationError(
            f"{where}: no measured latency column; a request log for calibration needs at "
            f"least one of ttft_<unit>, itl_<unit>, e2e_<unit> (unit ns, us, ms or s), "
            f"have {df.columns}")
    cols = [pl.col("request_id").cast(pl.String)]
    for m, hit in found.items():
        if hit is None:
            continue
        name, factor = hit
        vals = df[name].cast(pl.Float64, strict=False).to_numpy()
        bad = ~(np.isfinite(vals) & (vals > 0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise CalibrationError(f"{where}: column {name!r} row {row}: "
                                   f"{df[name][row]!r} is not a measured latency (a finite "
                                   f"number > 0); {int(bad.sum())} such row(s)")
        cols.append((pl.col(name).cast(pl.Float64) * factor).alias(m))
    out = df.select(cols)
    dup = out["request_id"].is_duplicated()
    if dup.any():
        raise CalibrationError(f"{where}: request_id {out['request_id'].filter(dup)[0]!r} "
                               "appears more than once")
    return out


def measured_stages(table: Any, where: str = "the stage aggregates") -> pl.DataFrame:
    """stage_index, metric, actual_ms: an inference-perf run's stage aggregates as the
    sim-to-real study tabulates them (stage −1 is the whole run). Only the metrics of
    :data:`STAGE_METRICS` are compared; a table without them is refused."""
    df = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    need = ["stage_index", "metric", "actual_ms"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CalibrationError(f"{where}: no column {missing}; stage aggregates need "
                               f"{need} (metric one of {list(STAGE_METRICS)}), have {df.columns}")
    out = df.select(pl.col("stage_index").cast(pl.Int64), pl.col("metric").cast(pl.String),
                    pl.col("actual_ms").cast(pl.Float64)).filter(
        pl.col("metric").is_in(list(STAGE_METRICS)))
    if out.height == 0:
        raise CalibrationError(f"{where}: no row of metric {list(STAGE_METRICS)}")
    bad = out.filter(~(pl.col("actual_ms").is_finite() & (pl.col("actual_ms") > 0))
                     | pl.col("actual_ms").is_null())
    if bad.height:
        raise CalibrationError(f"{where}: {bad.height} row(s) whose actual_ms is not a "
                               f"finite number > 0, e.g. {bad.row(0, named=True)}")
    dup = out.filter(pl.struct("stage_index", "metric").is_duplicated())
    if dup.height:  # e.g. several experiments' rows in one file: never averaged silently
        raise CalibrationError(f"{where}: {dup.height} rows repeat a (stage_index, metric), "
                               f"e.g. {dup.row(0, named=True)}; give one run's aggregates")
    return out


# -- one run: a kernel, its requests, what was measured -----------------------------------------

@dataclass
class RequestRun:
    """One measured run to fit on: the kernel that prices it (uncalibrated), the request set
    the replay runs, the replay's options, and either per-request measurements
    (:func:`measured_per_request`) or stage aggregates (:func:`measured_stages`)."""

    label: str
    kernel: Any
    requests: Any                     # a RequestSet
    options: Any = None               # ReplayOptions (estimate is set to "calibrated")
    per_request: pl.DataFrame | None = None
    stages: pl.DataFrame | None = None

    def __post_init__(self) -> None:
        if (self.per_request is None) == (self.stages is None):
            raise CalibrationError(f"run {self.label!r}: give per-request measurements or "
                                   "stage aggregates (one of the two)")


def replay_latencies(run: RequestRun, law: Law, model: str, chip: str) -> pl.DataFrame:
    """The replay of ``run`` under ``law``: per finished request, request_id, stage,
    ttft_ns, e2e_ns, output_tokens."""


    doc = law_document(law, name="request-log-candidate", model=model, chip=chip)
    k = run.kernel.with_calibration(doc, force=True)
    opts = dataclasses.replace(run.options or ReplayOptions(), estimate="calibrated")
    result = replay(k, run.requests, opts)
    lat, _ = latencies(result.requests, run.requests.table)
    return lat


def run_residuals(run: RequestRun, lat: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per compared metric, the log ratios ln(replayed / measured). A request the replay did
    not finish counts as a large error (its measured values against nothing is not allowed
    to vanish: ln 10)."""

    if run.stages is not None:
        pred = stage_metrics(lat)
        joined = run.stages.join(pred.select("stage_index", "metric", "predicted_ms"),
                                 on=["stage_index", "metric"], how="left")
        out: dict[str, np.ndarray] = {}
        for m in STAGE_METRICS:
            sel = joined.filter(pl.col("metric") == m)
            if sel.height == 0:
                continue
            p = sel["predicted_ms"].fill_null(float("nan")).to_numpy()
            a = sel["actual_ms"].to_numpy()
            z = np.log(np.where(np.isfinite(p) & (p > 0), p, a * 10.0) / a)
            out[m] = z
        return out
    assert run.per_request is not None
    pr = lat.select(pl.col("request_id").cast(pl.String),
                    pl.col("ttft_ns").cast(pl.Float64).alias("p_ttft"),
                    pl.col("e2e_ns").cast(pl.Float64).alias("p_e2e"),
                    ((pl.col("e2e_ns") - pl.col("ttft_ns")).cast(pl.Float64)
                     / (pl.col("output_tokens") - 1).cast(pl.Float64)).alias("p_itl"))
    joined = run.per_request.join(pr, on="request_id", how="left")
    out = {}
    for m in REQUEST_METRICS:
        if m not in joined.columns:
            continue
        p = joined[f"p_{m}"].fill_null(float("nan")).to_numpy()
        a = joined[m].to_numpy()
        good = np.isfinite(p) & (p > 0)
        z = np.where(good, np.log(np.where(good, p, 1.0) / a), math.log(10.0))
        if m == "itl":  # single-token requests have no ITL on either side
            z = z[np.isfinite(a)]
        out[m] = z
    return out


def loss_of(residuals: Sequence[dict[str, np.ndarray]]) -> float:
    """Mean over runs of the mean over metrics of the mean soft-L1 loss (RC3)."""
    per_run = []
    for r in residuals:
        vals = [float(soft_l1(z).mean()) for z in r.values() if z.size]
        per_run.append(float(np.mean(vals)) if vals else 0.0)
    return float(np.mean(per_run))


# -- the search ---------------------------------------------------------------------------------

@dataclass
class Search:
    """The evaluations of one fit (parameter values → loss), and the replay cache they share
    with other fits over the same runs (key: run label and parameter values)."""

    cache: dict[tuple[Any, ...], dict[str, np.ndarray]] = field(default_factory=dict)
    evaluations: list[tuple[dict[str, float], float]] = field(default_factory=list)
    replays: int = 0       # replays actually run by this search (cache misses)
    seconds: float = 0.0


def _key(run: RequestRun, values: dict[str, float], start: str) -> tuple[Any, ...]:
    return (run.label, start, *(round(float(values.get(p, IDENTITY[p])), 9)
                                for p in PARAMETERS))


def _evaluate(runs: Sequence[RequestRun], values: dict[str, float], start: str, model: str,
              chip: str, search: Search) -> float:
    res = []
    for run in runs:
        key = _key(run, values, start)
        if key not in search.cache:
            lat = replay_latencies(run, law_for(values, start), model, chip)
            search.cache[key] = run_residuals(run, lat)
            search.replays += 1
        res.append(search.cache[key])
    loss = loss_of(res)
    search.evaluations.append((dict(values), loss))
    return loss


def _vertex(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The minimum of the parabola through three points (None when it opens downwards)."""
    (x0, x1, x2), (y0, y1, y2) = x, y
    den = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
    if not a > 0:
        return None
    return -b / (2 * a)


def search_one(f: Callable[[float], float], grid: Sequence[float], *, log: bool,
               refine: int) -> float:
    """A 1-D minimum: the grid, the parabola's vertex around its best point (in log space for
    a multiplier), then ``refine`` golden-section steps inside the bracket."""
    xs = [math.log(g) if log else float(g) for g in grid]
    back = (lambda u: math.exp(u)) if log else (lambda u: u)
    ys = [f(back(u)) for u in xs]
    i = int(np.argmin(ys))
    best_u, best_y = xs[i], ys[i]
    # the bracket: the best point's neighbours (at the grid's edge, the last interval: the
    # search never leaves the grid, so a minimum beyond it ends at the edge)
    lo, hi = xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]
    v = _vertex(xs[i - 1:i + 2], ys[i - 1:i + 2]) if 0 < i < len(xs) - 1 else None
    if v is not None and lo < v < hi:
        yv = f(back(v))
        if yv < best_y:
            best_u, best_y = v, yv
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    yc = yd = None
    for _ in range(refine):  # one new evaluation per step (the other interior point is kept)
        if yc is None:
            yc = f(back(c))
        if yd is None:
            yd = f(back(d))
        for u, y in ((c, yc), (d, yd)):
            if y < best_y:
                best_u, best_y = u, y
        if yc <= yd:
            b, d, yd = d, c, yc
            c, yc = b - g * (b - a), None
        else:
            a, c, yc = c, d, yd
            d, yd = a + g * (b - a), None
    return back(best_u)


def fit_runs(runs: Sequence[RequestRun], *, parameters: Sequence[str] = ("scale",),
             start: str = "no_overlap", refine: int = 10, sweeps: int = 1,
             grids: dict[str, Sequence[float]] | None = None,
             search: Search | None = None) -> tuple[dict[str, float], Search]:
    """The parameter values minimising the loss over ``runs``, and the search record."""
    if not runs:
        raise CalibrationError("no run to calibrate on")
    if start not in STARTS:
        raise CalibrationError(f"start must be one of {list(STARTS)}, got {start!r}")
    bad = [p for p in parameters if p not in PARAMETERS]
    if bad or not parameters:
        raise CalibrationError(f"parameters must be some of {list(PARAMETERS)}, got "
                               f"{list(parameters)}")
    ident = {(r.kernel.resolved_pool.model_name, r.kernel.resolved_pool.chip_name) for r in runs}
    if len(ident) != 1:
        raise CalibrationError(f"one calibration is for one model and chip; the runs are on "
                               f"{sorted(ident)}")
    (model, chip), = ident
    search = search or Search()
    grids = {**GRIDS, **(grids or {})}
    values = {p: IDENTITY[p] for p in parameters}
    t0 = time.perf_counter()
    _evaluate(runs, values, start, model, chip, search)  # the uncalibrated replay, for RC5
    for _ in range(sweeps):
        for p in parameters:
            def f(x: float, p: str = p) -> float:
                return _evaluate(runs, {**values, p: x}, start, model, chip, search)
            values[p] = search_one(f, grids[p], log=(p == "scale"), refine=refine)
    search.seconds += time.perf_counter() - t0
    return values, search


def from_requests(runs: RequestRun | Sequence[RequestRun], *,
                  parameters: Sequence[str] = ("scale",), start: str = "no_overlap",
                  refine: int = 10, sweeps: int = 1, name: str | None = None,
                  engine: dict[str, Any] | None = None, search: Search | None = None,
                  grids: dict[str, Sequence[float]] | None = None) -> Calibration:
    """Fit the law through the serving replay to measured request latencies (one run or
    several of the same model and chip) and return it as a calibration document
    (:func:`.document.law_document`) recording the engine, the rules pack and the layouts."""

    rs = [runs] if isinstance(runs, RequestRun) else list(runs)
    values, s = fit_runs(rs, parameters=parameters, start=start, refine=refine,
                         sweeps=sweeps, grids=grids, search=search)
    law = law_for(values, start)
    k0 = rs[0].kernel
    ident = kernel_identity(k0)
    shapes: list[dict[str, Any]] = []
    for r in rs:
        sh = layout_shape(r.kernel)
        if sh not in shapes:
            shapes.append(sh)
    tps = sorted({int(r.kernel.resolved_pool.layout.tp) for r in rs})
    start_loss = next((loss for v, loss in s.evaluations
                       if all(v.get(p, IDENTITY[p]) == IDENTITY[p] for p in PARAMETERS)), None)
    best_loss = min(loss for _, loss in s.evaluations)
    fit_block = {
        "method": "request-log replay: coordinate search (grid, parabola vertex, golden "
                  "section) on a soft-L1 loss of log latency ratios",
        "parameters": {p: float(values[p]) for p in parameters},
        "loss": float(best_loss),
        "loss_at_start": None if start_loss is None else float(start_loss),
        "evaluations": len(s.evaluations),
        "replays": s.replays,
        "seconds": round(s.seconds, 3),
        "runs": [{"label": r.label, "requests": int(len(r.requests)),
                  "compared": "per-request" if r.per_request is not None else "stages"}
                 for r in rs],
    }
    improved = start_loss is None or best_loss < start_loss
    extra: dict[str, Any] = {"fit": fit_block, "improved": bool(improved),
                             "created_by": "blis-kernel calibrate --requests"}
    if not improved:
        extra["warning"] = ("the request-log fit did not improve on the uncalibrated replay "
                            f"(loss {best_loss:.6g} against {start_loss:.6g})")
    doc = law_document(law, name=name or f"{ident['model']}-{ident['chip']}-requests",
                       model=ident["model"], chip=ident["chip"],
                       engine=engine, rules=rules_version(k0),
                       layout={"tp": tps, "shapes": shapes}, **extra)
    for p in PHASES:
        doc["phases"][p]["note"] = "request-log fit: one correction for every phase class"
    return from_document(doc)


def request_log_run(kernel: Any, log: str | Path, *, options: Any = None,
                    arrival_unit: str = "s", label: str | None = None) -> RequestRun:
    """A :class:`RequestRun` from a request table (parquet, CSV, JSON lines) that also holds
    measured per-request latencies (:func:`measured_per_request`)."""
    import pyarrow.csv as pacsv  # (heavy: Arrow, loaded only on this path)
    import pyarrow.parquet as pq  # (heavy: Arrow, loaded only on this path)


    path = Path(log)
    if not path.is_file():
        raise CalibrationError(f"{path}: no such request log")
    if path.suffix == ".parquet":
        raw = pq.read_table(path)
    elif path.suffix == ".csv":
        raw = pacsv.read_csv(path)
    else:
        raise CalibrationError(f"{path}: a request log for calibration is .parquet or .csv")
    measured = measured_per_request(raw, str(path))
    reqs = read_requests(path, arrival_unit=arrival_unit, max_model_len=None)
    if reqs.rejects.num_rows:
        first = reqs.rejects.slice(0, 1).to_pylist()[0]
        raise CalibrationError(f"{path}: {reqs.rejects.num_rows} request row(s) cannot be "
                               f"replayed, e.g. row {first.get('row')}: {first.get('reason')}")
    return RequestRun(label or str(path), kernel, reqs, options, per_request=measured)
