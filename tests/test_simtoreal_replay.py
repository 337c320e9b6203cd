"""A sim-to-real experiment replayed end to end on a shortened load (stages of 1% of their
length, the same rates): the glue between the catalogue, the request generator, the replay
and the study's metrics."""

from __future__ import annotations

import polars as pl
import pytest

from kernel.replay.simtoreal.catalogue import experiments
from kernel.replay.simtoreal.metrics import compare
from kernel.replay.simtoreal.run import run_experiment
from kernel.replay.simtoreal.study import METRICS, load_measured


@pytest.fixture(scope="module")
def general_run():  # experiment 16: Llama-3.1-8B on one H100, general (8 then 20 req/s)
    exp = next(e for e in experiments() if e.exp_id == 16)
    return exp, run_experiment(exp, duration_scale=0.01)


def test_every_request_of_the_load_finishes_and_is_counted(general_run) -> None:
    _, run = general_run
    # inference-perf sends int(rate × duration) per stage: 8 × 6 + 20 × 6
    assert run.requests_in == 168
    assert run.finished == run.requests_in and run.not_finished == {}
    counts = {r["stage_index"]: r["requests"] for r in run.predicted.iter_rows(named=True)}
    assert counts == {0: 48, 1: 120, -1: 168}
    assert run.seconds > 0 and run.cpu_seconds > 0


def test_whole_run_metrics_agree_with_the_replays_own_summary(general_run) -> None:
    _, run = general_run
    whole = {r["metric"]: r["predicted_ms"]
             for r in run.predicted.filter(pl.col("stage_index") == -1).iter_rows(named=True)}
    assert set(whole) == set(METRICS)
    # the replay summarises the same finished requests in seconds
    assert whole["ttft_mean"] == pytest.approx(run.summary["ttft_s_mean"] * 1e3, rel=1e-9)
    assert whole["e2e_mean"] == pytest.approx(run.summary["e2e_s_mean"] * 1e3, rel=1e-9)
    assert whole["e2e_p99"] == pytest.approx(run.summary["e2e_s_p99"] * 1e3, rel=1e-9)
    # every request generates its 248 tokens after a first one: E2E - TTFT = 247 ITLs
    assert whole["itl_mean"] == pytest.approx((whole["e2e_mean"] - whole["ttft_mean"]) / 247)
    assert 0 < whole["ttft_mean"] <= whole["ttft_p90"] <= whole["ttft_p99"]
    assert whole["ttft_p99"] < whole["e2e_mean"]


def test_a_higher_rate_stage_is_never_faster(general_run) -> None:
    _, run = general_run
    m = {(r["stage_index"], r["metric"]): r["predicted_ms"]
         for r in run.predicted.iter_rows(named=True)}
    # stage 1 runs 20 req/s against stage 0's 8: more requests share each decode step
    assert m[(1, "itl_mean")] >= m[(0, "itl_mean")]


def test_the_run_scores_against_the_measured_rows(general_run) -> None:
    _, run = general_run
    errors = compare(run.predicted.drop("requests"), load_measured())
    assert errors.height == 3 * len(METRICS)
    assert errors["mape"].min() >= 0  # type: ignore[operator]
