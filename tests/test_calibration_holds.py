"""Calibration that holds (issue 32): the law with a per-request slope, a constant of any sign,
its floor and the Overlap start (scalar == columns); tied terms fitted at their combined value;
the loud warning; engine, rules and layout refusal; holdout and split; Splitwise per (hardware,
TP); scenario from a vLLM engine config."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.calibration import CalibrationError, CalibrationWarning, Law, PhaseCorrection
from kernel.calibration.fit import fit
from kernel.calibration.make import calibrate, split_mask
from kernel.calibration.splitwise import price_splitwise, scenario_path, splitwise_trace
from kernel.model.calibration_law import TERMS, calibrated_ns

TERM_COLS = [f"{t}_ns" for t in TERMS]


def predict(law: Law, p: pl.DataFrame) -> np.ndarray:
    return calibrated_ns(law, [p[c].to_numpy() for c in TERM_COLS],
                         p["prefill_requests"].to_numpy(), p["decode_requests"].to_numpy(),
                         p["overlap_ns"].to_numpy())


def decode_trace(n: int, seed: int, max_requests: int = 128) -> pl.DataFrame:
    """Decode-only steps of one deployment: 1..max_requests requests, contexts 16..8191."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_requests + 1, n)
    bid = np.repeat(np.arange(n), sizes)
    ctx = rng.integers(16, 8192, bid.size)
    return pl.DataFrame({"batch_id": bid, "scheduled": np.ones(bid.size, np.int64),
                         "computed": ctx, "prompt_len": ctx + 1})


@pytest.fixture(scope="module")
def k70() -> kernel.Kernel:
    return kernel.open("llama-3.1-70b-h200-tp4")


@pytest.fixture(scope="module")
def h100tp4() -> kernel.Kernel:
    return kernel.open(str(scenario_path("h100-80gb", 4)))


# -- the law ------------------------------------------------------------------------------------

corrections = st.builds(
    lambda m, c, r: PhaseCorrection(tuple(m), c, r),  # type: ignore[arg-type]
    st.lists(st.floats(0, 1e3, allow_nan=False), min_size=5, max_size=5),
    st.floats(-1e12, 1e12, allow_nan=False), st.floats(-1e9, 1e9, allow_nan=False))
laws = st.builds(Law, corrections, corrections, corrections,
                 st.sampled_from(["no_overlap", "overlap"]))
rows = st.lists(st.tuples(*[st.integers(0, 2**50)] * 5, st.integers(0, 3000),
                          st.integers(0, 3000), st.integers(0, 2**52)),
                min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(laws, rows)
def test_law_scalar_equals_columns_with_slope_negative_constant_and_overlap_start(
        law: Law, data: list[tuple[int, ...]]) -> None:
    arr = np.asarray(data, np.int64)
    col = calibrated_ns(law, [arr[:, j] for j in range(5)], arr[:, 5], arr[:, 6], arr[:, 7])
    for i, r in enumerate(data):
        got = calibrated_ns(law, r[:5], r[5], r[6], r[7])
        assert got == int(col[i])
        # the floor: never below the step's largest calibrated resource term
        phase = law.phase("mixed" if r[5] and r[6] else "prefill" if r[5] else "decode")
        top = max(m * float(t) for m, t in zip(phase.multipliers, r[:5], strict=True))
        assert got >= int(top) and got >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 2**40)] * 5, st.integers(0, 50), st.integers(0, 50)),
                min_size=1, max_size=20),
       st.lists(st.floats(0, 10, allow_nan=False), min_size=5, max_size=5),
       st.floats(0, 1e9, allow_nan=False))
def test_a_calibration_written_before_issue_32_prices_as_it_did(
        data: list[tuple[int, ...]], mult: list[float], constant: float) -> None:
    # the earlier law: trunc(Σ m_j·t_j left to right + constant), constant >= 0, no slope
    law = Law(*(PhaseCorrection(tuple(mult), constant),) * 3)  # type: ignore[arg-type]
    for r in data:
        x = 0.0
        for j in range(5):
            x = (float(mult[j]) * float(r[j])) if j == 0 else x + float(mult[j]) * float(r[j])
        assert calibrated_ns(law, r[:5], r[5], r[6]) == int(x + constant)


