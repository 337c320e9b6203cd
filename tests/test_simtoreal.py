"""The sim-to-real scoring (issue 29 item 5): the study's extracts, the experiment catalogue,
the metrics as the study computes them, the comparison and the tables. The replay itself is
exercised in tests/test_simtoreal_replay.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.replay.simtoreal import catalogue as cat
from kernel.replay.simtoreal.metrics import compare, itl_mean, stage_metrics, summary_mape
from kernel.replay.simtoreal.report import medians_table, per_experiment_table, runtime_table
from kernel.replay.simtoreal.run import latencies, scaled_workload
from kernel.replay.simtoreal.study import (
    METRICS,
    StudyError,
    extract_study,
    load_experiments,
    load_measured,
    load_runtime,
    load_simulators,
    study_dir,
)

# ---------------------------------------------------------------- the study's extracts

RECORD_HEADER = ("simulator,experiment_folder,model,workload,stage_index,metric_name,predicted,"
                 "actual,mape,mpe,absolute_error,exp_id,hardware,dp,cpu_offload,gpu_mem_util,"
                 "precision,tp,max_num_batched_tokens")


def _record(sim: str, exp: int, stage: int, metric: str, pred: float, act: float,
            dp: str = "") -> str:
    err = (pred - act) / act * 100
    return (f"{sim},/home/someone/gt/{exp}-m-tp1-general,org/M,general,{stage},{metric},{pred},"
            f"{act},{abs(err)},{err},{abs(pred - act)},{exp},H100,{dp},False,0.9,FP16,1,2048")


def _study(tmp: Path, rows: list[str]) -> Path:
    (tmp / "results_iter36").mkdir(parents=True)
    (tmp / "results").mkdir()
    (tmp / "results_iter36" / "error_records.csv").write_text(
        "\n".join([RECORD_HEADER] + rows) + "\n")
    (tmp / "results" / "runtime.csv").write_text(
        "simulator,experiment_folder,model,workload,wall_clock_seconds,exp_id\n"
        "a,/x/7-m,org/M,general,1.5,7.0\nb,/x/7-m,org/M,general,2.5,7.0\n")
    return tmp


def test_extract_keeps_one_measured_value_per_row_and_the_folder_name(tmp_path: Path) -> None:
    rows = [_record("a", 7, -1, "e2e_mean", 110.0, 100.0),
            _record("b", 7, -1, "e2e_mean", 90.0, 100.0),
            _record("a", 7, 0, "ttft_mean", 12.0, 10.0)]
    out = tmp_path / "out"
    extract_study(_study(tmp_path / "study", rows), out)
    exp = load_experiments(out)
    assert exp.height == 1 and exp["folder"][0] == "7-m-tp1-general"  # the local path dropped
    assert exp["dp"][0] == 1  # an unstated dp is one engine
    measured = load_measured(out)
    assert measured.height == 2  # the two simulators' e2e_mean row counts once
    assert load_simulators(out).height == 3
    rt = load_runtime(out)
    assert rt["exp_id"].to_list() == [7, 7] and rt["seconds"].to_list() == [1.5, 2.5]


def test_extract_refuses_simulators_disagreeing_on_the_measured_value(tmp_path: Path) -> None:
    rows = [_record("a", 7, -1, "e2e_mean", 110.0, 100.0),
            _record("b", 7, -1, "e2e_mean", 90.0, 101.0)]
    with pytest.raises(StudyError, match="disagree on the measured value of experiment 7"):
        extract_study(_study(tmp_path / "study", rows), tmp_path / "out")


def test_extract_refuses_an_unknown_metric_and_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="unknown metric_name"):
        extract_study(_study(tmp_path / "s1", [_record("a", 7, -1, "tpot_mean", 1.0, 1.0)]),
                      tmp_path / "o1")
    with pytest.raises(StudyError, match="no such file"):
        extract_study(tmp_path / "nowhere", tmp_path / "o2")


def test_loading_a_damaged_extract_names_the_file_and_column(tmp_path: Path) -> None:
    (tmp_path / "measured.csv").write_text("exp_id,stage_index,metric,actual_ms\n2,-1,e2e_mean,\n")
    with pytest.raises(StudyError, match=r"measured.csv: empty values in \['actual_ms'\]"):
        load_measured(tmp_path)
    (tmp_path / "measured.csv").write_text("exp_id,stage_index,metric\n2,-1,e2e_mean\n")
    with pytest.raises(StudyError, match="no column 'actual_ms'"):
        load_measured(tmp_path)


def test_the_embedded_extract_holds_the_studys_38_experiments() -> None:
    exp = load_experiments()
    assert exp.height == 38
    assert sorted(exp["hardware"].unique().to_list()) == ["A100-80GB", "H100", "L40S"]
    assert exp.group_by("hardware").len().sort("hardware")["len"].to_list() == [4, 32, 2]
    measured = load_measured()
    whole = measured.filter(pl.col("stage_index") == -1)
    # every experiment has its whole-run value of each of the seven metrics
    assert whole.height == 38 * len(METRICS)


def test_the_embedded_extract_gives_the_studys_headline_medians() -> None:
    # the study's figure captions: BLIS trained-physics, median over 38 experiments
    med = summary_mape(load_simulators()).filter(pl.col("simulator") == "blis-trained-physics")
    got = {r["metric"]: (round(r["median_mape"], 1), r["experiments"])
           for r in med.iter_rows(named=True)}
    assert got["itl_mean"] == (6.5, 38)
    assert got["e2e_mean"] == (6.8, 38)
    assert got["ttft_mean"] == (18.4, 38)
    # and its Table 1 runtime: BLIS median 5.7 s per experiment
    rt = load_runtime().filter(pl.col("simulator") == "blis-trained-physics")["seconds"]
    assert round(float(rt.median()), 1) == 5.7  # type: ignore[arg-type]


# ---------------------------------------------------------------- the catalogue

def test_every_experiment_resolves_to_a_scenario_and_a_workload() -> None:
    exps = cat.experiments()
    assert len(exps) == 38
    for e in exps:
        assert cat.scenario_path(e).is_file(), e.scenario
        assert e.stages and all(s.rate > 0 and s.duration > 0 for s in e.stages)
    # the limits the study sweeps reach the scenario; the rest are the stated engine block
    one = next(e for e in exps if e.exp_id == 23)
    doc = list(yaml.safe_load_all(cat.scenario_path(one).read_text()))[1]
    engine = doc["pools"][0]["engine"]
    assert engine["max_num_batched_tokens"] == 8192 and engine["max_num_seqs"] == 128
    assert engine["enable_prefix_caching"] is True and engine["block_size"] == 16


def test_committed_scenarios_are_what_the_catalogue_renders(tmp_path: Path) -> None:
    written = cat.write_scenarios(tmp_path)
    committed = sorted(p.name for p in (study_dir() / "scenarios").glob("*.yaml"))
    assert sorted(p.name for p in written.values()) == committed
    for path in written.values():
        assert path.read_text() == (study_dir() / "scenarios" / path.name).read_text(), path.name


@pytest.mark.parametrize("exp_id", [16, 36, 49, 54])  # H100, A100, Mixtral-8x22B TP8, L40S
def test_scenarios_open_and_carry_the_experiments_deployment(exp_id: int) -> None:
    e = next(x for x in cat.experiments() if x.exp_id == exp_id)
    k = kernel.open(cat.scenario_path(e))
    pool = k.deployment()
    assert pool.parallel.tp == e.tp
    assert pool.engine.max_num_batched_tokens == e.max_num_batched_tokens
    assert pool.engine.gpu_memory_utilization == e.gpu_memory_utilization
    assert k.kv_capacity().num_blocks > 0


def _catalogue_copy(tmp: Path) -> Path:
    for f in ("catalogue.yaml", "experiments.csv"):
        (tmp / f).write_text((study_dir() / f).read_text())
    (tmp / "workloads").mkdir()
    for f in (study_dir() / "workloads").glob("*.yaml"):
        (tmp / "workloads" / f.name).write_text(f.read_text())
    return tmp


def test_an_experiment_the_catalogue_cannot_price_is_named(tmp_path: Path) -> None:
    root = _catalogue_copy(tmp_path)
    doc = yaml.safe_load((root / "catalogue.yaml").read_text())
    del doc["models"]["Qwen/Qwen3-14B"]
    (root / "catalogue.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(cat.CatalogueError, match=r"no `models` entry for 'Qwen/Qwen3-14B', "
                                                 r"needed by experiment 13"):
        cat.experiments(root)


def test_a_bad_workload_file_is_refused_with_its_key(tmp_path: Path) -> None:
    root = _catalogue_copy(tmp_path)
    wl = root / "workloads" / "general.yaml"
    doc = yaml.safe_load(wl.read_text())
    doc["load"]["stages"][1]["rate"] = 0
    wl.write_text(yaml.safe_dump(doc))
    with pytest.raises(cat.CatalogueError, match=r"general.yaml: load.stages\[1\] needs a "
                                                 r"positive rate"):
        cat.load_catalogue(root)
    doc["load"]["stages"][1]["rate"] = 20.0
    doc["data"]["shared_prefix"]["output_len"] = 0
    wl.write_text(yaml.safe_dump(doc))
    with pytest.raises(cat.CatalogueError, match="shared_prefix.output_len must be a positive"):
        cat.load_catalogue(root)


def test_scaling_a_workload_shortens_stages_only() -> None:
    e = next(x for x in cat.experiments() if x.exp_id == 16)
    short = scaled_workload(e.workload_config, 0.01)
    assert [s["rate"] for s in short["load"]["stages"]] == [8.0, 20.0]
    assert [s["duration"] for s in short["load"]["stages"]] == [6.0, 6.0]
    assert [s["duration"] for s in e.workload_config["load"]["stages"]] == [600, 600]
    with pytest.raises(StudyError, match="duration_scale must be > 0"):
        scaled_workload(e.workload_config, 0.0)


# ---------------------------------------------------------------- the metrics

def test_itl_is_the_studys_decode_time_per_token() -> None:
    # the means of inference-perf's stage_0 report of inference-sim/training
    # 20260218-150956-codellama-34b-tp2-codegen (experiment 2): request_latency,
    # time_to_first_token (s) and output_len; the study's measured itl_mean for that stage
    got = itl_mean(3.610361284431691 * 1000, 0.04445823927534123 * 1000, 249.37266666666667)
    want = load_measured().filter((pl.col("exp_id") == 2) & (pl.col("stage_index") == 0)
                                  & (pl.col("metric") == "itl_mean"))["actual_ms"][0]
    assert got == pytest.approx(want, rel=1e-12)
    assert np.isnan(itl_mean(10.0, 5.0, 1.0))


def _lat(stage: list[int], ttft_ms: list[float], e2e_ms: list[float],
         out: list[int]) -> pl.DataFrame:
    return pl.DataFrame({"stage": stage, "ttft_ns": [int(t * 1e6) for t in ttft_ms],
                         "e2e_ns": [int(t * 1e6) for t in e2e_ms], "output_tokens": out})


def test_stage_metrics_by_stage_and_whole_run() -> None:
    lat = _lat([0, 0, 1, 1], [10, 30, 100, 100], [110, 130, 300, 500], [11, 11, 21, 21])
    m = stage_metrics(lat)
    get = {(r["stage_index"], r["metric"]): r["predicted_ms"] for r in m.iter_rows(named=True)}
    assert get[(0, "ttft_mean")] == 20.0 and get[(1, "e2e_mean")] == 400.0
    assert get[(0, "itl_mean")] == pytest.approx((120 - 20) / 10)
    assert get[(1, "itl_mean")] == pytest.approx((400 - 100) / 20)
    assert get[(-1, "e2e_mean")] == pytest.approx(260.0)
    assert get[(-1, "itl_mean")] == pytest.approx((260 - 60) / 15)
    # linear percentiles: stage 1's E2E are 300 and 500
    assert get[(1, "e2e_p90")] == pytest.approx(480.0)
    assert get[(1, "e2e_p99")] == pytest.approx(498.0)
    counts = {(r["stage_index"]): r["requests"] for r in m.iter_rows(named=True)}
    assert counts == {0: 2, 1: 2, -1: 4}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**9), st.integers(2, 2000)),
                min_size=1, max_size=40),
       st.integers(1, 50_000_000))
def test_itl_recovers_a_constant_decode_step(reqs: list[tuple[int, int, int]], step_ns: int
                                             ) -> None:
    # every request decodes at the same step: e2e = ttft + (out - 1) * step
    lat = pl.DataFrame({"stage": [r[0] for r in reqs], "ttft_ns": [r[1] for r in reqs],
                        "e2e_ns": [r[1] + (r[2] - 1) * step_ns for r in reqs],
                        "output_tokens": [r[2] for r in reqs]})
    itl = stage_metrics(lat).filter(pl.col("metric") == "itl_mean")["predicted_ms"]
    assert np.allclose(itl.to_numpy(), step_ns / 1e6, rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**8), st.integers(0, 10**9)), min_size=1,
                max_size=50))
def test_percentiles_are_ordered_and_within_the_sample(pairs: list[tuple[int, int]]) -> None:
    lat = pl.DataFrame({"stage": [0] * len(pairs), "ttft_ns": [p[0] for p in pairs],
                        "e2e_ns": [p[0] + p[1] for p in pairs], "output_tokens": [5] * len(pairs)})
    m = {r["metric"]: r["predicted_ms"] for r in stage_metrics(lat).filter(
        pl.col("stage_index") == -1).iter_rows(named=True)}
    eps = 1e-9
    for name, values in (("ttft", [p[0] for p in pairs]), ("e2e", [p[0] + p[1] for p in pairs])):
        lo, hi = min(values) / 1e6, max(values) / 1e6
        assert lo - eps <= m[f"{name}_mean"] <= hi + eps
        assert lo - eps <= m[f"{name}_p90"] <= m[f"{name}_p99"] + eps <= hi + 2 * eps


def test_bad_latencies_are_refused() -> None:
    with pytest.raises(StudyError, match="no column"):
        stage_metrics(pl.DataFrame({"stage": [0], "ttft_ns": [1]}))
    with pytest.raises(StudyError, match="no finished request"):
        stage_metrics(_lat([], [], [], []))
    with pytest.raises(StudyError, match="E2E below the TTFT"):
        stage_metrics(_lat([0], [10], [5], [3]))


def test_compare_gives_the_studys_mape_and_signed_error() -> None:
    pred = pl.DataFrame({"exp_id": [2, 2], "stage_index": [-1, 0],
                         "metric": ["e2e_mean", "e2e_mean"], "predicted_ms": [3350.0, 3800.0]})
    got = compare(pred, load_measured())
    actual = got["actual_ms"].to_list()
    assert got["mpe"].to_list() == pytest.approx([(3350 / actual[0] - 1) * 100,
                                                  (3800 / actual[1] - 1) * 100])
    assert got["mape"].to_list() == pytest.approx([abs(x) for x in got["mpe"].to_list()])
    orphan = pred.with_columns(pl.lit(999).alias("exp_id"))
    with pytest.raises(StudyError, match="2 predictions have no measured value"):
        compare(orphan, load_measured())


# ---------------------------------------------------------------- the replay's tables

def test_latencies_from_either_column_style_and_counts_the_unfinished() -> None:
    inp = pl.DataFrame({"request_id": ["0", "1", "2"], "stage": [0, 1, 1],
                        "output_tokens": [4, 5, 6]})
    direct = pl.DataFrame({"request_id": ["0", "1", "2"], "ttft_ns": [5, 7, 0],
                           "e2e_ns": [50, 70, 0], "status": ["finished", "finished", "rejected"],
                           "reason": [None, None, "longer than max_model_len"]})
    lat, missing = latencies(direct, inp)
    assert lat["request_id"].to_list() == ["0", "1"] and lat["stage"].to_list() == [0, 1]
    assert missing == {"rejected: longer than max_model_len": 1}
    instants = pl.DataFrame({"request_id": ["0", "1"], "arrival_ns": [100, 200],
                             "first_token_ns": [105, 207], "finish_ns": [150, 270]})
    lat2, none = latencies(instants, inp)
    assert lat2["ttft_ns"].to_list() == [5, 7] and lat2["e2e_ns"].to_list() == [50, 70]
    assert none == {}
    with pytest.raises(StudyError, match="not in the request set"):
        latencies(pl.DataFrame({"request_id": ["9"], "ttft_ns": [1], "e2e_ns": [2]}), inp)
    with pytest.raises(StudyError, match="need ttft_ns and e2e_ns"):
        latencies(pl.DataFrame({"request_id": ["0"], "ttft_ns": [1]}), inp)


def _errors(rows: list[tuple[int, str, float]]) -> pl.DataFrame:
    return pl.DataFrame({"exp_id": [r[0] for r in rows], "stage_index": [-1] * len(rows),
                         "metric": [r[1] for r in rows], "mape": [abs(r[2]) for r in rows],
                         "mpe": [r[2] for r in rows]})


def test_tables_compare_on_the_same_experiments_only() -> None:
    ours = _errors([(16, "ttft_mean", 10.0), (16, "itl_mean", -4.0), (16, "e2e_mean", 3.0),
                    (22, "ttft_mean", 30.0), (22, "itl_mean", 2.0), (22, "e2e_mean", -1.0)])
    sims = load_simulators()
    table = medians_table(ours, sims)
    lines = table.splitlines()
    assert lines[0].startswith("| simulator | experiments | ttft_mean")
    ours_line = next(x for x in lines if x.startswith("| blis-kernel replay"))
    assert "| 2 | 20.0% |" in ours_line  # median of 10 and 30 over our two experiments
    blis = sims.filter((pl.col("simulator") == "blis-trained-physics")
                       & pl.col("exp_id").is_in([16, 22]) & (pl.col("stage_index") == -1)
                       & (pl.col("metric") == "ttft_mean"))["mape"]
    blis_line = next(x for x in lines if x.startswith("| blis-trained-physics"))
    assert f"| 2 | {float(blis.median()):.1f}% |" in blis_line  # type: ignore[arg-type]
    per = per_experiment_table(ours, sims, cat.experiments())
    assert "| 16 | llama-3.1-8b-instruct | H100 | 1 | 2048 | 0.9 | no | general | +10.0% |" in per
    # several labelled runs side by side: one column each, same rows
    two = medians_table({"a": ours, "b": ours.with_columns(pl.col("mape") * 2)}, sims)
    a_line = next(x for x in two.splitlines() if x.startswith("| a |"))
    b_line = next(x for x in two.splitlines() if x.startswith("| b |"))
    assert "| 2 | 20.0% |" in a_line and "| 2 | 40.0% |" in b_line
    rt = runtime_table(pl.DataFrame({"exp_id": [16, 22], "seconds": [1.0, 3.0]}), load_runtime())
    assert rt.splitlines()[-1].startswith("| median | **2.00** |")


# ---------------------------------------------------------------- inference-sim/training's runs

def _report(e2e_s: float, ttft_s: float, out_mean: float, failed: int = 0) -> dict:
    dist = lambda m: {"mean": m, "p90": m * 1.1, "p99": m * 1.2}  # noqa: E731
    return {"successes": {"latency": {"request_latency": dist(e2e_s),
                                      "time_to_first_token": dist(ttft_s)},
                          "output_len": {"mean": out_mean}},
            "failures": {"count": failed}}


def _run_dir(root: Path, name: str, summary: dict, stages: list[dict]) -> None:
    import json

    d = root / "default_args" / name
    (d / "results").mkdir(parents=True)
    (d / "exp-config.yaml").write_text("model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\n"
                                       "max_model_len: 4096\nmax_num_batched_tokens: 2048\n"
                                       "max_num_seqs: 128\napp: inference-perf\n")
    (d / "results" / "summary_lifecycle_metrics.json").write_text(json.dumps(summary))
    for i, st_ in enumerate(stages):
        (d / "results" / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(st_))


def test_training_runs_become_experiments_unless_studied_or_overloaded(tmp_path: Path) -> None:
    from kernel.replay.simtoreal.training import FIRST_ID, extract_training

    out = tmp_path / "out"
    out.mkdir()
    # a study with one experiment (7) whose whole-run values a training run repeats
    (out / "measured.csv").write_text(
        "exp_id,stage_index,metric,actual_ms\n"
        "7,-1,e2e_mean,2000.0\n7,-1,ttft_mean,30.0\n")
    root = tmp_path / "training"
    _run_dir(root, "20260101-000000-llama-2-7b-tp1-general", _report(1.5, 0.02, 101.0),
             [_report(1.0, 0.01, 101.0), _report(2.0, 0.03, 101.0)])
    _run_dir(root, "20260101-000001-llama-2-7b-tp1-codegen", _report(2.0, 0.03, 50.0), [])
    _run_dir(root, "20260101-000002-llama-2-7b-tp1-reasoning",
             _report(9.0, 5.0, 1400.0, failed=12), [])
    got = extract_training(root, out)
    assert got["left_out"] == {"20260101-000001-llama-2-7b-tp1-codegen": "study experiment 7",
                               "20260101-000002-llama-2-7b-tp1-reasoning":
                                   "12 failed requests (overloaded)"}
    exp = load_experiments(out, "training")
    assert exp["exp_id"].to_list() == [FIRST_ID] and exp["workload"][0] == "general"
    m = load_measured(out, "training")
    get = {(r["stage_index"], r["metric"]): r["actual_ms"] for r in m.iter_rows(named=True)}
    assert set(get) == {(s, x) for s in (-1, 0, 1) for x in METRICS}
    assert get[(0, "e2e_mean")] == 1000.0 and get[(1, "ttft_p99")] == pytest.approx(36.0)
    assert get[(-1, "itl_mean")] == pytest.approx((1500 - 20) / 100)


def test_the_embedded_training_runs_and_the_unknown_set() -> None:
    exps = cat.experiments(which="training")
    # 16 runs: 7 are study experiments 2-11, 4 failed requests (overloaded)
    assert [(e.exp_id, e.model, e.workload) for e in exps] == [
        (101, "llama-2-7b-hf", "codegen"), (102, "llama-2-7b-hf", "roleplay"),
        (104, "llama-2-70b-hf", "general"), (106, "llama-2-7b-hf", "general"),
        (113, "codellama-34b-instruct-hf", "general")]
    assert all(cat.scenario_path(e).is_file() for e in exps)
    assert len(cat.experiments(which="all")) == 43
    with pytest.raises(StudyError, match="unknown experiment set 'nope'"):
        load_measured(which="nope")
