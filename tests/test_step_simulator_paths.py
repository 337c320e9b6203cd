"""The simulator's per-call paths (issue 31, decisions LS1-LS3) equal the shared path bit for bit.

* Columns: a uniform decode step of native int64 columns is checked and summed in a few C-level
  calls (one numpy reduction between 41 and 127 requests, exact only while every value is
  below 2**56: larger values, negative ones and other sizes take the general code); the
  distinct scheduled counts are probed with a decode count.
* Mixed steps: the prefill-dependent terms are kept per (Σ scheduled, budget, any decode,
  prefill rows), so a sequence of steps on one pool meets both new and seen shapes.
* StepBatch: one prefill chunk is located by a byte search (``step_arrays.position``).
* The decode summary from precomputed parts (``step_fast._fixed_summary``) equals
  ``summarize`` on any totals, NaN, infinities, zeros and overflow included.

The reference is always ``finish(compose(summarise(...)))`` (or ``summarize``), never the new
code with itself.
"""

from __future__ import annotations

import math
from functools import cache
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernel
from kernel import StepBatch
from kernel.facade.kernel import Kernel
from kernel.model import laws, step_arrays, step_fast
from kernel.model.types import MAX_DURATION_NS, Batch, Resource
from tests.fixtures_pools import replace_coeffs, tiny_pcp
from tests.jit_modes import jit_mode  # noqa: F401 (the fixture: compiled loops, then none)
from tests.step_support import same_with_maps as same
from tests.step_support import shared
from tests.test_step_fast import pools

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
NAMES = ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1", "nemotron3-ultra-h100-agg"]


@cache
def open_k(name: str) -> Kernel:
    return kernel.open(name)


# A computed count: small, around the 2**56 bound of the exact numpy sum, or near int64's top.
computed_st = st.one_of(st.integers(0, 300_000), st.integers(2**56 - 3, 2**56 + 3),
                        st.integers(2**62, 2**63 - 1))


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(n=st.integers(1, 140), width=st.sampled_from([1, 2, 4]), data=st.data())
def test_uniform_decode_columns_at_every_size(name: str, n: int, width: int, data: Any
                                              ) -> None:
    """Every size around the numpy-sum window (41-127), values either side of 2**56: the
    columns price as the Batch of the same requests; a negative computed count is refused
    at its position whichever way the column is summed."""
    k = open_k(name)
    computed = data.draw(st.lists(computed_st, min_size=n, max_size=n))
    s = np.full(n, width, dtype=np.int64)
    c = np.array(computed, dtype=np.int64)
    b = Batch(list(zip([width] * n, computed, strict=True)), decode_threshold=4)
    same(k.step_time_arrays(s, c, decode_threshold=4), shared(k, b))
    bad = data.draw(st.integers(0, n - 1))
    c[bad] = -data.draw(st.integers(1, 2**62))
    with pytest.raises(ValueError, match=rf"computed\[{bad}\] is -"):
        k.step_time_arrays(s, c, decode_threshold=4)


def _rows(draw: Any, n: int) -> list[tuple[int, int]]:
    return [(1, draw(st.integers(0, 200_000))) for _ in range(n)]


@st.composite
def one_off_steps(draw: Any) -> tuple[list[tuple[int, int]], int]:
    """Steps where one request differs from the rest, at the front, the back or inside:
    a chunk above the threshold, a smaller count (a 0 scheduled), or another decode count."""
    n = draw(st.integers(1, 90))
    rows = _rows(draw, n)
    odd = draw(st.sampled_from([(2048, draw(st.sampled_from([0, 2048, 4096]))), (0, 0),
                                (0, 17), (3, 50), (9, 0)]))
    at = draw(st.sampled_from([0, n, n // 2]))
    rows.insert(at, odd)
    return rows, draw(st.sampled_from([0, 1, 4, 8]))


@pytest.mark.usefixtures("jit_mode")
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(case=one_off_steps(), budget=st.sampled_from([0, 66]))
def test_columns_with_one_odd_request(name: str, case: tuple[list[tuple[int, int]], int],
                                      budget: int) -> None:
    rows, thr = case
    k = open_k(name)
    b = Batch(rows, decode_threshold=thr, sm_budget=budget)
    s = np.array([q[0] for q in rows], dtype=np.int64)
    c = np.array([q[1] for q in rows], dtype=np.int64)
    if not b.tokens():
        return  # (refused by both: tests/test_step_arrays.py)
    want = shared(k, b)
    same(k.step_time_arrays(s, c, decode_threshold=thr, sm_budget=budget), want)
    same(k.step_time(b), want)
    sb = StepBatch(decode_threshold=thr, sm_budget=budget)
    sb.extend(s, c)
    same(sb.step_time(k), want)


chunk_st = st.tuples(st.sampled_from([9, 512, 2048, 8192]),
                     st.sampled_from([0, 2048, 4096, 100_000]))


@pytest.mark.usefixtures("jit_mode")
@SETTINGS
@given(r=pools(), steps=st.lists(st.tuples(
    st.lists(chunk_st, min_size=0, max_size=3),
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 5000)), max_size=6),
    st.booleans()), min_size=2, max_size=12))
