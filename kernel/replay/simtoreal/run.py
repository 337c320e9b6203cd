"""Replaying one sim-to-real experiment: open its scenario, generate its inference-perf load,
replay it, and turn the finished requests into the study's metrics.

The load comes from the ``requests`` part of the replay (``inference_perf_spec`` and
``generate``) and the batches from the ``engine`` part (``replay``), per
``REPLAY_CONTRACT.md``; this module only joins them and times the whole (decision ST8:
the runtime we report per experiment is open + generate + replay + metrics, what the study
times for each simulator).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from kernel.facade.factory import open as open_kernel
from kernel.replay import generate, inference_perf_spec
from kernel.replay.api import replay
from kernel.replay.simtoreal.catalogue import Experiment, scenario_path
from kernel.replay.simtoreal.metrics import stage_metrics
from kernel.replay.simtoreal.study import StudyError
from pipeline.load import Repos

__all__ = ["ExperimentRun", "latencies", "replay_options", "run_experiment", "scaled_workload"]

# the replay's status of a request that produced all its tokens (else "rejected", with a reason)
FINISHED = "finished"


@dataclass(frozen=True)
class ExperimentRun:
    """One experiment replayed: the study's metrics (exp_id, stage_index, metric,
    predicted_ms, requests), the wall-clock seconds, and the request counts
    (in = finished + not finished, with the reasons of the latter), and the replay's summary
    (throughput, prefix hit rate, KV occupancy, preemptions)."""
    exp_id: int
    predicted: pl.DataFrame
    seconds: float
    cpu_seconds: float   # this process's CPU time over the same span (the machine is shared)
    requests_in: int
    finished: int
    not_finished: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def scaled_workload(config: dict[str, Any], duration_scale: float) -> dict[str, Any]:
    """The same load with every stage ``duration_scale`` times as long (rates unchanged): for
    quick runs while developing; the published figures use 1.0."""
    if not duration_scale > 0:
        raise StudyError(f"duration_scale must be > 0, got {duration_scale!r}")
    out = copy.deepcopy(config)
    for stage in out["load"]["stages"]:
        stage["duration"] = stage["duration"] * duration_scale
    return out


def replay_options(exp: Experiment, **overrides: Any) -> Any:
    """Replay options matching the measured engine (decision ST7): vLLM v0.15.1 schedules
    asynchronously by default, as v0.31.0 does, and the engine limits come from the scenario
    (max_num_seqs, max_num_batched_tokens, block size, prefix caching)."""
    from kernel.replay.api import ReplayOptions  # the engine part of the replay

    settings: dict[str, Any] = {"async_scheduling": bool(exp.engine["async_scheduling"])}
    settings.update(overrides)
    return ReplayOptions(**settings)


def _column(table: pa.Table | pl.DataFrame, *names: str) -> str | None:
    cols = table.column_names if isinstance(table, pa.Table) else table.columns
    return next((n for n in names if n in cols), None)


def latencies(requests_out: pa.Table | pl.DataFrame, requests_in: pa.Table | pl.DataFrame
              ) -> tuple[pl.DataFrame, dict[str, int]]:
    """(per finished request: request_id, stage, ttft_ns, e2e_ns, output_tokens; counts of the
    requests that did not finish, by status and reason).

    ``requests_out`` is the replay's per-request table, ``requests_in`` the request set's
    (REQUEST_SCHEMA: its ``stage`` and ``output_tokens``). TTFT and E2E are taken from the
    replay's ``ttft_ns``/``e2e_ns`` when it has them, else from its arrival, first-token and
    finish instants."""
    out = requests_out if isinstance(requests_out, pl.DataFrame) else pl.from_arrow(requests_out)
    inp = requests_in if isinstance(requests_in, pl.DataFrame) else pl.from_arrow(requests_in)
    assert isinstance(out, pl.DataFrame) and isinstance(inp, pl.DataFrame)
    if "request_id" not in out.columns:
        raise StudyError(f"replay requests: no request_id column; have {out.columns}")
    status = _column(out, "status")
    not_finished: dict[str, int] = {}
    if status is not None:
        done = out[status].cast(pl.String) == FINISHED
        rest = out.filter(~done)
        if rest.height:
            reason = _column(rest, "reason")
            labels = rest.select(pl.concat_str(
                [pl.col(status).cast(pl.String),
                 pl.col(reason).cast(pl.String).fill_null("") if reason else pl.lit("")],
                separator=": ").alias("why"))["why"]
            not_finished = {k: int(v) for k, v in
                            zip(*np.unique(labels.to_numpy(), return_counts=True), strict=True)}
        out = out.filter(done)
    ttft, e2e = _column(out, "ttft_ns"), _column(out, "e2e_ns")
    arrival = _column(out, "arrival_ns")
    first, finish = _column(out, "first_token_ns"), _column(out, "finish_ns", "finished_ns")
    if ttft is None or e2e is None:
        if arrival is None or first is None or finish is None:
            raise StudyError("replay requests: need ttft_ns and e2e_ns, or arrival_ns, "
                             f"first_token_ns and finish_ns; have {out.columns}")
    def since_arrival(direct: str | None, instant: str | None) -> pl.Expr:
        if direct is not None:
            return pl.col(direct)
        assert instant is not None and arrival is not None  # checked above
        return pl.col(instant) - pl.col(arrival)

    exprs = [since_arrival(ttft, first).cast(pl.Int64).alias("ttft_ns"),
             since_arrival(e2e, finish).cast(pl.Int64).alias("e2e_ns")]
    lat = out.select(pl.col("request_id").cast(pl.String), *exprs)
    keep = ["request_id", "stage", "output_tokens"]
    missing = [c for c in keep if c not in inp.columns]
    if missing:
        raise StudyError(f"request set: no column {missing}; have {inp.columns}")
    joined = lat.join(inp.select(pl.col("request_id").cast(pl.String), "stage", "output_tokens"),
                      on="request_id", how="left")
    lost = joined.filter(pl.col("stage").is_null())
    if lost.height:
        raise StudyError(f"replay requests: {lost.height} request ids are not in the request "
                         f"set, e.g. {lost['request_id'][0]!r}")
    return joined, not_finished


def run_experiment(exp: Experiment, *, seed: int = 0, duration_scale: float = 1.0,
                   options: dict[str, Any] | None = None,
                   pricing: str | None = None) -> ExperimentRun:
    """Replay ``exp`` uncalibrated on its scenario and compute the study's metrics
    (``pricing``: ``Repos(pricing=...)``, default the kernel's)."""

    t0, c0 = time.perf_counter(), time.process_time()
    k = open_kernel(scenario_path(exp), Repos(pricing=pricing) if pricing else None)
    config = exp.workload_config if duration_scale == 1.0 else scaled_workload(
        exp.workload_config, duration_scale)
    reqs = generate(inference_perf_spec(config), seed=seed)
    result = replay(k, reqs, replay_options(exp, **(options or {})))
    lat, not_finished = latencies(result.requests, reqs.table)
    predicted = stage_metrics(lat).with_columns(pl.lit(exp.exp_id).alias("exp_id"))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return ExperimentRun(exp_id=exp.exp_id,
                         predicted=predicted.select("exp_id", "stage_index", "metric",
                                                    "predicted_ms", "requests"),
                         seconds=seconds, cpu_seconds=cpu, requests_in=reqs.rows_in, finished=lat.height,
                         not_finished=not_finished, summary=dict(getattr(result, "summary", {})))