@settings(max_examples=50, deadline=None)
@given(laws)
def test_a_law_round_trips_through_its_table(law: Law) -> None:
    assert Law.from_table(law.table(), law.start) == law
    with pytest.raises(ValueError, match=r"a law table is \[3, 7\]"):
        Law.from_table(law.table()[:, :6])


def test_identity_law_from_each_start_is_that_estimate(k70: kernel.Kernel) -> None:
    p = k70.price(decode_trace(200, 1))
    for start, col in (("no_overlap", "no_overlap_ns"), ("overlap", "overlap_ns")):
        assert (predict(Law(start=start), p) == p[col].to_numpy()).all()
    with pytest.raises(ValueError, match="starts from Overlap: calibrated_ns needs overlap_ns"):
        calibrated_ns(Law(start="overlap"), [1, 2, 3, 4, 5], 1, 0)


def test_a_huge_negative_constant_stops_at_the_largest_calibrated_term(k70: kernel.Kernel
                                                                       ) -> None:
    p = k70.price(decode_trace(100, 2))
    m = (0.5, 1.5, 2.0, 1.0, 0.7)
    law = Law(decode=PhaseCorrection(m, -1e12, 10.0))  # type: ignore[arg-type]
    got = predict(law, p)
    terms = np.column_stack([p[c].to_numpy().astype(float) * mj
                             for c, mj in zip(TERM_COLS, m, strict=True)])
    assert (got == terms.max(axis=1).astype(np.int64)).all()


def test_scalar_kernel_equals_bulk_for_an_overlap_start_law(h100tp4: kernel.Kernel) -> None:
    law = Law(PhaseCorrection((1.2, 0.7, 1.9, 1.0, 1.0), -3e5, 4e4),
              PhaseCorrection((0.9, 0.9, 0.9, 1.0, 1.0), -2e6, 2.5e4),
              PhaseCorrection((1.1, 1.0, 1.3, 1.0, 0.5), 1e5, -1e3), start="overlap")
    doc = {"kind": "Calibration", "version": 1, "name": "t", "model": "llama-2-70b-hf",
           "chip": "h100", "start": "overlap",
           "phases": {p: {"multipliers": dict(zip(TERMS, c.multipliers, strict=True)),
                          "constant_ns": c.constant_ns, "per_request_ns": c.per_request_ns}
                      for p, c in (("prefill", law.prefill), ("decode", law.decode),
                                   ("mixed", law.mixed))}}
    kc = h100tp4.with_calibration(doc)
    assert kc.calibration is not None and kc.calibration.law == law
    rng = np.random.default_rng(5)
    rows = []
    for b in range(60):
        for _ in range(int(rng.integers(1, 9))):
            pre = b % 3 != 1 and rng.random() < 0.5
            s = int(rng.integers(2, 2048)) if pre else 1
            c = int(rng.integers(0, 4096))
            rows.append((b, s, c, s + c))
    trace = pl.DataFrame(rows, schema=["batch_id", "scheduled", "computed", "prompt_len"],
                         orient="row")
    bulk = kc.price(trace)
    assert (bulk["calibrated_ns"].to_numpy() == predict(law, bulk)).all()
    for bid, grp in trace.group_by("batch_id", maintain_order=True):
        batch = kernel.Batch(list(zip(grp["scheduled"], grp["computed"], grp["prompt_len"],
                                      strict=True)))
        est = kc.step_time(batch)
        assert est.calibrated == bulk.filter(pl.col("batch_id") == bid[0])["calibrated_ns"][0]


