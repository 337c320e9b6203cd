"""The replay's scheduler against vLLM v0.31.0's rules, worked by hand (docs/model.md §16).

Each test states the vLLM rule it pins (``vllm/v1/core/sched/scheduler.py: Scheduler.schedule``
and friends) and the batches that rule gives, worked out on paper. Times are the kernel's own
prices of those batches, so the expectations are batches, not copied outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernel import Batch, Request
from kernel.replay import ReplayOptions, replay
from tests.replay_support import kernel_for, request_set


def batches(result):
    """{batch_id: [(request_id, scheduled, computed, cached_tokens), ...]} in batch order."""
    t = result.steps.to_pylist()
    out: dict[int, list[tuple[str, int, int, int]]] = {}
    for r in t:
        out.setdefault(r["batch_id"], []).append(
            (r["request_id"], r["scheduled"], r["computed"], r["cached_tokens"]))
    return [out[b] for b in sorted(out)]


def req(result, rid):
    return next(r for r in result.requests.to_pylist() if r["request_id"] == rid)


@pytest.fixture(scope="module")
def k():
    return kernel_for()


def test_chunked_prefill_under_the_token_budget(k):
    # Rule: Phase A gives a running request the rest of its prompt capped by the budget left
    # (a chunked-prefill continuation); Phase B admits waiting requests while budget > 0.
    # A: 250 prompt tokens, budget 100 -> chunks 100, 100, 50. B arrives while A's first
    # chunk runs (async off: polled for the next step) but step 2's budget is spent on A;
    # B gets 30 tokens beside A's last 50 in step 3; both decode in step 4 and finish.
    adm_a = k.admission_overhead(250)
    rs = request_set([{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 250,
                       "output_tokens": 2},
                      {"request_id": "B", "arrival_ns": adm_a + 1, "prompt_tokens": 30,
                       "output_tokens": 2}])
    res = replay(k, rs, ReplayOptions(max_num_batched_tokens=100, async_scheduling=False))
    assert batches(res) == [
        [("A", 100, 0, 0)],
        [("A", 100, 100, 0)],
        [("A", 50, 200, 0), ("B", 30, 0, 0)],
        [("A", 1, 250, 0), ("B", 1, 30, 0)],
    ]
    # The first token comes from the step that finishes the prefill (step 3 for both).
    steps = res.steps.to_pylist()
    end3 = next(r["step_end_ns"] for r in steps if r["batch_id"] == 2)
    otok = k.output_token_overhead()
    assert req(res, "A")["first_token_ns"] == end3 + otok
    assert req(res, "B")["first_token_ns"] == end3 + otok


def test_long_prefill_threshold_caps_every_request(k):
    # Rule: long_prefill_token_threshold (> 0) caps each request's tokens per step, in both
    # phases. Threshold 64, budget 1000: A (100 tokens) gets 64 then 36.
    rs = request_set([{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 100,
                       "output_tokens": 1}])
    res = replay(k, rs, ReplayOptions(long_prefill_token_threshold=64,
                                      max_num_batched_tokens=1000))
    assert batches(res) == [[("A", 64, 0, 0)], [("A", 36, 64, 0)]]


def test_async_scheduling_sees_an_arrival_one_step_later(k):
    # Rule (async, vllm/v1/engine/core.py: step_with_batch_queue): step j+1 is scheduled
    # while step j runs, so a request ready during step j first runs in step j+2; with async
    # off it runs in step j+1. A decodes for many steps; B becomes ready during A's 3rd step.
    a = {"request_id": "A", "arrival_ns": 0, "prompt_tokens": 64, "output_tokens": 20}
    probe = replay(k, request_set([a]), ReplayOptions(async_scheduling=False))
    s = probe.steps.to_pylist()
    during_third = (s[2]["step_start_ns"] + s[2]["step_end_ns"]) // 2
    b = {"request_id": "B", "arrival_ns": during_third - k.admission_overhead(16),
         "prompt_tokens": 16, "output_tokens": 2}
    for async_on, first in ((False, 3), (True, 4)):
        res = replay(k, request_set([a, b]), ReplayOptions(async_scheduling=async_on))
        first_b = next(i for i, bt in enumerate(batches(res)) if any(x[0] == "B" for x in bt))
        assert first_b == first, async_on


def test_preemption_of_the_newest_running_request(k):
    # Rules: a running request that cannot grow preempts the tail of `running` (the newest),
    # here itself, which stops Phase A (scheduler.py: Scheduler.schedule); preemption is
    # recompute (num_computed_tokens = 0, front of waiting, _preempt_request); no admission
    # in a step with a preemption; admission needs the whole current sequence to fit
    # (scheduler_reserve_full_isl). 8 blocks of 16 tokens, no prefix cache, async off.
    # A: 48 + 40 tokens, B: 32 + 40. Worked by hand (steps numbered from 1):
    #  1: A 48            (A holds 3 blocks)
    #  2: A 1, B 32       (A 4, B 2: 2 free)
    #  3..18: both decode; A takes its 5th block in step 18 (context 65): 0 free
    #  19: B needs a 4th block (context 49): no block, B is the newest: B preempted (it had
    #      computed 48 tokens and sampled 17); A alone. 3 free.
    #  20..40: B needs 4 blocks for its 49 known tokens: waits; A takes its 6th block at
    #      step 34 and finishes at step 40 (40 tokens: 1 + 39 decodes).
    #  41: B re-prefills 49 tokens from 0; 42..63: 22 decodes to 40 tokens.
    rs = request_set([{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 48,
                       "output_tokens": 40},
                      {"request_id": "B", "arrival_ns": k.admission_overhead(48) + 1,
                       "prompt_tokens": 32, "output_tokens": 40}])
    res = replay(k, rs, ReplayOptions(num_blocks=8, enable_prefix_caching=False,
                                      async_scheduling=False))
    bt = batches(res)
    assert len(bt) == 63
    assert bt[1] == [("A", 1, 48, 0), ("B", 32, 0, 0)]
    assert bt[17] == [("A", 1, 64, 0), ("B", 1, 47, 0)]
    assert bt[18] == [("A", 1, 65, 0)]
    assert all([x[0] for x in b] == ["A"] for b in bt[18:40])
    assert bt[40] == [("B", 49, 0, 0)]
    assert all(b == [("B", 1, 49 + i, 0)] for i, b in enumerate(bt[41:]))
    b = req(res, "B")
    assert (b["preemptions"], b["recomputed_tokens"]) == (1, 48)
    es = res.engine_steps.to_pylist()
    assert max(e["kv_used"] for e in es) == 8


def test_prefix_hit_is_whole_blocks_below_the_last_token(k):
    # Rules (kv_cache_manager.py: get_computed_blocks; single_type_kv_cache_manager.py:
    # find_longest_cache_hit): the hit is the longest run of cached leading blocks, at most
    # num_tokens - 1 tokens; the hit tokens are computed tokens of the admission step.
    # A caches blocks h1..h4 (64 tokens). B shares 3 blocks: hits 48, computes 16.
    # C is A's prompt again: the limit leaves 3 blocks (48), not 64.
    rows = [{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": [1, 2, 3, 4]},
            {"request_id": "B", "arrival_ns": 10**9, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": [1, 2, 3, 9]},
            {"request_id": "C", "arrival_ns": 2 * 10**9, "prompt_tokens": 64,
             "output_tokens": 1, "prefix_hashes": [1, 2, 3, 4]}]
    res = replay(k, request_set(rows, hash_block_tokens=16))
    assert batches(res) == [[("A", 64, 0, 0)], [("B", 16, 48, 48)], [("C", 16, 48, 48)]]
    assert req(res, "B")["cached_tokens"] == 48


def test_prefix_cache_evicts_the_tail_block_first(k):
    # Rules (block_pool.py: free_blocks, get_new_blocks; kv_cache_utils.py:
    # FreeKVCacheBlockQueue): a finished request's hashed blocks join the back of the free
    # queue tail first; new blocks come from the front, unhashed blocks before cached ones.
    # 6 blocks: A (h1..h4) finishes, leaving 2 unhashed + [h4, h3, h2, h1]. X (4 unhashed
    # blocks of its own) takes the 2 unhashed and evicts h4, h3. B (h1, h2, h3, h9) hits 2.
    rows = [{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": [1, 2, 3, 4]},
            {"request_id": "X", "arrival_ns": 10**9, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": [11, 12, 13, 14]},
            {"request_id": "B", "arrival_ns": 2 * 10**9, "prompt_tokens": 64,
             "output_tokens": 1, "prefix_hashes": [1, 2, 3, 9]}]
    res = replay(k, request_set(rows, hash_block_tokens=16), ReplayOptions(num_blocks=6))
    assert batches(res)[2] == [("B", 32, 32, 32)]


def test_hash_blocks_map_onto_a_larger_engine_block(k):
    # The source hashes 8-token blocks; the engine's blocks are 16: block j is entry 2j+1.
    rows = [{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": list(range(1, 9))},
            {"request_id": "B", "arrival_ns": 10**9, "prompt_tokens": 64, "output_tokens": 1,
             "prefix_hashes": [1, 2, 3, 4, 5, 99, 7, 8]}]
    res = replay(k, request_set(rows, hash_block_tokens=8))
    # entries 1..5 equal cover 40 tokens: engine blocks 0 and 1 (entries 2 and 4) equal,
    # block 2 (entry 6) differs: a hit of 32 tokens.
    assert batches(res)[1] == [("B", 32, 32, 32)]


@pytest.mark.parametrize("router, engines", [("round_robin", [0, 1, 0]),
                                            ("least_loaded", [0, 1, 1])])
def test_dp_routing(k, router, engines):
    # Rule (core_client.py: DPLBAsyncMPClient.get_core_engine_for_request): least loaded =
    # lowest waiting + running, ties broken from a rotating start. R0 is long and stays on
    # core 0; R1 (one token) finishes on core 1 before R2 arrives: round robin sends R2 back
    # to core 0, least loaded to the empty core 1.
    rows = [{"request_id": "R0", "arrival_ns": 0, "prompt_tokens": 32, "output_tokens": 500},
            {"request_id": "R1", "arrival_ns": 1, "prompt_tokens": 32, "output_tokens": 1},
            {"request_id": "R2", "arrival_ns": 10**9, "prompt_tokens": 32,
             "output_tokens": 2}]
    res = replay(k, request_set(rows), ReplayOptions(dp=2, lockstep=False, router=router))
    assert res.requests.column("engine").to_pylist() == engines


def test_lockstep_dp_steps_last_as_long_as_the_slowest_rank(k):
    # MoE DP ranks step together (core.py: DPEngineCoreProc.run_busy_loop); the replay's
    # step lasts as long as the slowest rank's batch.
    rows = [{"arrival_ns": i * 1000, "prompt_tokens": 100 + 300 * i, "output_tokens": 5}
            for i in range(4)]
    res = replay(k, request_set(rows), ReplayOptions(dp=2, lockstep=True,
                                                     router="round_robin"))
    es = res.engine_steps.to_pylist()
    by_step: dict[int, list[dict]] = {}
    for e in es:
        by_step.setdefault(e["group_step"], []).append(e)
    assert any(len(v) == 2 for v in by_step.values())
    for v in by_step.values():
        assert all(e["step_ns"] == max(x["batch_ns"] for x in v) for e in v)
        assert len({(e["start"], e["end"]) for e in v}) == 1


def _price(k, reqs):  # the replay's default clock (decision MO3)
    return k.step_time(Batch([Request(*r) for r in reqs])).overlap


@pytest.mark.parametrize("async_on", [True, False])
def test_lone_request_closed_form(k, async_on):
    # TTFT = admission + the prefill steps' prices + one output-token overhead; each ITL =
    # that decode step's price + the output-token overhead; E2E adds the completion overhead.
    p, o, budget = 300, 6, 128
    res = replay(k, request_set([{"arrival_ns": 5, "prompt_tokens": p, "output_tokens": o}]),
                 ReplayOptions(max_num_batched_tokens=budget, async_scheduling=async_on))
    r = res.requests.to_pylist()[0]
    otok = k.output_token_overhead()
    chunks = [(128, 0, p), (128, 128, p), (44, 256, p)]
    prefill = sum(_price(k, [c]) for c in chunks)
    assert r["ttft_ns"] == k.admission_overhead(p) + prefill + otok
    decodes = [_price(k, [(1, p + i, p)]) for i in range(o - 1)]
    assert r["tpot_mean_ns"] == pytest.approx((sum(decodes) + (o - 1) * otok) / (o - 1))
    itl = np.array(decodes) + otok
    assert r["itl_p50_ns"] == pytest.approx(float(np.percentile(itl, 50)))
    assert r["itl_p99_ns"] == pytest.approx(float(np.percentile(itl, 99)))
    assert r["e2e_ns"] == (k.admission_overhead(p) + prefill + sum(decodes) + o * otok
                           + k.completion_overhead())


def test_far_below_capacity_every_request_gets_the_lone_latency(k):
    # At one request every 100 s nobody queues: TTFT and ITL are the lone closed forms.
    rng = np.random.default_rng(3)
    rows = [{"arrival_ns": int(i * 100e9), "prompt_tokens": int(rng.integers(10, 3000)),
             "output_tokens": int(rng.integers(2, 30))} for i in range(10)]
    res = replay(k, request_set(rows))
    otok = k.output_token_overhead()
    for row, r in zip(rows, res.requests.to_pylist(), strict=True):
        p = row["prompt_tokens"]
        assert r["ttft_ns"] == k.admission_overhead(p) + _price(k, [(p, 0, p)]) + otok
        assert r["queue_ns"] == k.admission_overhead(p)
        itl = [_price(k, [(1, p + i, p)]) + otok for i in range(row["output_tokens"] - 1)]
        assert r["itl_p50_ns"] == pytest.approx(float(np.percentile(itl, 50)))


def test_raising_the_rate_never_lowers_mean_ttft(k):
    rng = np.random.default_rng(7)
    n = 120
    gaps = rng.exponential(1.0, n)
    prompt = rng.integers(100, 4000, n)
    output = rng.integers(5, 120, n)
    means = []
    for rate in (1, 4, 16, 64, 256):
        arr = np.cumsum(gaps / rate * 1e9).astype(np.int64)
        rows = [{"arrival_ns": int(a), "prompt_tokens": int(p), "output_tokens": int(o)}
                for a, p, o in zip(arr, prompt, output, strict=True)]
        res = replay(k, request_set(rows))
        means.append(res.summary["ttft_s_mean"])
    assert all(b >= a for a, b in zip(means, means[1:], strict=False)), means
    assert means[-1] > 2 * means[0]
