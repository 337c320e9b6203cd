"""Properties of StepTime (model.md §14.6; case 143, §14.5).

* compose on an array summary == K scalar composes, bit for bit (the bulk path's contract);
* the all-decode fast path of summarise == the general walk;
* metamorphic relations: Overlap <= NoOverlap, bottleneck is the largest resource,
  Overlap >= PerResource[bottleneck], context growth adds exactly ΔKV/rate to HBM (case 115
  style), monotone in batch size and context, host constant for uniform decodes, a ×10
  collective floor moves the step by 9·t0 per launch.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.model import step
from kernel.model.resolved import ResolvedPool
from kernel.model.types import Batch, Resource
from tests.fixtures_pools import tiny_dense, tiny_hybrid, tiny_moe_mla, tiny_pcp

POOLS: dict[str, ResolvedPool] = {
    "dense": tiny_dense(),
    "moe_mla_dcp2": tiny_moe_mla(dcp=2),
    "moe_mla_dcp4_a2a": tiny_moe_mla(dcp=4, backend="a2a"),
    "pcp2": tiny_pcp(pcp=2),
    "pcp4": tiny_pcp(pcp=4),
    "hybrid": tiny_hybrid(),
    "dense_budget": dataclasses.replace(tiny_dense(), chip_sm_count=132),
}

request = st.tuples(st.integers(0, 3000), st.integers(0, 200_000))
decode_req = st.tuples(st.integers(1, 4), st.integers(0, 200_000))
batches = st.builds(
    lambda reqs, thr, budget: Batch(reqs, decode_threshold=thr, sm_budget=budget),
    st.lists(st.one_of(request, decode_req, st.just((1, 4095))), max_size=40),
    st.sampled_from([1, 4, 8, 128]),
    st.sampled_from([0, 0, 66, 132, 200]),
)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _assert_same(a: Any, b: Any, what: str) -> None:
    if isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float | np.floating) and math.isnan(b), what
        return
    assert a == b, what
    assert type(a) is not float or float(b).hex() == a.hex(), what


@pytest.mark.parametrize("name", sorted(POOLS))
@SETTINGS
@given(bs=st.lists(batches, min_size=1, max_size=12))
def test_array_compose_equals_scalar_compose(name: str, bs: list[Batch]) -> None:
    r = POOLS[name]
    summaries = [step.summarise(r, b) for b in bs]
    scalar = [step.compose(r, s) for s in summaries]
    arr = step.compose(r, step.stack_summaries(summaries))
    for field in step.StepTotals._fields:
        col = np.broadcast_to(np.asarray(getattr(arr, field)), (len(bs),))
        for i, t in enumerate(scalar):
            _assert_same(getattr(t, field), col[i].item(), f"{name} {field} batch {i}")


@pytest.mark.parametrize("name", sorted(POOLS))
@SETTINGS
@given(b=batches)
def test_fast_walk_equals_general_walk(name: str, b: Batch) -> None:
    r = POOLS[name]
    assert step.summarise(r, b) == step._walk(step.prepared(r), b)


@SETTINGS
@given(n=st.integers(1, 256), ctx=st.integers(1, 100_000), w=st.integers(1, 4))
def test_fast_walk_on_uniform_decodes(n: int, ctx: int, w: int) -> None:
    r = POOLS["dense"]
    b = Batch([(w, ctx)] * n, decode_threshold=8)
    assert step.summarise(r, b) == step._walk(step.prepared(r), b)


@pytest.mark.parametrize("name", sorted(POOLS))
@SETTINGS
@given(b=batches)
def test_estimate_invariants(name: str, b: Batch) -> None:
    """case 143: Overlap <= NoOverlap; PerResource[Bottleneck] is the max; Overlap >=
    PerResource[Bottleneck]; NoOverlap is the integer sum; empty batch → host."""
    r = POOLS[name]
    est = step.step_time_into(r, b, {})
    per = est.per_resource
    assert per is not None
    assert est.overlap <= est.no_overlap
    assert est.no_overlap == sum(per.values())
    assert per[est.bottleneck] == max(per.values())
    assert est.overlap >= per[est.bottleneck]
    if b.tokens() == 0:
        assert est.bottleneck is Resource.HOST and list(per) == [Resource.HOST]
    else:
        assert Resource.HOST in per


@pytest.mark.parametrize("name", ["dense", "hybrid", "moe_mla_dcp2"])
@SETTINGS
@given(n=st.integers(1, 64), ctx=st.integers(16, 60_000), grow=st.integers(1, 60_000))
def test_growing_one_decode_context_adds_kv_over_rate(name: str, n: int, ctx: int,
                                                      grow: int) -> None:
    """case 115 style: growing one decode's context adds ΔKV_read·κ/L_kv/rate per layer."""
    r = POOLS[name]
    base = Batch([(1, ctx)] * n, decode_threshold=8)
    grown = Batch([(1, ctx)] * (n - 1) + [(1, ctx + grow)], decode_threshold=8)
    a = step.compose(r, step.summarise(r, base))
    b = step.compose(r, step.summarise(r, grown))
    sa, sb = step.summarise(r, base), step.summarise(r, grown)
    reads_a = sa.decode_reads[0] if sa.decode_reads else sa.decode_kv_tokens
    reads_b = sb.decode_reads[0] if sb.decode_reads else sb.decode_kv_tokens
    delta = 0.0
    for layer in r.plan.layers:
        if layer.attn_q_heads > 0:
            floor_rate = r.coefficients.attention_by_kind.get(
                layer.attn_kind, (0, r.coefficients.attention_rate_bps))
            delta += layer.count * ((reads_b - reads_a) * (r.kv_bytes_per_token / r.kv_layers)
                                    / floor_rate[1])
    assert b.hbm_s - a.hbm_s == pytest.approx(delta, rel=1e-9, abs=1e-15)
    assert b.sm_s == a.sm_s