# -- the fit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pricing", ["reference", "measured"])
def test_a_known_mix_with_tied_terms_a_negative_constant_and_a_slope_is_recovered(
        pricing: str) -> None:
    # One deployment, decode only: under the reference's laws sm and nvlink are affine in the
    # request count here, so they, the slope and the constant cannot be told apart term by
    # term; the truth gives the terms that move together one multiplier, as a tied fit does.
    # The measured layer prices the all-reduce from a piecewise curve of message size, which
    # can set nvlink apart: then it is fitted on its own, and must still come back as 0.8.
    k70 = kernel.open("llama-3.1-70b-h200-tp4", kernel.Repos(pricing=pricing))
    p = k70.price(decode_trace(3000, 7))
    truth = Law(decode=PhaseCorrection((0.8, 0.8, 0.8, 1.0, 1.0), -400_000.0, 25_000.0))
    y = predict(truth, p)
    assert (y < p["no_overlap_ns"].to_numpy()).mean() > 0.5  # the constant removes time
    result = fit(p.with_columns(pl.Series("measured_ns", y)), folds=0, start="no_overlap")
    dec = result.phases["decode"]
    by = {t.name: t for t in dec.terms}
    tied = [set(g.terms) for g in dec.tied]
    if pricing == "reference":
        assert tied == [{"sm", "hbm", "nvlink"}]
    else:
        assert len(tied) == 1 and {"sm", "hbm"} <= tied[0] <= {"sm", "hbm", "nvlink"}
    assert dec.tied[0].multiplier == pytest.approx(0.8, rel=0.01)
    for name in ("sm", "hbm", "nvlink"):
        if name in dec.tied[0].terms:
            assert by[name].status == "tied" and "share one multiplier" in by[name].reason
        else:
            assert by[name].value == pytest.approx(0.8, rel=0.01)
    assert by["constant"].value == pytest.approx(-400_000.0, rel=0.01)
    assert by["per_request"].value == pytest.approx(25_000.0, rel=0.01)
    assert by["host"].status == "held"  # the same time on every step
    assert result.training["decode"].mape < 1e-4


def test_the_fit_never_goes_below_the_floor_on_its_own_steps(k70: kernel.Kernel) -> None:
    p = k70.price(decode_trace(800, 9))
    t = np.column_stack([p[c].to_numpy().astype(float) for c in TERM_COLS])
    # remove more per-step time than half the steps have beside their largest term: the
    # unbounded fit (multipliers 1, this negative constant) would put them below it
    cut = float(np.median(t.sum(axis=1) - t.max(axis=1)))
    y = t.sum(axis=1) - cut
    assert y.min() > 0
    result = fit(p.with_columns(pl.Series("measured_ns", y)), folds=0, start="no_overlap")
    dec = result.phases["decode"]
    assert dec.floor_bound
    corr = result.law.decode
    terms = np.column_stack([p[c].to_numpy().astype(float) * m
                             for c, m in zip(TERM_COLS, corr.multipliers, strict=True)])
    linear = terms.sum(axis=1) + corr.per_request_ns * p["decode_requests"].to_numpy() \
        + corr.constant_ns
    assert (linear >= terms.max(axis=1) * (1 - 1e-12)).all()


