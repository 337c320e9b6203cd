"""The scalar decode fast path (kernel.model.step_fast) equals the shared path bit for bit.

The shared path is ``finish(compose(r, summarise(r, batch)))`` — the arithmetic the bulk path
also runs — so equality here keeps scalar == bulk. Pools are drawn at random around the
hand-built fixtures (shape-aware GEMMs, experts, windowed secondaries, no measured decode rate,
collectives that cross nodes or are unpriced, SM budgets), batches at random (all-decode, so
the fast path runs, and mixed, so it must step aside).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.model import step, step_fast
from kernel.model.resolved import ALL_REDUCE, PlannedAttention, PlannedCollective, ResolvedPool
from kernel.model.types import Batch, Request, Resource, StepEstimate
from tests.fixtures_pools import (
    ckey,
    dense_layer,
    make_pool,
    mamba_layer,
    mla_layer,
    replace_coeffs,
    tiny_dense,
    tiny_hybrid,
    tiny_moe_mla,
    tiny_pcp,
)

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def shared(r: ResolvedPool, batch: Batch) -> tuple[StepEstimate, dict[Resource, int]]:
    per: dict[Resource, int] = {}
    return step.finish(step.compose(r, step.summarise(r, batch)), per), per


def assert_identical(r: ResolvedPool, batch: Batch) -> None:
    per: dict[Resource, int] = {}
    got = step.step_time_into(r, batch, per)
    want, want_per = shared(r, batch)
    assert (got.overlap, got.no_overlap, got.bottleneck) == (
        want.overlap, want.no_overlap, want.bottleneck)
    assert list(per.items()) == list(want_per.items())  # same keys, same order, same ns
    assert got.per_resource is per
    assert step.step_time_into(r, batch, None).per_resource is None
    p = step.prepared(r)
    fast = step_fast.totals(p, p.fast, batch) if p.fast is not None else None
    if fast is not None:  # the float totals too: a reordered sum rarely moves an integer ns
        t = step.compose(r, step.summarise(r, batch))
        want_t = (t.sm_s, t.hbm_s, t.nvlink_s, t.nic_s, t.host_s, t.host_ns, t.overlap_s)
        assert [_bits(x) for x in fast] == [_bits(x) for x in want_t]


def _bits(x: Any) -> Any:
    return float(x).hex() if isinstance(x, float) else x


@st.composite
def pools(draw: Any) -> ResolvedPool:
    """A random pool around the fixtures: every branch the fast path specialises."""
    base = draw(st.sampled_from(["dense", "moe", "hybrid", "pcp", "window", "norate"]))
    coeff: dict[str, Any] = dict(
        eps_max=draw(st.sampled_from([0.8, 0.55, 0.93])),
        m_half=draw(st.sampled_from([0.0, 100.0, 37.5])),
        shape_aware=draw(st.booleans()),
        n_half=draw(st.sampled_from([0.0, 512.0])),
        k_half=draw(st.sampled_from([0.0, 300.0])),
        attention_rate_bps=draw(st.sampled_from([1e12, 3.3e12])),
        moe_imbalance=draw(st.sampled_from([1.0, 1.25])),
    )
    coll = ckey(ALL_REDUCE, "tp", 2, floor_ns=draw(st.sampled_from([0, 10_000])),
                peak=draw(st.sampled_from([0.0, 100e9, 37e9])),
                trans=draw(st.sampled_from([0.0, 50e9])), crosses=draw(st.booleans()),
                span=draw(st.sampled_from([1.0, 1.75])))
    if base == "dense":
        r = tiny_dense()
    elif base == "moe":
        r = tiny_moe_mla(dcp=1)
    elif base == "hybrid":
        r = tiny_hybrid()
    elif base == "pcp":
        r = tiny_pcp(pcp=2)
    elif base == "window":  # a windowed, compressed secondary attention that reads no KV
        second = PlannedAttention(8, 1, 64, "swa", draw(st.sampled_from([0, 128, 4096])), "index",
                                  draw(st.sampled_from([0, 4])))
        layer = dense_layer(attentions=(PlannedAttention(8, 2, 128, "gqa", 0, "", 0), second))
        r = make_pool(layers=(layer, mamba_layer(count=2)),
                      coeff_kw=dict(attention_by_kind={"swa": (3_000, 9e11)},
                                    recurrent={"mamba2": (15_000, 2e6)}))
    else:  # no measured decode rate: KV read at HBM speed
        r = make_pool(layers=(dense_layer(), mla_layer(count=2)),
                      coeff_kw=dict(attention_rate_bps=0.0))
        coeff["attention_rate_bps"] = 0.0
    r = replace_coeffs(r, **coeff)
    colls = dict(r.collectives)
    colls[(ALL_REDUCE, "tp")] = coll
    r = dataclasses.replace(r, collectives=colls,
                            chip_sm_count=draw(st.sampled_from([0, 132])),
                            uniform_decode_width=draw(st.sampled_from([1, 2])),
                            capture_tokens=draw(st.sampled_from([0, 8, 512])))
    if draw(st.booleans()):  # a second collective per layer, top-k routed
        plan = r.plan
        layers = tuple(dataclasses.replace(
            pl, collectives=(*pl.collectives, PlannedCollective(ALL_REDUCE, "tp", 333.0, True)))
            for pl in plan.layers)
        r = dataclasses.replace(r, plan=dataclasses.replace(plan, layers=layers),
                                layout=dataclasses.replace(r.layout, enable_expert_parallel=True,
                                                           all2all_backend="deepep"))
    return r


decode_batches = st.builds(
    lambda reqs, thr, budget: Batch(reqs, decode_threshold=thr, sm_budget=budget),
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 300_000)), min_size=1, max_size=300),
    st.sampled_from([4, 8, 128]),
    st.sampled_from([0, 0, 1, 66, 131, 132, 200]),
)
any_batches = st.builds(
    lambda reqs, thr, budget: Batch(reqs, decode_threshold=thr, sm_budget=budget),
    st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 300_000)), max_size=40),
    st.sampled_from([1, 4, 8]),
    st.sampled_from([0, 66]),
)


@SETTINGS
@given(pools(), st.lists(decode_batches, min_size=1, max_size=6))
def test_decode_fast_path_is_the_shared_path_bit_for_bit(r: ResolvedPool,
                                                         batches: list[Batch]) -> None:
    p = step.prepared(r)
    assert p.fast is not None  # these pools are all eligible: the path under test runs
    for batch in batches:
        assert step_fast.step(p, p.fast, batch, {}) is not None
        assert_identical(r, batch)
        assert_identical(r, batch)  # a second call reads the per-token-count table


@SETTINGS
@given(pools(), any_batches)
def test_any_batch_prices_as_the_shared_path(r: ResolvedPool, batch: Batch) -> None:
    assert_identical(r, batch)


@pytest.mark.parametrize("r", [tiny_moe_mla(dcp=2), tiny_moe_mla(dcp=4, backend="a2a"),
                               replace_coeffs(tiny_dense(), eps_max=0.0)],
                         ids=["dcp2", "dcp4", "degenerate"])
def test_ineligible_pools_take_the_shared_path(r: ResolvedPool) -> None:
    assert step.prepared(r).fast is None
    assert_identical(r, Batch([(1, 4095)] * 32, decode_threshold=8))


def test_prefill_and_empty_batches_step_aside() -> None:
    r = tiny_dense()
    p = step.prepared(r)
    assert p.fast is not None
    for batch in (Batch([]), Batch([(512, 0), (1, 100)]), Batch([(0, 10)]),
                  Batch([(9, 100)], decode_threshold=8)):
        assert step_fast.step(p, p.fast, batch, {}) is None
        assert_identical(r, batch)


def test_nan_and_infinite_totals_summarise_as_finish() -> None:
    per: dict[Resource, int] = {}
    got = step_fast.summarize((math.nan, math.inf, 0.0, 1e-3, 2e-6, 2_000, math.nan), per)
    want_per: dict[Resource, int] = {}
    want = step.finish(step.StepTotals(math.nan, math.inf, 0.0, 1e-3, 2e-6, 2_000, math.nan,
                                       False), want_per)
    assert got == want and list(per.items()) == list(want_per.items())


def test_table_is_bounded() -> None:
    r = tiny_dense()
    p = step.prepared(r)
    assert p.fast is not None
    for n in range(1, step_fast._TABLE_MAX + 50, 97):
        step.step_time_into(r, Batch([Request(1, 10)] * n, decode_threshold=8), None)
    assert 0 < len(p.fast.table) <= step_fast._TABLE_MAX
