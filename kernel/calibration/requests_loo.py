"""Leave-one-experiment-out on the sim-to-real study, calibrated from its request-level
aggregates (issue 32 item 7; decision RC6).

For each experiment: fit the request-log law (:mod:`.requests_fit`) on the stage aggregates
of the *other* experiments of the same catalog model and chip, replay the left-out one with
it, and score its whole-run TTFT, ITL and E2E means as the study scores its simulators
(:func:`kernel.replay.simtoreal.metrics.compare`). The experiments, scenarios, workloads and
metrics are the ``simtoreal`` helper's (:mod:`kernel.replay.simtoreal`); only the fitting and
the folds are here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ..facade.factory import open as open_kernel
from ..replay import generate, inference_perf_spec
from ..replay.simtoreal.catalogue import scenario_path
from ..replay.simtoreal.metrics import compare, stage_metrics
from ..replay.simtoreal.run import replay_options, scaled_workload
from .requests_fit import (
    GRIDS,
    RequestRun,
    Search,
    fit_runs,
    law_for,
    measured_stages,
    replay_latencies,
)

__all__ = ["Fold", "experiment_run", "groups", "leave_one_out", "score_experiment"]

LOO_METRICS = ("ttft_mean", "itl_mean", "e2e_mean")


@dataclass(frozen=True)
class Fold:
    exp_id: int
    group: str
    trained_on: tuple[int, ...]
    values: dict[str, float]
    scores: pl.DataFrame     # exp_id, stage_index, metric, predicted_ms, actual_ms, mape, mpe
    replays: int             # replays this fold ran (cache misses), fit and score
    seconds: float


def experiment_run(exp: Any, measured: pl.DataFrame, *, duration_scale: float = 1.0,
                   seed: int = 0, kernels: dict[str, Any] | None = None) -> RequestRun:
    """One experiment as a :class:`RequestRun` on its stage aggregates: the scenario's
    kernel, the inference-perf load (stages ``duration_scale`` times as long: a subsample of
    the run at the same rates), the replay options the simtoreal harness uses."""

    path = str(scenario_path(exp))
    cache = kernels if kernels is not None else {}
    if path not in cache:
        cache[path] = open_kernel(path)
    cfg = exp.workload_config if duration_scale == 1.0 else scaled_workload(
        exp.workload_config, duration_scale)
    reqs = generate(inference_perf_spec(cfg), seed=seed)
    rows = measured.filter(pl.col("exp_id") == exp.exp_id)
    return RequestRun(f"exp{exp.exp_id}", cache[path], reqs, replay_options(exp),
                      stages=measured_stages(rows, f"experiment {exp.exp_id}"))


def groups(exps: Iterable[Any]) -> dict[str, list[Any]]:
    """Experiments by (catalog model, chip): the runs one calibration may be fitted on."""
    out: dict[str, list[Any]] = {}
    for e in exps:
        out.setdefault(f"{e.model}@{e.chip}", []).append(e)
    return out


def score_experiment(run: RequestRun, exp_id: int, values: dict[str, float],
                     start: str, measured: pl.DataFrame) -> pl.DataFrame:
    """Replay ``run`` with the fitted law; its whole-run errors on :data:`LOO_METRICS`."""

    model = run.kernel.resolved_pool.model_name
    chip = run.kernel.resolved_pool.chip_name
    lat = replay_latencies(run, law_for(values, start), model, chip)
    pred = stage_metrics(lat).filter((pl.col("stage_index") == -1)
                                     & pl.col("metric").is_in(list(LOO_METRICS)))
    pred = pred.with_columns(pl.lit(exp_id).cast(pl.Int64).alias("exp_id"))
    meas = measured.filter(pl.col("exp_id") == exp_id).with_columns(
        pl.col("exp_id").cast(pl.Int64))
    return compare(pred, meas)


def leave_one_out(exps: Sequence[Any], measured: pl.DataFrame, *,
                  parameters: Sequence[str] = ("scale",), start: str = "no_overlap",
                  refine: int = 0, duration_scale: float = 0.1,
                  grids: dict[str, Sequence[float]] | None = None,
                  only: Iterable[int] | None = None,
                  progress: Any = None) -> list[Fold]:
    """Every experiment (of ``only``, default all) in a group of two or more scored with the
    law fitted on the rest of its group. One replay cache per group, so a grid point is
    replayed once per experiment whatever the number of folds."""
    grids = {**GRIDS, **(grids or {})}
    wanted = set(only) if only is not None else None
    folds: list[Fold] = []
    kernels: dict[str, Any] = {}
    for gname, members in groups(exps).items():
        if len(members) < 2:
            continue
        runs = {e.exp_id: experiment_run(e, measured, duration_scale=duration_scale,
                                         kernels=kernels) for e in members}
        search = Search()
        for e in members:
            if wanted is not None and e.exp_id not in wanted:
                continue
            t0, r0 = time.perf_counter(), search.replays
            others = [runs[o.exp_id] for o in members if o.exp_id != e.exp_id]
            values, _ = fit_runs(others, parameters=parameters, start=start, refine=refine,
                                 grids=grids, search=search)
            scores = score_experiment(runs[e.exp_id], e.exp_id, values, start, measured)
            fold = Fold(e.exp_id, gname, tuple(o.exp_id for o in members
                                               if o.exp_id != e.exp_id),
                        values, scores, search.replays - r0 + 1, time.perf_counter() - t0)
            folds.append(fold)
            if progress is not None:
                progress(fold)
    return folds
