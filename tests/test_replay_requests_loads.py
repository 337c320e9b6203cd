"""Load specs (issue 29 item 1): parsing, generators (statistics with fixed seeds), closed loop,
shared-prefix groups and the inference-perf configs of the sim-to-real runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.io.synth import Lengths
from kernel.replay import (
    REQUEST_SCHEMA,
    LoadSpec,
    Stage,
    generate,
    inference_perf_spec,
    parse_load,
)

MEASURED = next((p / "shared" / "reference" / "measurements" / "inference-sim-training"
                 / "default_args" for p in (Path(__file__).resolve().parents[2], Path("/work"))
                 if (p / "shared" / "reference" / "measurements").is_dir()),
                Path(__file__).resolve().parents[2] / "shared" / "reference" / "measurements"
                / "inference-sim-training" / "default_args")

# The resolved config inference-perf ran for 20260217-155451-llama-2-7b-tp1-codegen
# (results/config.yaml, the keys that matter, verbatim values).
CODEGEN = {
    "api": {"type": "completion", "streaming": True},
    "data": {"type": "shared_prefix", "path": None, "input_distribution": None,
             "output_distribution": None,
             "shared_prefix": {"num_groups": 10, "num_prompts_per_group": 10,
                               "system_prompt_len": 100, "question_len": 466,
                               "output_len": 247}},
    "load": {"type": "constant", "interval": 1.0,
             "stages": [{"rate": 5.0, "duration": 600}, {"rate": 10.0, "duration": 600}],
             "sweep": None, "num_workers": 224},
    "server": {"type": "vllm", "ignore_eos": True},
}


def _gaps(spec: str, seed: int) -> np.ndarray:
    t = generate(spec, seed=seed).table["arrival_ns"].to_numpy().astype(np.float64) / 1e9
    return np.diff(t)


# ------------------------------------------------------------------------------ parsing

def test_compact_yaml_and_mapping_forms_agree(tmp_path: Path) -> None:
    compact = ("arrival=gamma,cv=2,stages=5x600+10x60,output=fixed:128,groups=3,"
               "prompts_per_group=4,system=100,question=lognormal:50:1")
    y = tmp_path / "load.yaml"
    y.write_text("arrival: gamma\ncv: 2\nstages:\n  - {rate: 5, duration: 600}\n"
                 "  - {rate: 10, duration: 60}\noutput: 128\n"
                 "shared_prefix: {groups: 3, prompts_per_group: 4, system_tokens: 100, "
                 "question: 'lognormal:50:1'}\n")
    a, b = parse_load(compact), parse_load(y)
    assert a.stages == b.stages == (Stage(5.0, 600.0), Stage(10.0, 60.0))
    assert (a.arrival, a.cv, a.prompt, a.output) == (b.arrival, b.cv, b.prompt, b.output)
    assert a.shared_prefix == b.shared_prefix
    # the synth grammar, parsed by synth
    assert parse_load("rate=1,duration=1,prompt=lognormal:1024:1").prompt == \
        Lengths.parse("lognormal:1024:1")
    assert generate(a, seed=4).table.equals(generate(b, seed=4).table)


@pytest.mark.parametrize("bad,match", [
    ("rate=8", "rate and duration go together"),
    ("rate=8,duration=10,speed=3", "unknown key"),
    ("rate=-1,duration=10", "rate must be"),
    ("rate=1,duration=10,prompt=zipf:3", "bad length distribution"),
    ("rate=1,duration=10,arrival=bursty", "arrival must be one of"),
    ("stages=5by600", "RATExSECONDS"),
    ("users=0", "users must be >= 1"),
    ("users=3,rate=1,duration=1", "closed loop"),
    ("rate=1,duration=1,groups=2", "shared_prefix needs"),
    ("rate=1,duration=1,users=x", "must be a number"),
    ("rate=1,duration=1,prompt=fixed:9,groups=1,prompts_per_group=1,system=4,question=fixed:3",
     "not prompt"),
])
def test_bad_specs_say_what_is_wrong(bad: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_load(bad)


def test_missing_yaml_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither key=value pairs nor a YAML file"):
        parse_load(str(tmp_path / "nope.yaml"))


# --------------------------------------------------------------------------- determinism

@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(
    ["rate=20,duration=5,prompt=lognormal:300:1,output=exponential:40",
     "arrival=gamma,cv=3,stages=4x3+9x2,groups=2,prompts_per_group=3,system=40,"
     "question=uniform:1:90",
     "users=5,requests_per_user=4,think=exponential:200,ramp=2,prompt=uniform:1:64"]))
def test_same_seed_same_request_set(seed: int, spec: str) -> None:
    a, b = generate(spec, seed=seed), generate(spec, seed=seed)
    assert a.table.equals(b.table) and a.rejects.equals(b.rejects)
    assert a.table.schema.equals(REQUEST_SCHEMA)
    assert a.rows_in == a.table.num_rows
    other = generate(spec, seed=seed + 1)
    assert not other.table.equals(a.table)


# ------------------------------------------------------------------------------ statistics

def test_poisson_rate_and_exponential_gaps() -> None:
    counts = [generate("rate=50,duration=200", seed=s).table.num_rows for s in range(20)]
    # 20 x 10,000 expected: the mean count is within 0.5% (its sd is 0.22%)
    assert abs(np.mean(counts) / 10_000 - 1) < 0.005
    # a Poisson count's variance equals its mean: sd of the counts ~ 100
    assert 60 < np.std(counts, ddof=1) < 150
    g = _gaps("rate=50,duration=2000", seed=7)
    assert abs(g.mean() * 50 - 1) < 0.01
    assert abs(g.std() / g.mean() - 1) < 0.02  # exponential: CV 1
    assert abs(np.mean(g > 0.02) - math.exp(-1)) < 0.01  # P(gap > 1/rate) = 1/e


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_rate_and_cv(cv: float) -> None:
    g = _gaps(f"arrival=gamma,cv={cv},rate=40,duration=5000", seed=11)
    assert abs(g.mean() * 40 - 1) < 0.03
    assert abs(g.std() / g.mean() / cv - 1) < 0.05


def test_constant_and_normalized_exponential() -> None:
    t = generate("arrival=constant,rate=4,duration=10", seed=0).table["arrival_ns"].to_pylist()
    assert t == [i * 250_000_000 for i in range(40)]
    for seed in range(5):
        rs = generate("arrival=normalized_exponential,stages=5x600+10x60", seed=seed)
        st_ = rs.table["stage"].to_numpy()
        a = rs.table["arrival_ns"].to_numpy()
        # inference-perf sends exactly int(rate * duration) per stage, the last at the end
        assert (st_ == 0).sum() == 3000 and (st_ == 1).sum() == 600
        assert a[st_ == 0].max() == 600 * 10**9
        assert a[st_ == 1].max() == 660 * 10**9
        assert a[st_ == 1].min() > 600 * 10**9


def test_stage_boundaries_and_rates() -> None:
    rs = generate("stages=5x300+40x100+1x200,stage_gap=3", seed=2)
    a = rs.table["arrival_ns"].to_numpy() / 1e9
    s = rs.table["stage"].to_numpy()
    bounds = [(0, 300), (303, 403), (406, 606)]
    for k, (lo, hi) in enumerate(bounds):
        ak = a[s == k]
        assert ak.min() >= lo and ak.max() < hi
        rate = ak.size / (hi - lo)
        want = (5, 40, 1)[k]
        assert abs(rate / want - 1) < 4 / math.sqrt(want * (hi - lo))  # 4 sd
    assert np.all(np.diff(s) >= 0)


def test_max_requests_cuts_the_open_loop() -> None:
    rs = generate("rate=100,duration=100,max_requests=250", seed=1)
    assert rs.table.num_rows == 250
    full = generate("rate=100,duration=100", seed=1)
    assert rs.table["arrival_ns"].equals(full.table["arrival_ns"].slice(0, 250))


# ---------------------------------------------------------------------------- closed loop

def test_closed_loop_sessions_are_chains() -> None:
    rs = generate("users=6,requests_per_user=5,think=fixed:250,ramp=3", seed=0)
    t = rs.table.to_pydict()
    assert len(t["request_id"]) == 30
    starts = [a for a in t["arrival_ns"] if a is not None]
    assert starts == [u * 500_000_000 for u in range(6)]
    assert t["session_id"][:6] == [f"user-{u}" for u in range(6)]
    assert t["think_ns"][:6] == [None] * 6
    assert t["arrival_ns"][6:] == [None] * 24 and t["think_ns"][6:] == [250_000_000] * 24
    for u in range(6):
        rows = [i for i, sid in enumerate(t["session_id"]) if sid == f"user-{u}"]
        assert len(rows) == 5 and t["arrival_ns"][rows[0]] is not None
    no_think = generate("users=2,requests_per_user=2", seed=0)
    assert no_think.table["think_ns"].to_pylist() == [None, None, 0, 0]


# --------------------------------------------------------------------------- shared prefix

def test_shared_prefix_hashes_share_exactly_the_system_blocks() -> None:
    rs = generate("rate=50,duration=20,groups=3,prompts_per_group=4,system=100,"
                  "question=uniform:20:60,output=fixed:9", seed=5)
    t = rs.table.to_pydict()
    assert rs.hash_block_tokens == 16
    hashes = t["prefix_hashes"]
    prompts = t["prompt_tokens"]
    # each request's prompt is one of the 12 distinct prompts: same length, same hashes
    distinct = {tuple(h) for h in hashes}
    assert len(distinct) == 12
    by_first = {}
    for h, p in zip(hashes, prompts, strict=True):
        assert len(h) == p // 16 and p >= 100 + 20
        by_first.setdefault(h[0], set()).add(tuple(h))
    assert len(by_first) == 3 and all(len(v) == 4 for v in by_first.values())
    # within a group two different prompts share the 6 whole system blocks (96 tokens), no more
    for group in by_first.values():
        a, b = sorted(group)[:2]
        assert a[:6] == b[:6] and a[6] != b[6]
    assert set(t["output_tokens"]) == {9}


def test_cycle_order_sends_each_prompt_in_turn_and_restarts_per_stage() -> None:
    rs = generate("arrival=normalized_exponential,stages=3x10+2x10,groups=2,"
                  "prompts_per_group=2,system=32,question=fixed:16", seed=9)
    h = [tuple(x) for x in rs.table["prefix_hashes"].to_pylist()]
    s = rs.table["stage"].to_pylist()
    first = [x for x, k in zip(h, s, strict=True) if k == 0]
    second = [x for x, k in zip(h, s, strict=True) if k == 1]
    assert len(set(first[:4])) == 4
    assert all(first[i] == first[i % 4] for i in range(len(first)))
    assert second == first[: len(second)]  # request numbering restarts at each stage


# ---------------------------------------------------------------------------- inference-perf

def test_inference_perf_codegen_config() -> None:
    spec = inference_perf_spec(CODEGEN)
    assert spec.arrival == "normalized_exponential"
    assert spec.stages == (Stage(5.0, 600.0), Stage(10.0, 600.0))
    assert spec.stage_gap_s == 2.0  # interval 1 s + the 1 s lead of each stage
    sp = spec.shared_prefix
    assert sp is not None and (sp.groups, sp.prompts_per_group, sp.system_tokens) == (10, 10, 100)
    rs = generate(spec, seed=0)
    t = rs.table.to_pydict()
    assert set(t["prompt_tokens"]) == {566} and set(t["output_tokens"]) == {247}
    assert t["stage"].count(0) == 3000 and t["stage"].count(1) == 6000
    assert len({tuple(h) for h in t["prefix_hashes"]}) == 100
    assert rs.source.startswith("inference-perf config")


@pytest.mark.parametrize("change,match", [
    ({"load": {"type": "concurrent", "stages": [{"rate": 1, "duration": 1}]}}, "load.type"),
    ({"load": {"type": "constant", "stages": []}}, "load.stages"),
    ({"data": {"type": "random"}}, "only shared_prefix"),
    ({"server": {"ignore_eos": False}}, "ignore_eos"),
    ({"data": {"type": "shared_prefix", "shared_prefix": {
        "num_unique_system_prompts": 11, "num_users_per_system_prompt": 4,
        "system_prompt_len": 100, "question_len": 466, "output_len": 247}}},
     "inference-sim's profile keys"),
    ({"data": {"type": "shared_prefix", "shared_prefix": {
        **CODEGEN["data"]["shared_prefix"], "question_len_std": 30}}}, "question_len_std"),
])
def test_inference_perf_refusals(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        inference_perf_spec({**CODEGEN, **change})


@pytest.mark.skipif(not MEASURED.is_dir(), reason=f"{MEASURED} is absent (the measured runs "
                    "live in ../shared beside the clone)")
def test_every_measured_run_translates_with_its_measured_counts() -> None:
    runs = sorted(p for p in MEASURED.iterdir() if p.is_dir())
    assert len(runs) == 16
    for run in runs:
        spec = inference_perf_spec(run)
        rs = generate(spec, seed=0)
        stages = rs.table["stage"].to_numpy()
        for k, st_ in enumerate(spec.stages):
            summary = json.loads((run / "results" / f"stage_{k}_lifecycle_metrics.json")
                                 .read_text())
            # the requests inference-perf scheduled in the stage, as measured
            assert (stages == k).sum() == summary["load_summary"]["count"]
            assert st_.rate == summary["load_summary"]["requested_rate"]
        # the profile.yaml's own keys are inference-sim's, not what inference-perf ran
        with pytest.raises(ValueError, match="results/config.yaml"):
            inference_perf_spec(run / "profile.yaml")


def test_max_model_len_rejects_generated_prompts() -> None:
    rs = generate("rate=20,duration=10,prompt=uniform:1:200,output=fixed:1", seed=3,
                  max_model_len=100)
    assert rs.rows_in == rs.table.num_rows + rs.rejects.num_rows
    assert rs.rejects.num_rows > 0
    assert max(rs.table["prompt_tokens"].to_pylist()) < 100
    with pytest.raises(ValueError, match="max_model_len"):
        generate("rate=20,duration=10,prompt=uniform:1:200", seed=3, max_model_len=100,
                 on_reject="raise")
    assert isinstance(parse_load(LoadSpec(stages=(Stage(1, 1),))), LoadSpec)


_dist = st.sampled_from(["fixed:7", "uniform:1:300", "lognormal:200:1.2", "exponential:40"])


@settings(max_examples=25, deadline=None)
@given(arrival=st.sampled_from(["poisson", "gamma", "constant", "normalized_exponential"]),
       cv=st.floats(0.3, 4), stages=st.lists(st.tuples(st.floats(0.2, 30), st.floats(0.5, 8)),
                                             min_size=1, max_size=3),
       gap=st.floats(0, 3), prompt=_dist, output=_dist, shared=st.booleans(),
       block=st.sampled_from([1, 16, 64]), seed=st.integers(0, 1000))
def test_any_open_loop_spec_keeps_the_contract(arrival: str, cv: float,
                                               stages: list[tuple[float, float]], gap: float,
                                               prompt: str, output: str, shared: bool,
                                               block: int, seed: int) -> None:
    spec = {"arrival": arrival, "cv": cv, "stage_gap": gap, "prompt": prompt,
            "output": output, "hash_block_tokens": block,
            "stages": [{"rate": r, "duration": d} for r, d in stages]}
    if shared:
        spec["shared_prefix"] = {"groups": 2, "prompts_per_group": 3, "system_tokens": 50,
                                 "question": spec.pop("prompt")}
    rs = generate(spec, seed=seed)
    t = rs.table.to_pydict()
    assert rs.rows_in == rs.table.num_rows and rs.rejects.num_rows == 0
    arr = np.asarray(t["arrival_ns"], dtype=np.int64)
    stg = np.asarray(t["stage"])
    assert np.all(np.diff(arr) >= 0) and np.all(np.diff(stg) >= 0)
    start = 0.0
    for k, (_, d) in enumerate(stages):  # every arrival inside its stage's window
        a = arr[stg == k] / 1e9
        if a.size:
            assert a.min() >= start - 1e-9 and a.max() <= start + d + 1e-6
        start += d + gap
    assert min(t["prompt_tokens"], default=1) >= 1 and min(t["output_tokens"], default=1) >= 1
    if shared:
        assert all(len(h) == p // block for h, p in
                   zip(t["prefix_hashes"], t["prompt_tokens"], strict=True))
        assert rs.hash_block_tokens == block
    else:
        assert set(t["prefix_hashes"]) <= {None} and rs.hash_block_tokens is None


def test_rate_scaling_of_specs_and_traces() -> None:
    base = parse_load("stages=4x500+10x100")
    double = base.scaled(2.0)
    assert double.stages == (Stage(8.0, 500.0), Stage(20.0, 100.0))
    n1, n2 = generate(base, seed=1).table.num_rows, generate(double, seed=1).table.num_rows
    assert abs(n2 / n1 - 2) < 0.06  # ~3,000 vs ~6,000 Poisson arrivals
    with pytest.raises(ValueError, match="closed loop"):
        parse_load("users=2").scaled(2)
    with pytest.raises(ValueError, match="> 0"):
        base.scaled(0)
    from kernel.replay import scale_rate

    rs = generate("users=2,requests_per_user=2,think=fixed:5,ramp=3", seed=0)
    fast = scale_rate(rs, 3.0)
    assert fast.table["arrival_ns"].to_pylist() == [0, 500_000_000, None, None]
    assert fast.table["think_ns"].equals(rs.table["think_ns"])
    assert fast.rows_in == rs.rows_in and "x3 rate" in fast.source