def test_a_calibration_that_cannot_improve_is_flagged(k70: kernel.Kernel, tmp_path: Path
                                                      ) -> None:
    train, held = k70.price(decode_trace(400, 3)), k70.price(decode_trace(400, 4))
    a = train.with_columns((pl.col("no_overlap_ns") * 2).alias("measured_ns"))
    b = held.with_columns(pl.col("no_overlap_ns").alias("measured_ns"))
    r = fit(a, holdout=b, start="no_overlap")
    assert not r.improved and "does not improve on its uncalibrated start" in r.warning
    # the command line says so loudly and the document records it
    from kernel.cli import cli

    paths = []
    for name, tr, priced, factor in (("train", decode_trace(400, 3), train, 2),
                                     ("held", decode_trace(400, 4), held, 1)):
        m = priced.select("batch_id", (pl.col("no_overlap_ns") * factor / 1e3)
                          .alias("measured_us"))
        path = tmp_path / f"{name}.parquet"
        tr.join(m, on="batch_id").write_parquet(path)
        paths.append(path)
    out = tmp_path / "cal.yaml"
    res = CliRunner().invoke(cli, ["calibrate", str(paths[0]), "-s", "llama-3.1-70b-h200-tp4",
                                   "--measured", "measured_us", "--measured-unit", "us",
                                   "--holdout", str(paths[1]), "--start", "no_overlap",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "WARNING: the calibration does not improve on its uncalibrated start" in res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["improved"] is False and "does not improve" in doc["warning"]
    assert doc["fit"]["scored_by"] == "holdout"
    table = doc["starts"]["no_overlap"]
    assert table["uncalibrated"]["all"]["mape"] == 0.0
    assert table["calibrated"]["decode"]["mape"] > 0.5


def test_beating_its_start_but_not_the_other_estimate_is_also_said(k70: kernel.Kernel
                                                                   ) -> None:
    train, held = k70.price(decode_trace(400, 3)), k70.price(decode_trace(400, 4))
    # the holdout is exactly NoOverlap; the training steps are 1.5x Overlap
    a = train.with_columns((pl.col("overlap_ns") * 1.5).alias("measured_ns"))
    b = held.with_columns(pl.col("no_overlap_ns").alias("measured_ns"))
    r = fit(a, holdout=b, start="overlap")
    mine = r.starts["overlap"]
    assert mine["calibrated"]["all"].mape < mine["uncalibrated"]["all"].mape
    assert r.improved and "but not on the uncalibrated no_overlap" in r.warning


def test_both_starts_are_fitted_and_the_better_held_out_kept(k70: kernel.Kernel) -> None:
    p = k70.price(decode_trace(600, 11))
    # measured = Overlap scaled: the Overlap start describes it, NoOverlap needs bending
    y = p["overlap_ns"].to_numpy() * 1.1
    result = fit(p.with_columns(pl.Series("measured_ns", y)), folds=3)
    assert set(result.starts) == {"no_overlap", "overlap"}
    errs = {s: v["calibrated"]["all"].mape for s, v in result.starts.items()}
    assert result.law.start == min(errs, key=errs.get)  # type: ignore[arg-type]
    assert result.start_chosen_by == "held-out MAPE"
    for v in result.starts.values():  # each start's own uncalibrated error is reported
        assert v["uncalibrated"]["all"].rows == p.height


def test_a_law_found_elsewhere_makes_a_document_that_reads_back(tmp_path: Path) -> None:
    from kernel.io.calibration_document import law_document, load_calibration

    law = Law(decode=PhaseCorrection((0.9, 0.9, 1.2, 1.0, 1.0), -1.5e5, 2e4), start="overlap")
    doc = law_document(law, name="replayed", model="llama-2-70b-hf", chip="h100",
                       engine={"name": "vllm", "version": "0.15.1", "stated_by": "option"},
                       fit={"method": "outer optimiser over the serving replay"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    cal = load_calibration(path)
    assert cal.law == law and cal.document["fit"]["method"].startswith("outer")
    with pytest.raises(CalibrationError, match=r"unknown calibration key\(s\) \['bogus'\]"):
        law_document(law, name="x", model="m", chip="c", bogus=1)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(start="both"), r"start: 'both' is not one of \['no_overlap', 'overlap'\]"),
    (lambda d: d.update(engine="vllm"), r"engine: must be a mapping"),
    (lambda d: d["phases"]["decode"].update(per_request_ns="x"),
     r"phases.decode.per_request_ns: must be a finite number"),
    (lambda d: d["phases"]["decode"]["terms"].update(sm={"status": "pinned"}),
     r"phases.decode.terms.sm.status: 'pinned' is not one of"),
])
def test_new_keys_are_read_strictly(tmp_path: Path, edit, message: str) -> None:
    from kernel.io.calibration_document import law_document, load_calibration

    doc = law_document(Law(), name="t", model="m", chip="c")
    doc["phases"]["decode"]["terms"] = {"sm": {"status": "tied"}}
    edit(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CalibrationError, match=f"{path}: {message}"):
        load_calibration(path)


# -- held-out scoring ---------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=40),
       st.floats(0.05, 0.95))
