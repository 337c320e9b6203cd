"""Request-log calibration (issue 32 item 7): a synthetic log replayed with a known law is
recovered, logs without what the fit needs are refused, and the result is a calibration
document that passes the identity checks."""

from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
import kernel.calibration
from kernel.calibration import CalibrationError
from kernel.calibration.requests_fit import (
    GRIDS,
    RequestRun,
    from_requests,
    law_for,
    measured_per_request,
    measured_stages,
    replay_latencies,
    request_log_run,
    search_one,
    soft_l1,
)
from kernel.io.calibration_document import from_document
from kernel.replay import ReplayOptions, generate, inference_perf_spec, write_requests
from kernel.replay.simtoreal.catalogue import experiments, scenario_path
from kernel.replay.simtoreal.metrics import stage_metrics
from kernel.replay.simtoreal.run import scaled_workload

TRUE_SCALE = 0.7


@pytest.fixture(scope="module")
def setup():
    exp = next(e for e in experiments() if e.exp_id == 16)  # Llama-3.1-8B, H100, TP 1
    k = kernel.open(scenario_path(exp))
    reqs = generate(inference_perf_spec(scaled_workload(exp.workload_config, 0.01)), seed=3)
    probe = RequestRun("probe", k, reqs, ReplayOptions(),
                       stages=pl.DataFrame({"stage_index": [-1], "metric": ["itl_mean"],
                                            "actual_ms": [1.0]}))
    model, chip = k.resolved_pool.model_name, k.resolved_pool.chip_name
    truth = replay_latencies(probe, law_for({"scale": TRUE_SCALE}), model, chip)
    return k, reqs, truth


def _log(tmp_path, reqs, truth, columns=("ttft", "e2e")):
    path = tmp_path / "log.parquet"
    write_requests(reqs, path)
    t = pq.read_table(path)
    lat = truth.select(pl.col("request_id"), (pl.col("ttft_ns") / 1e6).alias("ttft_ms"),
                       (pl.col("e2e_ns") / 1e6).alias("e2e_ms"),
                       ((pl.col("e2e_ns") - pl.col("ttft_ns"))
                        / (pl.col("output_tokens") - 1)).alias("itl_ns"))
    ids = t["request_id"].to_pylist()
    by_id = {r["request_id"]: r for r in lat.iter_rows(named=True)}
    names = {"ttft": "ttft_ms", "e2e": "e2e_ms", "itl": "itl_ns"}
    for c in columns:
        t = t.append_column(names[c], pa.array([by_id[i][names[c]] for i in ids], pa.float64()))
    pq.write_table(t, path)
    return path


def _means(lat: pl.DataFrame) -> tuple[float, float]:
    m = stage_metrics(lat).filter(pl.col("stage_index") == -1)
    d = dict(zip(m["metric"], m["predicted_ms"], strict=True))
    return d["ttft_mean"], d["itl_mean"]


def test_a_log_replayed_with_a_known_law_is_recovered(setup, tmp_path):
    k, reqs, truth = setup
    run = request_log_run(k, _log(tmp_path, reqs, truth), arrival_unit="ns")
    cal = from_requests(run)
    scale = cal.document["fit"]["parameters"]["scale"]
    assert scale == pytest.approx(TRUE_SCALE, rel=0.02)
    # every phase class carries it, on all five terms, from NoOverlap
    assert cal.law.start == "no_overlap"
    for p in ("prefill", "decode", "mixed"):
        assert cal.law.phase(p).multipliers == (scale,) * 5
    # the recovered law replays the log's TTFT and ITL to within 2%
    again = replay_latencies(run, cal.law, cal.model, cal.chip)
    ttft, itl = _means(again)
    ttft0, itl0 = _means(truth)
    assert ttft == pytest.approx(ttft0, rel=0.02)
    assert itl == pytest.approx(itl0, rel=0.02)
    fit = cal.document["fit"]
    assert fit["loss"] < fit["loss_at_start"] and cal.document["improved"] is True
    assert fit["replays"] >= fit["evaluations"] - 1 >= 10  # the cost is stated, not hidden


def test_stage_aggregates_are_recovered_too(setup):
    k, reqs, truth = setup
    measured = stage_metrics(truth).rename({"predicted_ms": "actual_ms"})
    run = RequestRun("stages", k, reqs, ReplayOptions(),
                     stages=measured_stages(measured))
    cal = kernel.calibration.from_requests(run)  # the package's entry point
    assert cal.document["fit"]["parameters"]["scale"] == pytest.approx(TRUE_SCALE, rel=0.02)
    ttft, itl = _means(replay_latencies(run, cal.law, cal.model, cal.chip))
    ttft0, itl0 = _means(truth)
    assert itl == pytest.approx(itl0, rel=0.02)
    assert ttft == pytest.approx(ttft0, rel=0.02)