@pytest.mark.parametrize("name", sorted(POOLS))
@SETTINGS
@given(n=st.integers(1, 200), ctx=st.integers(1, 50_000), extra=st.integers(1, 50))
def test_monotone_in_batch_size_and_context(name: str, n: int, ctx: int, extra: int) -> None:
    r = POOLS[name]
    a = step.step_time_into(r, Batch([(1, ctx)] * n, decode_threshold=8), {})
    more = step.step_time_into(r, Batch([(1, ctx)] * (n + extra), decode_threshold=8), {})
    longer = step.step_time_into(r, Batch([(1, ctx + 1000)] * n, decode_threshold=8), {})
    assert more.no_overlap >= a.no_overlap
    assert longer.no_overlap >= a.no_overlap
    assert longer.overlap >= a.overlap


@SETTINGS
@given(n=st.integers(1, 512), ctx=st.integers(1, 100_000), q=st.integers(1, 1))
def test_host_constant_for_uniform_decodes_under_piecewise(n: int, ctx: int, q: int) -> None:
    """case 108 style: under PIECEWISE every uniform decode within capture pays the same
    host time: replay × segments + launch × kernels."""
    r = dataclasses.replace(POOLS["dense"], decode_graph_mode="PIECEWISE")
    est = step.step_time_into(r, Batch([(q, ctx)] * n, decode_threshold=8), {})
    assert est.per_resource is not None
    t = step.compose(r, step.summarise(r, Batch([(q, ctx)] * n, decode_threshold=8)))
    assert t.host_ns == 5_000 * 5 + 26 * 1_000


@pytest.mark.parametrize(("name", "key", "launches"), [
    ("dense", ("all_reduce", "tp"), 4),
    ("moe_mla_dcp2", ("reduce_scatter", "dcp"), 6),
    ("moe_mla_dcp4_a2a", ("all2all", "dcp"), 6),
])
def test_floor_times_ten_moves_step_by_nine_t0_per_launch(name: str, key: tuple[str, str],
                                                          launches: int) -> None:
    """model.md §14.6: ×10 on one collective floor → NoOverlap rises by 9·t0 per launch iff
    that collective launches (decode moves; a pure prefill does not launch the DCP combine)."""
    r = POOLS[name]
    k = r.collectives[key]
    r10 = dataclasses.replace(r, collectives={
        **r.collectives, key: dataclasses.replace(k, floor_ns=k.floor_ns * 10)})
    dec = Batch([(1, 100)] * 4, decode_threshold=8)
    a = step.step_time_into(r, dec, {})
    b = step.step_time_into(r10, dec, {})
    per_a, per_b = a.per_resource, b.per_resource
    assert per_a is not None and per_b is not None
    moved = per_b[Resource.NVLINK] - per_a[Resource.NVLINK]
    assert abs(moved - launches * 9 * k.floor_ns) <= 2
    if key[1] == "dcp":
        pre = Batch([(2048, 0)], decode_threshold=8)
        assert step.step_time_into(r10, pre, {}) == step.step_time_into(r, pre, {})


def test_thread_safety_identical_answers() -> None:
    """Price from many threads at once (fresh pools, so preparation races too)."""
    pools = [tiny_dense(), tiny_moe_mla(dcp=2), tiny_pcp(), tiny_hybrid()]
    bs = [Batch([(1, 4095)] * 32, decode_threshold=8), Batch([(512, 0), (1, 100)]),
          Batch([(300, 5000), (2, 17), (1, 9)], decode_threshold=1, sm_budget=66), Batch([])]
    expected = [[step.step_time_into(dataclasses.replace(p), b, {}) for b in bs] for p in pools]
    results: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            out = [[step.step_time_into(p, b, {}) for b in bs] for p in pools]
            results.append(out)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(res == expected for res in results) and len(results) == 16


def test_array_context_runs_of_different_lengths() -> None:
    """The 2-D zero-padded run array with different run counts and chunk counts per batch
    (mla_context_chunk 4096) gives each batch's scalar bits."""
    r = POOLS["moe_mla_dcp2"]
    bs = [Batch([(300, 6000), (100, 0), (200, 40_000), (50, 1000)], decode_threshold=8),
          Batch([(30, 100)], decode_threshold=8),
          Batch([(1, 100)] * 3, decode_threshold=8),
          Batch([(64, 9000), (64, 9000), (2, 5)], decode_threshold=1),
          Batch([])]
    summaries = [step.summarise(r, b) for b in bs]
    assert [len(s.context_runs) for s in summaries] == [2, 1, 0, 1, 0]
    arr = step.compose(r, step.stack_summaries(summaries))
    for i, s in enumerate(summaries):
        t = step.compose(r, s)
        for f in step.StepTotals._fields:
            assert getattr(t, f) == getattr(arr, f)[i], (f, i)