def test_split_is_deterministic_and_keeps_each_value_on_one_side(values: list[str],
                                                                 fraction: float) -> None:
    a, b = split_mask(values, fraction), split_mask(list(reversed(values)), fraction)
    assert (a == b[::-1]).all()
    side = {}
    for v, held in zip(values, a, strict=True):
        assert side.setdefault(v, held) == held


def test_split_command_holds_out_a_share_of_configurations(tmp_path: Path) -> None:
    from kernel.cli import cli

    requests, batches = splitwise_trace()
    b = batches.filter((pl.col("config") == "h100-80gb-tp4") & ~pl.col("suspect"))
    tr = tmp_path / "t.parquet"
    requests.join(b.select("batch_id", "measured_ms", "shape"), on="batch_id") \
        .write_parquet(tr)
    out = tmp_path / "c.yaml"
    args = ["calibrate", str(tr), "-s", str(scenario_path("h100-80gb", 4)), "--measured",
            "measured_ms", "--measured-unit", "ms", "--split", "shape:0.5", "-o", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    sp = doc["sources"]["split"]
    shapes = b["shape"].unique().to_list()
    held = set(np.asarray(shapes)[split_mask(shapes, 0.5)])
    assert sp["held_out_values"] == len(held)
    assert sp["held_out_steps"] == b.filter(pl.col("shape").is_in(list(held))).height
    assert doc["window"]["steps"] == b.height - sp["held_out_steps"]
    assert "error on the split's held-out side" in res.output
    assert doc["improved"] is True
    again = tmp_path / "c2.yaml"
    assert CliRunner().invoke(cli, [*args[:-1], str(again)]).exit_code == 0
    assert yaml.safe_load(again.read_text())["phases"] == doc["phases"]


def test_splitwise_one_calibration_per_hardware_and_tp_beats_its_start() -> None:
    """The issue's Must show: fitted on half the configurations, scored on the rest."""
    p = price_splitwise()
    for (hw, tp), sub in p.group_by(["hardware", "tp"], maintain_order=True):
        held = split_mask(sub["shape"].to_numpy(), 0.5)
        train, test = sub.filter(~pl.Series(held)), sub.filter(pl.Series(held))
        r = fit(train, holdout=test)
        mine = r.starts[r.law.start]
        before, after = mine["uncalibrated"]["all"].mape, mine["calibrated"]["all"].mape
        print(f"\n{hw} TP {tp}: start {r.law.start} {before:.1%} -> calibrated {after:.1%}")
        assert r.improved and after < before
        assert after <= 0.12


# -- identity: engine, rules, layout --------------------------------------------------------------

@pytest.fixture(scope="module")
def tp4_calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requests, batches = splitwise_trace()
    b = batches.filter((pl.col("config") == "h100-80gb-tp4") & ~pl.col("suspect"))
    t = requests.join(b.select("batch_id", "measured_ms"), on="batch_id")
    cal = calibrate(str(scenario_path("h100-80gb", 4)), t, "measured_ms", unit="ms", folds=3,
                    engine="vllm:0.15.1")
    path = tmp_path_factory.mktemp("cal") / "tp4.yaml"
    cal.write(path)
    return path


def test_the_document_records_engine_rules_and_layout(tp4_calibration: Path) -> None:
    doc = yaml.safe_load(tp4_calibration.read_text())
    assert doc["engine"] == {"name": "vllm", "version": "0.15.1", "stated_by": "option"}
    assert doc["rules"] == "0.29.0"
    assert doc["layout"]["tp"] == [4]
    assert doc["layout"]["shapes"] == [{"pp": 1, "dp": 1, "pcp": 0, "dcp": 0,
                                        "expert_parallel": False}]
    assert doc["start"] in ("no_overlap", "overlap") and doc["window"]["requests"][0] >= 1


def test_the_engine_measurements_state_is_recorded() -> None:
    requests, batches = splitwise_trace()
    b = batches.filter((pl.col("config") == "h100-80gb-tp2") & ~pl.col("suspect"))
    t = requests.join(b.select("batch_id", "measured_ms"), on="batch_id").with_columns(
        pl.lit("vLLM").alias("engine"), pl.lit("0.15.1").alias("engine_version"))
    cal = calibrate(str(scenario_path("h100-80gb", 2)), t, "measured_ms", unit="ms", folds=0)
    assert cal.document["engine"] == {"name": "vllm", "version": "0.15.1",
                                      "stated_by": "measurements"}
    with pytest.raises(CalibrationError, match="contradicts the measurements"):
        calibrate(str(scenario_path("h100-80gb", 2)), t, "measured_ms", unit="ms", folds=0,
                  engine="sglang")


def test_another_engine_is_refused_unless_forced_and_forcing_is_in_provenance(
        tp4_calibration: Path, h100tp4: kernel.Kernel) -> None:
    with pytest.raises(CalibrationError, match=r"engine 'vllm 0.29.0' \(the calibration was "
                                               r"measured on vllm 0.15.1\)"):
        h100tp4.with_calibration(tp4_calibration, engine="vllm:0.29.0")
    same = h100tp4.with_calibration(tp4_calibration, engine="vllm:0.15.1")
    assert same.calibration is not None and same.calibration.forced == ()
    assert not any(o.name == "calibration.forced" for o in same.provenance())
    forced = h100tp4.with_calibration(tp4_calibration, force=True, engine="sglang")
    entry = [o for o in forced.provenance() if o.name == "calibration.forced"]
    assert len(entry) == 1 and entry[0].method == "assumed"
    assert "engine 'sglang'" in entry[0].scope and "vllm 0.15.1" in entry[0].scope


def test_another_layout_is_refused_and_another_tp_warns(tp4_calibration: Path,
                                                        tmp_path: Path) -> None:
    text = scenario_path("h100-80gb", 4).read_text().replace("dp: 1", "dp: 2")
    other = tmp_path / "tp4dp2.yaml"
    other.write_text(text)
    kpp = kernel.open(str(other))
    with pytest.raises(CalibrationError, match=r"parallel layout pp 1, dp 2, .*fitted on pp 1, dp 1"):
        kpp.with_calibration(tp4_calibration)
    forced = kpp.with_calibration(tp4_calibration, force=True)
    scope = next(o.scope for o in forced.provenance() if o.name == "calibration.forced")
    assert "parallel layout pp 1, dp 2" in scope
    k8 = kernel.open(str(scenario_path("h100-80gb", 8)))
    with pytest.warns(CalibrationWarning, match="TP 8 is outside the fit window"):
        k8.with_calibration(tp4_calibration)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel.open(str(scenario_path("h100-80gb", 4))).with_calibration(tp4_calibration)


def test_price_refuses_another_engine_and_warns_outside_the_window(tp4_calibration: Path,
                                                                   tmp_path: Path) -> None:
    from kernel.cli import cli

    tr = tmp_path / "t.parquet"
    decode_trace(30, 1, max_requests=200).write_parquet(tr)
    scen = str(scenario_path("h100-80gb", 4))
    res = CliRunner().invoke(cli, ["price", str(tr), "-s", scen, "-o", str(tmp_path / "p.parquet"),
                                   "--calibration", str(tp4_calibration), "--engine",
                                   "vllm:0.31.0", "--no-progress"])
    assert res.exit_code == 1 and "refusing to apply calibration" in res.output
    res = CliRunner().invoke(cli, ["price", str(tr), "-s", scen, "-o", str(tmp_path / "p.parquet"),
                                   "--calibration", str(tp4_calibration), "--engine",
                                   "vllm:0.31.0", "--force-calibration", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "applied by force despite: engine 'vllm 0.31.0'" in res.output
    assert "request count outside the calibration's fit window" in res.output


# -- scenario from a vLLM engine config ---------------------------------------------------------

def test_scenario_from_a_nested_vllm_config_opens_with_its_settings(tmp_path: Path) -> None:
    from kernel.cli import cli

    cfg = {"model": "meta-llama/Llama-2-70b-hf", "vllm_version": "0.15.1",
           "parallel_config": {"tensor_parallel_size": 4, "pipeline_parallel_size": 1},
           "scheduler_config": {"max_num_seqs": 96, "max_num_batched_tokens": 3072},
           "model_config": {"max_model_len": 6144},
           "cache_config": {"block_size": 32, "gpu_memory_utilization": 0.85},
           "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(cfg))
    res = CliRunner().invoke(cli, ["scenario", "from-vllm-config", str(path), "--hardware",
                                   "h100", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "vLLM 0.15.1 has no rules pack of its own: the 0.29.0 pack's rules are used" \
        in res.output
    written = list((tmp_path / "out").glob("*.yaml"))
    assert len(written) == 1
    k = kernel.open(str(written[0]))
    r = k.resolved_pool
    assert (r.model_name, r.chip_name, r.layout.tp) == ("llama-2-70b-hf", "h100", 4)
    assert (r.max_num_seqs, r.max_num_batched_tokens, r.max_model_len, r.block_size) == \
        (96, 3072, 6144, 32)
    assert r.cudagraph_mode == "FULL_AND_PIECEWISE"


def test_scenario_from_a_flat_config_and_what_is_refused(tmp_path: Path) -> None:
    from kernel.calibration.vllm_config import ConfigError, from_vllm_config

    flat = tmp_path / "exp-config.yaml"
    flat.write_text("model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\n"
                    "max_num_seqs: 128\nmax-num-batched-tokens: 2048\nmax_model_len: 4096\n"
                    "app: inference-perf\nswap_space: 4\n")
    made = from_vllm_config(flat, "h100", engine_version="0.15.1")
    assert made.rules_version == "0.29.0" and made.measured_version == "0.15.1"
    assert any("not read (no deployment field): swap_space" in n for n in made.notes)
    assert any("left to the engine defaults: block_size" in n for n in made.notes)
    docs = list(yaml.safe_load_all(made.text))
    assert docs[1]["pools"][0]["engine"]["max_num_batched_tokens"] == 2048
    with pytest.raises(ConfigError, match="predates 0.11.0 and may run the V0 engine"):
        from_vllm_config(flat, "h100", engine_version="0.9.2")
    with pytest.raises(ConfigError, match="the rules packs describe vLLM only"):
        from_vllm_config(_with(tmp_path, flat, "engine: sglang\n"), "h100")
    with pytest.raises(ConfigError, match="'nope' is not a catalog chip"):
        from_vllm_config(flat, "nope")
    with pytest.raises(ConfigError, match="max_num_seqs: must be a non-negative integer"):
        from_vllm_config(_with(tmp_path, flat, "max_num_seqs: lots\n"), "h100")
    same = from_vllm_config(_with(tmp_path, flat, "vllm_version: 0.29.0\n"), "h100")
    assert same.rules_version == "0.29.0" and "has its own rules pack" in same.notes[0]


def _with(tmp_path: Path, base: Path, extra: str) -> Path:
    out = tmp_path / f"cfg{abs(hash(extra))}.yaml"
    text = "".join(line + "\n" for line in base.read_text().splitlines()
                   if line.split(":")[0] not in {x.split(":")[0] for x in extra.splitlines()})
    out.write_text(text + extra)
    return out


def test_an_fpm_trace_states_its_engine() -> None:
    from tests.test_fpm import _splitwise_as_fpm

    _, fpm = _splitwise_as_fpm("h100-80gb", 4)
    fpm = fpm.with_columns(pl.lit("vllm").alias("engine"),
                           pl.lit("0.15.1").alias("engine_version"))
    cal = calibrate(str(scenario_path("h100-80gb", 4)), fpm, "latency_ms", unit="ms",
                    trace_format="fpm", folds=3)
    assert cal.document["engine"] == {"name": "vllm", "version": "0.15.1",
                                      "stated_by": "measurements"}
    assert cal.document["improved"] is True