def test_mixed_steps_in_sequence_on_one_pool(r: Any, steps: list[Any]) -> None:
    """Steps with prefill on one pool, in sequence: the kept entries (decision LS1) are met
    with new and repeated chunk shapes, with and without decodes, at the front or the back;
    each step prices as the shared path, through Batch, columns and StepBatch alike."""
    r = replace_coeffs(r, attention_prefill_scale=0.5, attention_prefill_floor_ns=5_000)
    k = Kernel(r, None, None)  # type: ignore[arg-type]  # (pricing reads the pool only)
    for chunks, decodes, front in [*steps, *steps]:  # every shape twice: new, then kept
        rows = [*chunks, *decodes] if front else [*decodes, *chunks]
        b = Batch(rows, decode_threshold=8)
        if not b.tokens():
            continue
        want = shared(k, b)
        same(k.step_time(b), want)
        s = np.array([q[0] for q in rows], dtype=np.int64)
        c = np.array([q[1] for q in rows], dtype=np.int64)
        same(k.step_time_arrays(s, c, decode_threshold=8), want)
        sb = StepBatch(decode_threshold=8)
        sb.extend(s, c)
        same(sb.step_time(k), want)


def test_pcp_mixed_steps_keep_their_gathers() -> None:
    """On a PCP pool the kept entry holds the prefill gathers of its chunk, not another's."""
    k = Kernel(tiny_pcp(pcp=2), None, None)  # type: ignore[arg-type]
    for rows in ([(2048, 0)] + [(1, 900)] * 5, [(1024, 0)] + [(1, 900)] * 5,
                 [(2048, 0)] + [(1, 900)] * 5, [(1024, 7)] + [(1, 901)] * 5):
        b = Batch(rows, decode_threshold=8)
        same(k.step_time(b), shared(k, b))


@given(values=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=80), data=st.data())
@settings(max_examples=200, deadline=None)
def test_position_is_the_first_index(values: list[int], data: Any) -> None:
    """``position`` finds the first element equal to the value, never a byte match that
    straddles two elements (values built from shifted bytes make such matches likely)."""
    shifted = [v << (8 * data.draw(st.integers(0, 7))) & (2**63 - 1) for v in values]
    a = np.array(shifted, dtype=np.int64)
    target = data.draw(st.sampled_from(shifted))
    assert step_arrays.position(a, target) == shifted.index(target)
    with pytest.raises(ValueError, match="not in the array"):
        step_arrays.position(np.array([1, 2], dtype=np.int64), 2**40)


total_st = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0.0, -0.0, 1e-9, 9.3e9, 1e12, math.nan, math.inf]),
                     st.floats(0.0, 1.0))


@given(sm=total_st, nv=total_st, nic=total_st, hbm=total_st, overlap=total_st,
       host_ns=st.one_of(st.integers(0, 10**7), st.integers(MAX_DURATION_NS - 10,
                                                            MAX_DURATION_NS)))
@settings(max_examples=300, deadline=None)
@example(sm=1e-3, nv=2e-3, nic=2e-3, hbm=1.5e-3, overlap=1e-3, host_ns=1000)  # NVLink = NIC
@example(sm=2e-3, nv=2e-3, nic=0.0, hbm=2e-3, overlap=1e-3, host_ns=1000)  # SM = HBM = NVLink
@example(sm=1e-6, nv=1e-6, nic=1e-6, hbm=1e-6, overlap=1e-6, host_ns=1000)  # host wins
@example(sm=math.nan, nv=math.nan, nic=2e-3, hbm=math.nan, overlap=math.nan, host_ns=0)
def test_decode_summary_from_parts_is_summarize(sm: float, nv: float, nic: float, hbm: float,
                                                overlap: float, host_ns: int) -> None:
    """``step_fast.estimate`` on an entry with no layer (its HBM total and overlap are then the
    head's) summarises as ``summarize``: bottleneck ties, NaN listed at 0 ns, saturation."""
    host_s = laws.duration_seconds(host_ns)
    host = (host_ns, host_s, step_fast._duration(host_s) if host_s > 0 else 0)
    terms = ((), sm, nv, nic, overlap, step_fast._fixed_summary(sm, nv, nic))
    fake: Any = SimpleNamespace(head_hbm=hbm)
    per: dict[Resource, int] = {Resource.NIC: 5}  # a caller's map: cleared, then filled
    got = step_fast.estimate(fake, fake, terms, 0, 0, host, per)
    want_per: dict[Resource, int] = {}
    want = step_fast.summarize((sm, 0.0 + hbm, nv, nic, host_s, host_ns, 0.0 + overlap),
                               want_per)
    assert (got.overlap, got.no_overlap, got.bottleneck) == (
        want.overlap, want.no_overlap, want.bottleneck)
    assert got.per_resource is per and list(per.items()) == list(want_per.items())
    assert step_fast.estimate(fake, fake, terms, 0, 0, host, None).per_resource is None


@given(rows=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 10_000)), min_size=1,
                     max_size=20), data=st.data())
@settings(max_examples=60, deadline=None)
def test_step_batch_positions_from_the_end(rows: list[tuple[int, int]], data: Any) -> None:
    """A negative position counts from the last request, never from the spare capacity."""
    sb = StepBatch(decode_threshold=8, capacity=64)
    sb.extend([q[0] for q in rows], [q[1] for q in rows])
    model = [list(q) for q in rows]
    i = data.draw(st.integers(-len(rows), -1))
    v = data.draw(st.integers(0, 3000))
    sb.set_scheduled(i, v)
    model[i][0] = v
    j = data.draw(st.integers(-len(rows), len(rows) - 1))
    sb.remove(j)
    del model[j]
    assert sb.scheduled.tolist() == [m[0] for m in model]
    assert sb.computed.tolist() == [m[1] for m in model]
    b = Batch([tuple(m) for m in model], decode_threshold=8)
    if b.tokens():
        same(sb.step_time(open_k(NAMES[0])), shared(open_k(NAMES[0]), b))
