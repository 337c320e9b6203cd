"""Invariants of the replay on random request sets and engine settings (hypothesis), and the
steps table re-priced by ``price`` in bulk, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.replay import ReplayOptions, replay
from kernel.replay.api import engine_limits
from tests.replay_support import kernel_for, request_set


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    rows = []
    t = 0
    groups = draw(st.integers(1, 3))
    for i in range(n):
        t += draw(st.integers(0, 40_000_000))
        p = draw(st.integers(1, 300))
        g = draw(st.integers(0, groups - 1))
        shared = draw(st.integers(0, p // 16))
        hashes = [1000 * g + j for j in range(shared)] + [10**6 + 100 * i + j
                                                           for j in range(p // 16 - shared)]
        rows.append({"request_id": f"r{i}", "arrival_ns": t, "prompt_tokens": p,
                     "output_tokens": draw(st.integers(1, 24)), "prefix_hashes": hashes})
    scenario = draw(st.sampled_from(SCENARIOS))
    fixed = engine_limits(kernel_for(scenario), ReplayOptions())[0].fixed_blocks
    opts = ReplayOptions(
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.sampled_from([16, 40, 64, 256, 2048])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 50])),
        # 21 blocks (+ what admission reserves) hold the longest request (324 tokens)
        num_blocks=fixed + draw(st.integers(21, 60)),
        enable_prefix_caching=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        dp=draw(st.sampled_from([1, 1, 2])),
        lockstep=draw(st.booleans()),
        router=draw(st.sampled_from(["least_loaded", "round_robin"])),
        estimate=draw(st.sampled_from(["overlap", "no_overlap"])),
    )
    return rows, opts, scenario


# dense; MoE (lockstep when dp > 1); sliding-window rings reserved per request (gpt-oss)
SCENARIOS = ("llama-3.1-8b-h100-tp1", "qwen3-30b-a3b-h100-tp2", "gpt-oss-120b-h200-fp4-vllm-tp8")


@pytest.fixture(scope="module")
def k():
    return kernel_for()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_replay_invariants(workloads_):
    rows, opts, scenario = workloads_
    k = kernel_for(scenario)
    res = replay(k, request_set(rows, hash_block_tokens=16), opts)
    req = res.requests.to_pylist()
    # every request finishes (none is too long for these settings)
    assert [r["status"] for r in req] == ["finished"] * len(rows)
    steps = res.steps.to_pylist()
    sched: dict[str, int] = {}
    for s in steps:
        sched[s["request_id"]] = sched.get(s["request_id"], 0) + s["scheduled"]
        # vLLM never puts a request in a batch for 0 tokens (decision RS8)
        assert s["scheduled"] > 0, s
    for r in req:
        # tokens computed = prompt + output - 1 + recomputed after preemption, where the
        # tokens a prefix hit supplies count as computed without being scheduled
        hit = sum(s["cached_tokens"] for s in steps if s["request_id"] == r["request_id"])
        assert sched[r["request_id"]] + hit == (r["prompt_tokens"] + r["output_tokens"] - 1
                                                + r["recomputed_tokens"])
        assert r["arrival_ns"] <= r["ready_ns"] <= r["admitted_ns"] < r["first_token_ns"]
        assert r["first_token_ns"] <= r["finish_ns"]
        assert r["ttft_ns"] > 0 and r["e2e_ns"] >= r["ttft_ns"]
    es = res.engine_steps.to_pylist()
    limits = opts
    fixed_blocks = engine_limits(k, opts)[0].fixed_blocks
    last_end: dict[int, int] = {}
    for e in es:
        assert 0 < e["requests"] <= limits.max_num_seqs
        assert e["tokens"] <= limits.max_num_batched_tokens
        assert e["kv_used"] <= e["kv_blocks"] == limits.num_blocks
        assert e["kv_used"] >= e["requests"] * fixed_blocks
        assert e["end"] - e["start"] == e["step_ns"] >= e["batch_ns"]
        # time never goes backwards on one engine core
        assert e["start"] >= last_end.get(e["engine"], 0)
        last_end[e["engine"]] = e["end"]
    # each request's rows are in time order, and a step never schedules a request twice
    seen: dict[tuple[int, str], int] = {}
    for s in steps:
        key = (s["batch_id"], s["request_id"])
        assert key not in seen
        seen[key] = 1
    # the same input gives the same output
    again = replay(k, request_set(rows, hash_block_tokens=16), opts)
    assert again.requests.equals(res.requests)
    assert again.steps.equals(res.steps)
    # without the steps table, every request's figures are the same
    lean = replay(k, request_set(rows, hash_block_tokens=16),
                  dataclasses.replace(opts, keep_steps=False))
    assert lean.requests.equals(res.requests)
    assert lean.steps.num_rows == 0 and lean.steps.schema.equals(res.steps.schema)
    assert lean.engine_steps.equals(res.engine_steps)


def test_steps_reprice_bit_for_bit(k):
    rng = np.random.default_rng(11)
    n = 300
    t = pa.table({"arrival_ns": np.cumsum(rng.exponential(2e7, n)).astype(np.int64),
                  "prompt_tokens": rng.integers(1, 6000, n),
                  "output_tokens": rng.integers(1, 80, n)})
    for estimate in ("no_overlap", "overlap"):
        res = replay(k, t, ReplayOptions(estimate=estimate, max_num_batched_tokens=2048))
        priced = k.price(res.steps).sort("batch_id")
        es = res.engine_steps.sort_by("batch_id")
        assert priced["batch_id"].to_list() == es.column("batch_id").to_pylist()
        assert priced[f"{estimate}_ns"].to_list() == es.column("batch_ns").to_pylist()
        assert priced["limits"].to_list() == [""] * priced.height  # no step breaks a limit


def test_bad_requests_are_reported_with_their_reason(k):
    rows = [{"request_id": "ok", "arrival_ns": 0, "prompt_tokens": 10, "output_tokens": 3},
            {"request_id": "long", "arrival_ns": 1, "prompt_tokens": 32000,
             "output_tokens": 1000},
            {"request_id": "zero", "arrival_ns": 2, "prompt_tokens": 10, "output_tokens": 0},
            {"request_id": "orphan", "arrival_ns": None, "prompt_tokens": 10,
             "output_tokens": 3, "think_ns": 5, "session_id": "nobody"}]
    res = replay(k, request_set(rows))
    by = {r["request_id"]: r for r in res.requests.to_pylist()}
    assert by["ok"]["status"] == "finished" and by["ok"]["reason"] is None
    assert "max_model_len 32768" in by["long"]["reason"]
    assert "output_tokens (0)" in by["zero"]["reason"]
    assert "session 'nobody'" in by["orphan"]["reason"]
    assert res.rejects.column("request_id").to_pylist() == ["long", "zero", "orphan"]
    assert res.requests.num_rows == 4  # nothing dropped
    tiny = replay(k, request_set(rows[:1] + [{"arrival_ns": 3, "prompt_tokens": 100,
                                              "output_tokens": 100}]),
                  ReplayOptions(num_blocks=10))
    assert "needs 13 KV blocks" in tiny.requests.column("reason").to_pylist()[1]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="estimate must be one of"):
        ReplayOptions(estimate="fast")
    with pytest.raises(ValueError, match="router must be one of"):
        ReplayOptions(router="random")
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer"):
        ReplayOptions(max_num_seqs=0)
    with pytest.raises(ValueError, match="calibration"):
        replay(kernel_for(), request_set([{"arrival_ns": 0, "prompt_tokens": 5,
                                           "output_tokens": 1}]),
               ReplayOptions(estimate="calibrated"))
    with pytest.raises(ValueError, match="slo: unknown key"):
        replay(kernel_for(), request_set([{"arrival_ns": 0, "prompt_tokens": 5,
                                           "output_tokens": 1}]), slo={"latency": 1.0})


def test_closed_loop_sessions_follow_their_previous_request(k):
    # A session's next request arrives think_ns after the previous one's last token (plus
    # the completion overhead) reaches the user.
    rows = [{"request_id": "s1", "arrival_ns": 0, "prompt_tokens": 50, "output_tokens": 4,
             "session_id": "u"},
            {"request_id": "s2", "arrival_ns": None, "prompt_tokens": 60, "output_tokens": 3,
             "session_id": "u", "think_ns": 2_000_000}]
    res = replay(k, request_set(rows))
    a, b = res.requests.to_pylist()
    assert b["arrival_ns"] == a["finish_ns"] + 2_000_000
    assert b["status"] == "finished"


def test_goodput_against_slos(k):
    rows = [{"arrival_ns": i * 1000, "prompt_tokens": 2000, "output_tokens": 10}
            for i in range(20)]
    res = replay(k, request_set(rows), slo={"ttft": 10.0})
    assert res.summary["goodput_requests"] == 20
    ttfts = sorted(res.requests.column("ttft_ns").to_pylist())
    cut = (ttfts[9] + ttfts[10]) / 2 / 1e9
    res = replay(k, request_set(rows), slo={"ttft": cut})
    assert res.summary["goodput_requests"] == 10
    assert res.summary["slo_attainment"] == 0.5


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 10**12)), max_size=60),
       st.booleans())
def test_per_request_percentiles_match_numpy(pairs, fractional):
    from kernel.replay.results import run_percentiles

    groups = np.array([g for g, _ in pairs], np.int64)
    values = np.array([v + (0.5 if fractional else 0) for _, v in pairs], np.float64)
    order = np.argsort(groups, kind="stable")  # each group's values one run after another
    p50, p99 = run_percentiles(values[order], np.bincount(groups, minlength=7), (0.5, 0.99))
    for g in range(7):
        mine = values[groups == g]
        if mine.size == 0:
            assert p50[g] == -1 and p99[g] == -1
        else:
            assert p50[g] == pytest.approx(np.percentile(mine, 50))
            assert p99[g] == pytest.approx(np.percentile(mine, 99))


def test_calibrated_estimate_drives_the_clock():
    # estimate="calibrated" advances each step by the kernel's calibrated price (here a law
    # doubling every term of every phase plus 1 µs), and the stamp-able options say so.
    k = kernel_for()
    terms = ("sm", "hbm", "nvlink", "nic", "host")
    doc = {"kind": "Calibration", "version": 1, "name": "x2", "model": "llama-3.1-8b-instruct",
           "chip": "h100",
           "phases": {p: {"multipliers": dict.fromkeys(terms, 2.0), "constant_ns": 1000.0}
                      for p in ("prefill", "decode", "mixed")}}
    kc = k.with_calibration(doc, force=True)
    rows = [{"arrival_ns": i * 3_000_000, "prompt_tokens": 200 + 50 * i, "output_tokens": 5}
            for i in range(8)]
    res = replay(kc, request_set(rows), ReplayOptions(estimate="calibrated"))
    plain = replay(k, request_set(rows))
    assert res.summary["options"]["estimate"] == "calibrated"
    priced = kc.price(res.steps).sort("batch_id")
    assert priced["calibrated_ns"].to_list() == res.engine_steps.sort_by("batch_id").column(
        "batch_ns").to_pylist()
    assert res.summary["e2e_s_mean"] > plain.summary["e2e_s_mean"]
