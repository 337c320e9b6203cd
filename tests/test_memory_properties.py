"""Memory and transfer identities (model.md §14.5) over every embedded pool at random lengths,
and monotonicity in tokens, window and block size."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel
from kernel.facade.kernel import Kernel
from kernel.model import laws
from kernel.model.types import Placement
from pipeline.load import open_inputs
from tests.embedded import BUILDABLE as SCENARIOS

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@cache
def pools(name: str) -> tuple[Kernel, ...]:
    n = len(open_inputs(name).deployment.pools)
    return tuple(kernel.open_pool(name, None, i) for i in range(n))


@pytest.mark.parametrize("name", SCENARIOS)
@PROPS
@given(t1=st.integers(-5, 300_000), t2=st.integers(-5, 300_000), c=st.integers(0, 200_000),
       f1=st.integers(0, 20_000), f2=st.integers(0, 20_000))
def test_identities_at_random_lengths(name: str, t1: int, t2: int, c: int, f1: int,
                                      f2: int) -> None:
    lo, hi = sorted((t1, t2))
    fa, fb = sorted((f1, f2))
    a, b = Placement(0, 0), Placement(3, 1)
    for k in pools(name):
        r = k.resolved_pool
        assert k.sequence_variable_bytes(lo) <= k.sequence_variable_bytes(hi)  # monotone
        if lo <= 0:
            assert k.sequence_variable_bytes(lo) == 0
        assert k.sequence_bounded_bytes(1 + r.num_spec_tokens) == k.sequence_fixed_bytes()
        assert k.sequence_bounded_bytes(r.max_num_batched_tokens) == \
            k.sequence_admission_bytes()
        assert k.sequence_bounded_bytes(fa) <= k.sequence_bounded_bytes(fb)
        assert k.sequence_bounded_bytes_at(c, fa) <= k.sequence_bounded_bytes(fa)
        assert k.sequence_bounded_bytes_at(c, fa) <= k.sequence_bounded_bytes_at(c + 1, fa)
        assert k.pd_transfer_time(hi, a, b) == k.pd_transfer_demand(hi, a, b).alone_time()
        assert k.pd_transfer_time(lo, a, b) <= k.pd_transfer_time(hi, a, b)


@PROPS
@given(t1=st.integers(0, 10**7), t2=st.integers(0, 10**7), block=st.integers(1, 512),
       bpt=st.integers(1, 200_000))
def test_paged_bytes_monotone_in_tokens_and_never_below_unpaged(t1: int, t2: int, block: int,
                                                               bpt: int) -> None:
    lo, hi = sorted((t1, t2))
    assert laws.paged_bytes(lo, block, bpt) <= laws.paged_bytes(hi, block, bpt)
    paged = laws.paged_bytes(hi, block, bpt)
    assert hi * bpt <= paged < (hi + block) * bpt or hi == 0


@PROPS
@given(w=st.integers(1, 100_000), block=st.integers(1, 512), f=st.integers(0, 20_000),
       cap=st.integers(1, 1_000_000))
def test_ring_pages_monotone_in_window_and_block(w: int, block: int, f: int, cap: int) -> None:
    pages = laws.ring_pages(w, block, f, cap)
    assert pages <= laws.ring_pages(w + 1, block, f, cap)  # a wider window holds no fewer pages
    assert laws.ring_pages(w, block + 1, f, cap) <= pages  # bigger blocks: no more pages
    # ...but never fewer bytes than the tokens it must hold
    assert laws.ring_pages(w, block + 1, f, cap) * (block + 1) >= min(w - 1 + f, cap)
