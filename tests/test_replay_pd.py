"""Disaggregated prefill/decode replay: prefill pool, priced KV handoff on shared links,
decode pool (deepseek-v3-h200-1p1d: prefill TP8 on node 0, decode TP4 × DP2 on node 1)."""

from __future__ import annotations

import pytest

from kernel import Batch, Placement, Request
from kernel.replay import ReplayOptions, replay
from kernel.replay.api import open_pools
from tests.replay_support import request_set


@pytest.fixture(scope="module")
def pools():
    return open_pools("deepseek-v3-h200-1p1d")


def _price(k, reqs):  # the replay's default clock (decision MO3)
    return k.step_time(Batch([Request(*r) for r in reqs])).overlap


def test_lone_request_closed_form(pools):
    # TTFT = admission + the prefill step + the handoff alone + the decode pool's first step
    # (the last prompt token, its KV computed there as vLLM's connector does) + otok.
    pre, dec = pools
    p, o = 3000, 4
    res = replay(pools, request_set([{"arrival_ns": 0, "prompt_tokens": p,
                                      "output_tokens": o}]))
    r = res.requests.to_pylist()[0]
    hand = pre.pd_transfer_demand(p, Placement(0, 0, "prefill"), Placement(1, 0, "decode"))
    otok = dec.output_token_overhead()
    assert r["handoff_end_ns"] - r["handoff_start_ns"] == hand.alone_time()
    first = _price(dec, [(1, p - 1, p)])
    assert r["ttft_ns"] == (pre.admission_overhead(p) + _price(pre, [(p, 0, p)])
                            + hand.alone_time() + first + otok)
    rows = res.steps.to_pylist()
    assert [(x["pool"], x["scheduled"], x["computed"]) for x in rows] == [
        ("prefill", p, 0), ("decode", 1, p - 1), ("decode", 1, p), ("decode", 1, p + 1),
        ("decode", 1, p + 2)]
    assert r["status"] == "finished" and r["pool"] == "decode"


def test_concurrent_handoffs_share_their_links(pools):
    # Two equal prompts prefilled in one step hand off at once over the same NIC ports
    # (tx of node 0, rx of node 1): each gets half the rate, so each takes twice as long as
    # alone (the payload, not the floor, dominates).
    pre, _dec = pools
    p = 4000
    rows = [{"arrival_ns": 0, "prompt_tokens": p, "output_tokens": 2},
            {"arrival_ns": 0, "prompt_tokens": p, "output_tokens": 2}]
    res = replay(pools, request_set(rows), ReplayOptions(async_scheduling=False))
    alone = pre.pd_transfer_demand(p, Placement(0, 0, "prefill"),
                                   Placement(1, 0, "decode")).alone_time()
    got = [r["handoff_end_ns"] - r["handoff_start_ns"] for r in res.requests.to_pylist()]
    assert res.requests.column("handoff_start_ns").to_pylist()[0] == \
        res.requests.column("handoff_start_ns").to_pylist()[1]
    for g in got:
        assert abs(g - 2 * alone) <= 2
    # the decode pool's two cores each took one request (least loaded)
    assert sorted(res.requests.column("engine").to_pylist()) == [0, 1]


def test_pd_tokens_per_pool(pools):
    rows = [{"arrival_ns": i * 30_000_000, "prompt_tokens": 500 + 700 * i,
             "output_tokens": 3 + i} for i in range(6)]
    res = replay(pools, request_set(rows))
    per: dict[tuple[str, str], int] = {}
    for x in res.steps.to_pylist():
        key = (x["request_id"], x["pool"])
        per[key] = per.get(key, 0) + x["scheduled"]
    for i, r in enumerate(rows):
        assert per[(str(i), "prefill")] == r["prompt_tokens"]
        assert per[(str(i), "decode")] == r["output_tokens"]
    # each pool's rows re-price under that pool's kernel to the recorded batch prices
    for kp, name in zip(pools, ("prefill", "decode"), strict=True):
        mine = res.steps.filter(res.steps.column("pool").to_numpy(zero_copy_only=False)
                                == name)
        priced = kp.price(mine).sort("batch_id")
        assert priced["overlap_ns"].to_list() == \
            [b for _, b in sorted({(x["batch_id"], x["batch_ns"])
                                   for x in mine.to_pylist()})]


def test_pools_must_be_prefill_then_decode(pools):
    with pytest.raises(ValueError, match="prefill and decode kernels"):
        replay(list(reversed(pools)), request_set([{"arrival_ns": 0, "prompt_tokens": 5,
                                                    "output_tokens": 2}]))