def test_the_document_passes_the_identity_checks(setup, tmp_path):
    k, reqs, truth = setup
    run = request_log_run(k, _log(tmp_path, reqs, truth, ("itl",)), arrival_unit="ns")
    cal = from_requests(run, refine=0, engine={"name": "vllm", "version": "0.15.1",
                                               "stated_by": "test"})
    doc = yaml.safe_load(cal.to_yaml())
    back = from_document(doc)
    assert back.law == cal.law
    assert doc["engine"]["name"] == "vllm" and doc["layout"]["tp"] == [1]
    # the same deployment takes it; the priced step uses it
    kc = k.with_calibration(doc, engine="vllm:0.15.1")
    assert kc.calibration is not None and kc.calibration.name == cal.name
    # another engine, or another chip, is refused naming what differs
    with pytest.raises(CalibrationError, match="engine"):
        k.with_calibration(doc, engine="sglang")
    other = next(e for e in experiments() if e.chip != "h100" and e.model == "llama-3.1-8b-instruct")
    with pytest.raises(CalibrationError, match="chip"):
        kernel.open(scenario_path(other)).with_calibration(doc)
    # forced: applied, and the difference is recorded in provenance
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forced = kernel.open(scenario_path(other)).with_calibration(doc, force=True)
    assert any("chip" in f for f in forced.calibration.forced)


def test_logs_without_what_the_fit_needs_are_refused(setup, tmp_path):
    k, reqs, truth = setup
    bare = tmp_path / "bare.parquet"
    write_requests(reqs, bare)
    with pytest.raises(CalibrationError, match=r"no measured latency column.*ttft_<unit>"):
        request_log_run(k, bare, arrival_unit="ns")
    with pytest.raises(CalibrationError, match="request_id"):
        measured_per_request(pl.DataFrame({"ttft_ms": [1.0]}), "x.csv")
    with pytest.raises(CalibrationError, match=r"'e2e_ms' row 1"):
        measured_per_request(pl.DataFrame({"request_id": ["a", "b"], "e2e_ms": [1.0, -2.0]}))
    with pytest.raises(CalibrationError, match="more than once"):
        measured_per_request(pl.DataFrame({"request_id": ["a", "a"], "e2e_ms": [1.0, 2.0]}))
    with pytest.raises(CalibrationError, match="actual_ms"):
        measured_stages(pl.DataFrame({"stage_index": [-1], "metric": ["itl_mean"]}))
    with pytest.raises(CalibrationError, match="no row of metric"):
        measured_stages(pl.DataFrame({"stage_index": [-1], "metric": ["ttft_p90"],
                                      "actual_ms": [3.0]}))
    with pytest.raises(CalibrationError, match="repeat a"):
        measured_stages(pl.DataFrame({"stage_index": [-1, -1], "metric": ["itl_mean"] * 2,
                                      "actual_ms": [3.0, 4.0]}))
    with pytest.raises(CalibrationError, match="one of the two"):
        RequestRun("x", k, reqs)
    with pytest.raises(CalibrationError, match="parameters"):
        from_requests(RequestRun("x", k, reqs, stages=measured_stages(pl.DataFrame(
            {"stage_index": [-1], "metric": ["itl_mean"], "actual_ms": [3.0]}))),
            parameters=("sm",))


def test_soft_l1_is_quadratic_near_zero_and_linear_far_out():
    z = np.array([1e-4, 10.0])
    loss = soft_l1(z)
    assert loss[0] == pytest.approx((1e-4 / 0.05) ** 2, rel=1e-3)
    assert loss[1] == pytest.approx(2 * 10.0 / 0.05, rel=0.01)
    assert soft_l1(np.array([0.0]))[0] == 0.0


def test_the_cli_writes_the_calibration_and_refuses_a_bare_log(setup, tmp_path):
    from kernel.cli import cli as main

    k, reqs, truth = setup
    log = _log(tmp_path, reqs, truth)
    scen = str(scenario_path(next(e for e in experiments() if e.exp_id == 16)))
    out = tmp_path / "cal.yaml"
    r = CliRunner().invoke(main, ["calibrate", "--requests", str(log), "-s", scen,
                                  "--arrival-unit", "ns", "--refine", "0", "--engine",
                                  "vllm:0.15.1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "Calibration" and doc["engine"]["version"] == "0.15.1"
    assert doc["fit"]["parameters"]["scale"] == pytest.approx(TRUE_SCALE, rel=0.05)
    bare = tmp_path / "bare.parquet"
    write_requests(reqs, bare)
    r = CliRunner().invoke(main, ["calibrate", "--requests", str(bare), "-s", scen,
                                  "-o", str(tmp_path / "no.yaml")])
    assert r.exit_code != 0 and "no measured latency column" in r.output
    assert not (tmp_path / "no.yaml").exists()
    r = CliRunner().invoke(main, ["calibrate", "--requests", str(log), str(bare), "-s", scen,
                                  "-o", str(tmp_path / "no.yaml")])
    assert r.exit_code != 0


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.36, max_value=1.22), st.floats(min_value=0.1, max_value=10.0))
def test_the_search_finds_a_bracketed_minimum(best, width):
    """Grid, parabola, golden section: a smooth minimum inside the grid is found to 0.5%,
    and the search never evaluates outside the grid's bracket."""
    seen = []

    def f(x):
        seen.append(x)
        return width * abs(math.log(x / best)) ** 1.5
    grid = GRIDS["scale"]
    found = search_one(f, grid, log=True, refine=10)
    assert found == pytest.approx(best, rel=0.005)
    assert min(seen) >= grid[0] - 1e-12 and max(seen) <= grid[-1] + 1e-12


def test_a_minimum_beyond_the_grid_stops_at_its_edge():
    grid = GRIDS["scale"]
    assert search_one(lambda x: (x - 5.0) ** 2, grid, log=True, refine=10) == pytest.approx(
        grid[-1], rel=0.01)
    assert search_one(lambda x: (x - 0.01) ** 2, grid, log=True, refine=0) == pytest.approx(
        grid[0], rel=1e-12)
