"""The scalar fast path for batches with prefill (kernel.model.step_mixed) equals the shared path bit
for bit, and the column walk (kernel.model.step.walk_columns) equals the request walk.

The shared path is ``_compose(p, _walk(p, batch))`` then ``finish`` — the arithmetic the bulk
path also runs. Pools are drawn at random around the hand-built fixtures (``tests/
test_step_fast.pools``, with the prefill coefficients drawn too: the one-kernel floor rule
both ways, no prefill scale so causal work rides the plain ramp, PCP gathers, windows), and
every embedded scenario is checked on prefill, mixed and decode batches.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel
from kernel.facade.kernel import Kernel
from kernel.model import step, step_mixed
from kernel.model.resolved import ResolvedPool
from kernel.model.types import Batch, Resource
from tests.embedded import BUILDABLE
from tests.fixtures_pools import replace_coeffs, tiny_pcp
from tests.test_step_fast import assert_identical, pools

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def prefill_pools(draw: Any) -> ResolvedPool:
    """A random fast-path pool with its prefill coefficients drawn as well."""
    r = draw(pools())
    return replace_coeffs(
        r, attention_prefill_scale=draw(st.sampled_from([0.0, 0.5, 1.3])),
        attention_prefill_floor_ns=draw(st.sampled_from([0, 5_000, 20_000])),
        attention_per_request_ns=draw(st.sampled_from([0, 0, 700])))


request = st.tuples(st.integers(0, 5000), st.integers(0, 300_000))
small = st.tuples(st.integers(0, 4), st.integers(0, 3))  # (0, 0) rows and tiny contexts
decode = st.tuples(st.integers(1, 4), st.integers(0, 300_000))
batches = st.builds(
    lambda reqs, thr, budget: Batch(reqs, decode_threshold=thr, sm_budget=budget),
    st.lists(st.one_of(request, small, decode, decode), min_size=1, max_size=40),
    st.sampled_from([-1, 0, 1, 4, 8, 128]),
    st.sampled_from([0, 0, 1, 66, 131, 200]),
)


def _bits(x: Any) -> Any:
    return float(x).hex() if isinstance(x, float) else x


def _same_summary(a: step.BatchSummary, b: step.BatchSummary) -> None:
    assert [type(x) for x in a] == [type(x) for x in b]
    assert [_bits(x) for x in a] == [_bits(x) for x in b]


def assert_mixed_identical(r: ResolvedPool, batch: Batch) -> None:
    """Column walk == request walk; step_mixed totals == _compose's, float bits included; the
    public scalar path == the shared path (estimate, per-resource map and its order)."""
    p = step.prepared(r)
    want_s = step._walk(p, batch)
    if p.fast is not None:
        sl = [q.scheduled for q in batch.requests]
        cl = [q.computed for q in batch.requests]
        got_s = step.walk_columns(p, sl, cl, set(sl), batch.decode_threshold, batch.sm_budget)
        _same_summary(got_s, want_s)
        fast = step_mixed.totals(p, p.fast, want_s)
        t = step.compose(r, want_s)
        if t.empty:
            assert fast is None
        else:
            assert fast is not None
            want_t = (t.sm_s, t.hbm_s, t.nvlink_s, t.nic_s, t.host_s, t.host_ns, t.overlap_s)
            assert [_bits(x) for x in fast] == [_bits(x) for x in want_t]
    assert_identical(r, batch)


@SETTINGS
@given(prefill_pools(), st.lists(batches, min_size=1, max_size=5))
def test_prefill_fast_path_is_the_shared_path_bit_for_bit(r: ResolvedPool,
                                                           bs: list[Batch]) -> None:
    assert step.prepared(r).fast is not None  # the path under test runs
    for b in bs:
        assert_mixed_identical(r, b)
        assert_mixed_identical(r, b)  # again: from the per-token-count table


@pytest.mark.parametrize("pcp", [2, 4])
@SETTINGS
@given(b=batches)
def test_pcp_prefill_gathers_and_withheld_tokens(pcp: int, b: Batch) -> None:
    r = tiny_pcp(pcp=pcp)
    assert step.prepared(r).fast is not None
    assert_mixed_identical(r, b)


def test_the_cases_each_branch_needs() -> None:
    """Hand-picked batches on a fixture: prefill only, mixed, a (0, 0) row, a context-only
    row (0 scheduled), a zero threshold, an empty step."""
    for r in (tiny_pcp(pcp=2), replace_coeffs(tiny_pcp(pcp=2), attention_prefill_scale=0.0)):
        for rows, thr in (([(2048, 0)], 8), ([(2048, 0)] + [(1, 4095)] * 63, 8),
                          ([(0, 0), (512, 100), (1, 9)], 1), ([(0, 7), (3, 4)], 0),
                          ([(0, 0)], 1), ([(5, 0), (5, 0), (700, 3)], 4)):
            assert_mixed_identical(r, Batch(rows, decode_threshold=thr))


@cache
def open_k(name: str) -> Kernel:
    return kernel.open(name)


SCENARIO_BATCHES = {
    "prefill": ([(2048, 0)], 8),
    "chunked prefill": ([(2048, 6144), (512, 0)], 8),
    "mixed 1+63": ([(2048, 0)] + [(1, 4095 + i) for i in range(63)], 8),
    "mixed spec": ([(700, 100)] + [(4, 30_000)] * 10, 4),
    "decode": ([(1, 4095)] * 32, 8),
    "long prefill": ([(16_384, 100_000)], 8),
}


@pytest.mark.parametrize("name", BUILDABLE)
def test_every_embedded_scenario(name: str) -> None:
    r = open_k(name).resolved_pool
    for rows, thr in SCENARIO_BATCHES.values():
        assert_mixed_identical(r, Batch(rows, decode_threshold=thr))
    for budget in (0, 66):
        assert_mixed_identical(r, Batch([(3000, 50)] + [(1, 9000)] * 5, 8, budget))


@pytest.mark.parametrize("name", ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1",
                                  "nemotron3-ultra-h100-agg"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=batches)
def test_embedded_scenarios_random_batches(name: str, b: Batch) -> None:
    assert_mixed_identical(open_k(name).resolved_pool, b)


def test_mixed_table_is_bounded() -> None:
    r = tiny_pcp(pcp=1)
    p = step.prepared(r)
    assert p.fast is not None
    for n in range(9, step_mixed._TABLE_MAX + 200, 97):
        step.step_time_into(r, Batch([(n, 0)], decode_threshold=8), None)
    assert 0 < len(p.fast.mixed) <= step_mixed._TABLE_MAX


def test_nan_free_results_on_a_huge_prefill() -> None:
    """A prefill that overflows the duration range is clamped as finish clamps it."""
    r = tiny_pcp(pcp=1)
    per: dict[Resource, int] = {}
    got = step.step_time_into(r, Batch([(10**9, 10**12)], decode_threshold=8), per)
    want = step.finish(step.compose(r, step.summarise(r, Batch([(10**9, 10**12)], 8))), {})
    assert got == want and not math.isnan(got.overlap)
