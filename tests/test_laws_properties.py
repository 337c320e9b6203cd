"""Hypothesis properties of kernel/model/laws.py.

The most important group is scalar/array equivalence: every polymorphic law, called with
numpy arrays for its data arguments, must give element by element exactly the bits of the
scalar call (and int64 for integer laws); and the scalar path must never touch numpy.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernel.model import laws as L

FAST = settings(max_examples=150, deadline=None)
SLOW = settings(max_examples=60, deadline=None)

EDGE_INTS = [0, 1, -1, 2, 7, 16, 2**31 - 1, 2**31, -(2**31)]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**31), 2**31))
nonneg_ints = st.one_of(st.sampled_from([0, 1, 2, 2**31]), st.integers(0, 2**31))
floats = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0**31, -0.0]),
    st.floats(-1e15, 1e15, allow_nan=False, allow_infinity=False),
)
coef = st.one_of(st.sampled_from([0.0, -1.0, 1.0]), st.floats(1e-9, 1e12))
small_coef = st.one_of(st.sampled_from([0.0, -1.0, 1.0]), st.floats(1e-3, 1e4))


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def assert_same(array_result: Any, scalar_results: list[Any]) -> None:
    """The array result equals the scalar results bit for bit, with the matching dtype."""
    assert isinstance(array_result, np.ndarray)
    assert array_result.shape == (len(scalar_results),)
    for got, want in zip(array_result.tolist(), scalar_results, strict=True):
        if isinstance(want, float):
            assert array_result.dtype == np.float64
            assert _bits(got) == _bits(want), (got, want)
        else:
            assert isinstance(want, int) and not isinstance(want, bool)
            assert array_result.dtype == np.int64
            assert got == want


def check_equivalence(law: Callable[..., Any], data: list[list[Any]], *coefs: Any) -> None:
    """law(*arrays, *coefs)[i] == law(*scalars_i, *coefs) for every row i."""
    arrays = [np.array(column, dtype=np.int64 if isinstance(column[0], int) else np.float64)
              for column in data]
    scalars = [law(*row, *coefs) for row in zip(*data, strict=True)]
    assert_same(law(*arrays, *coefs), scalars)


def columns(strategy: st.SearchStrategy[Any], n: int) -> st.SearchStrategy[list[list[Any]]]:
    """n equal-length lists (one per data argument) drawn from `strategy`."""
    return st.integers(1, 24).flatmap(
        lambda size: st.lists(
            st.lists(strategy, min_size=size, max_size=size), min_size=n, max_size=n
        )
    )


# --- scalar/array equivalence ------------------------------------------------------------


@FAST
@given(columns(floats, 1), small_coef, small_coef)
def test_equivalence_efficiency_float_m(data: list[list[float]], eps: float, half: float) -> None:
    check_equivalence(L.efficiency, data, eps, half)


@FAST
@given(columns(ints, 1), small_coef, small_coef)
def test_equivalence_efficiency_int_m(data: list[list[int]], eps: float, half: float) -> None:
    check_equivalence(L.efficiency, data, eps, half)


@FAST
@given(columns(floats, 1), floats, floats, small_coef, small_coef, small_coef, small_coef)
def test_equivalence_shape_efficiency(
    data: list[list[float]], n: float, k: float, eps: float, mh: float, nh: float, kh: float
) -> None:
    law = L.shape_efficiency
    check_equivalence(lambda m, *c: law(m, n, k, *c), data, eps, mh, nh, kh)


@FAST
@given(columns(floats, 1), coef, coef, coef)
def test_equivalence_collective_time(
    data: list[list[float]], trans: float, peak: float, floor: float
) -> None:
    check_equivalence(L.collective_time, data, trans, peak, floor)


@FAST
@given(columns(floats, 1), coef, coef)
def test_equivalence_floor_and_rate(data: list[list[float]], rate: float, floor: float) -> None:
    check_equivalence(L.floor_and_rate, data, rate, floor)


@FAST
@given(columns(ints, 1), st.integers(-2, 300), st.integers(-2, 300), st.integers(-2, 300))
def test_equivalence_experts_touched(
    data: list[list[int]], n_experts: int, top_k: int, local: int
) -> None:
    check_equivalence(L.experts_touched, data, n_experts, top_k, local)


@FAST
@given(columns(st.integers(-(2**31), 2**31), 1), st.integers(2, 400), st.integers(1, 64))
def test_equivalence_experts_touched_unsaturated(
    data: list[list[int]], n_experts: int, top_k: int
) -> None:
    assume(top_k < n_experts)
    check_equivalence(L.experts_touched, data, n_experts, top_k, 14)


@FAST
@given(columns(ints, 2))
def test_equivalence_causal_pairs(data: list[list[int]]) -> None:
    check_equivalence(L.causal_pairs, data)


@FAST
@given(columns(ints, 2), st.one_of(st.sampled_from([0, -1, 1]), st.integers(1, 2**31)))
def test_equivalence_windowed_pairs_for_chunk(data: list[list[int]], window: int) -> None:
    check_equivalence(L.windowed_pairs_for_chunk, data, window)


@FAST
@given(columns(ints, 1), st.integers(1, 64), st.integers(-2, 128))
def test_equivalence_dcp_local_tokens_one(
    data: list[list[int]], dcp: int, interleave: int
) -> None:
    check_equivalence(L.dcp_local_tokens_one, data, dcp, interleave)


@FAST
@given(st.lists(ints, min_size=0, max_size=24), st.integers(-2, 64), st.integers(-2, 128))
def test_equivalence_dcp_local_tokens_sum(ctxs: list[int], dcp: int, interleave: int) -> None:
    as_array = L.dcp_local_tokens(np.array(ctxs, dtype=np.int64), dcp, interleave)
    assert as_array == L.dcp_local_tokens(ctxs, dcp, interleave)
    assert type(as_array) is int


@FAST
@given(columns(ints, 1), st.integers(-2, 64), st.integers(0, 8))
def test_equivalence_pcp_local_tokens(data: list[list[int]], pcp: int, dcp: int) -> None:
    check_equivalence(L.pcp_local_tokens, data, pcp, dcp)


@FAST
@given(columns(ints, 2), st.integers(-2, 64), st.integers(0, 8))
def test_equivalence_pcp_causal_pairs(data: list[list[int]], pcp: int, dcp: int) -> None:
    check_equivalence(L.pcp_causal_pairs, data, pcp, dcp)


@FAST
@given(
    columns(ints, 1),
    st.one_of(st.sampled_from([0, -1, 1]), st.integers(1, 2**31)),
    st.one_of(st.sampled_from([0.0, -1.0, 4.0, 128.0]), st.floats(1e-3, 1e4)),
)
def test_equivalence_selected_kv_tokens_for(
    data: list[list[int]], topk: int, ratio: float
) -> None:
    check_equivalence(L.selected_kv_tokens_for, data, topk, ratio)


@FAST
@given(
    columns(ints, 1),
    st.one_of(st.sampled_from([0, -1, 1]), st.integers(1, 1 << 20)),
    st.sampled_from([0.0, 1.0, 4.0, 128.0, 3.7]),
    st.integers(0, 64),
    st.integers(-1, 128),
    st.booleans(),
)
def test_equivalence_dcp_decode_tokens_one(
    data: list[list[int]], topk: int, ratio: float, dcp: int, interleave: int, shards: bool
) -> None:
    check_equivalence(L.dcp_decode_tokens_one, data, topk, ratio, dcp, interleave, shards)


@FAST
@given(
    columns(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from([0.0, -0.0, 1e-9, 9.223372036854775e9, 9.2233720368547758e9]),
        ),
        1,
    )
)
def test_equivalence_to_duration_ns(data: list[list[float]]) -> None:
    check_equivalence(L.to_duration_ns, data)


@FAST
@given(columns(ints, 1), st.integers(1, 1 << 20))
def test_equivalence_cdiv(data: list[list[int]], b: int) -> None:
    check_equivalence(L.cdiv, data, b)


@FAST
@given(
    columns(ints, 1),
    st.integers(-1, 1024),
    st.one_of(st.sampled_from([0.0, -1.0, 0.5625, 35136.0]), st.floats(1e-3, 1e6)),
)
def test_equivalence_paged_bytes(data: list[list[int]], block: int, bpt: float) -> None:
    check_equivalence(L.paged_bytes, data, block, bpt)


@FAST
@given(columns(ints, 1), st.integers(1, 1 << 20), st.integers(1, 1024), st.integers(1, 1 << 24))
def test_equivalence_ring_pages(data: list[list[int]], window: int, block: int, cap: int) -> None:
    check_equivalence(lambda f, *c: L.ring_pages(window, block, f, cap), data)


@FAST
@given(columns(ints, 2), st.integers(1, 1 << 20), st.integers(1, 1024), st.integers(1, 1 << 24))
def test_equivalence_ring_pages_at(
    data: list[list[int]], window: int, block: int, cap: int
) -> None:
    check_equivalence(L.ring_pages_at, data, window, block, cap)


class _NoNumpy:
    """Stands in for numpy inside kernel.model.laws: only `ndarray` (for isinstance) is allowed."""

    ndarray = np.ndarray

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the scalar path touched numpy.{name}")


SCALAR_CALLS: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
    (L.efficiency, (512, 0.89, 102)), (L.efficiency, (-1, 0.89, 102)),
    (L.efficiency, (5, 0.0, 102)), (L.efficiency, (5, 0.9, 0)),
    (L.shape_efficiency, (1024, 3072, 6144, 0.9, 256, 3072, 2048)),
    (L.shape_efficiency, (0, 1, 1, 0.9, 256, 3072, 2048)),
    (L.shape_efficiency, (5, 1, 1, 0.0, 256, 3072, 2048)),
    (L.collective_time, (256, 92500e6, 131566e6, 15.98e-6)),
    (L.collective_time, (256, 0, 0, 15.98e-6)), (L.collective_time, (0, 1.0, 1.0, 1e-6)),
    (L.floor_and_rate, (2**30, 35.39e9, 10e-6)), (L.floor_and_rate, (1, 0, 10e-6)),
    (L.experts_touched, (128, 224, 8, 14)), (L.experts_touched, (3, 8, 8, 14)),
    (L.experts_touched, (0, 224, 8, 14)),
    (L.causal_pairs, (1024, 4096)), (L.windowed_pairs_for_chunk, (1024, 100, 2176)),
    (L.windowed_pairs_for_chunk, (1024, 100, 0)),
    (L.dcp_local_tokens_one, (1000, 8, 32)), (L.dcp_local_tokens_one, (0, 8, 32)),
    (L.pcp_local_tokens, (1001, 8, 1)), (L.pcp_local_tokens, (17, 8, 2)),
    (L.pcp_local_tokens, (17, 1, 2)), (L.pcp_local_tokens, (0, 4, 1)),
    (L.pcp_causal_pairs, (1001, 8192, 4, 1)), (L.pcp_causal_pairs, (17, 5, 8, 2)),
    (L.pcp_causal_pairs, (0, 5, 8, 2)), (L.pcp_causal_pairs, (17, 5, 1, 2)),
    (L.selected_kv_tokens_for, (4096, 1024, 4)), (L.selected_kv_tokens_for, (100, 1024, 0)),
    (L.dcp_decode_tokens_one, (4096, 1024, 4, 8, 1, True)),
    (L.dcp_decode_tokens_one, (4096, 0, 0, 8, 1, True)),
    (L.to_duration_ns, (1.5e-3,)), (L.to_duration_ns, (math.nan,)),
    (L.to_duration_ns, (math.inf,)), (L.to_duration_ns, (1e300,)),
    (L.cdiv, (1001, 16)), (L.paged_bytes, (1000, 16, 35136.0)), (L.paged_bytes, (1000, 1, 2.0)),
    (L.paged_bytes, (0, 16, 2.0)), (L.paged_bytes, (10, 16, 0.0)),
    (L.ring_pages, (128, 16, 1, 131072)), (L.ring_pages_at, (50, 1, 128, 16, 131072)),
]


def test_scalar_path_never_touches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [law(*args) for law, args in SCALAR_CALLS]
    monkeypatch.setattr(L, "np", _NoNumpy())
    for (law, args), want in zip(SCALAR_CALLS, expected, strict=True):
        got = law(*args)
        assert type(got) in (int, float), (law.__name__, args, type(got))
        assert got == want or (got != got and want != want)


# --- ramp properties ---------------------------------------------------------------------

eps_st = st.floats(1e-3, 1.0)
half_st = st.floats(1e-3, 1e5)


@FAST
@given(st.integers(0, 2**20), st.integers(0, 2**20), eps_st, half_st)
def test_efficiency_monotone_for_token_counts(m1: int, m2: int, eps: float, half: float) -> None:
    lo, hi = sorted((m1, m2))
    assert L.efficiency(lo, eps, half) <= L.efficiency(hi, eps, half)


@FAST
@given(st.integers(0, 2**31), st.integers(0, 2**31), eps_st, half_st)
def test_efficiency_monotone_within_one_ulp_at_huge_m(
    m1: int, m2: int, eps: float, half: float
) -> None:
    # (eps*m)/(m+half) rounds numerator and denominator apart; past ~1e9 tokens a step of
    # one token can lose one ulp. Exact monotonicity holds in the token range above.
    lo, hi = sorted((m1, m2))
    a, b = L.efficiency(lo, eps, half), L.efficiency(hi, eps, half)
    assert a <= b + math.ulp(b)


@FAST
@given(st.one_of(st.floats(-1e12, 1e12), st.integers(-(2**31), 2**31)), eps_st, half_st)
def test_efficiency_bounded(m: float, eps: float, half: float) -> None:
    assert 0 <= L.efficiency(m, eps, half) <= eps


@FAST
@given(eps_st, half_st)
def test_efficiency_at_m_half_is_half_eps_max_within_one_ulp(eps: float, half: float) -> None:
    # Not always exact: eps*m_half is rounded before the division (spec order), so the result
    # can sit one ulp from eps/2 (case 7 has tolerance 1e-12 for this reason).
    got = L.efficiency(half, eps, half)
    assert abs(got - eps / 2) <= math.ulp(eps / 2)


@FAST
@given(eps_st, st.integers(-20, 40))
def test_efficiency_at_power_of_two_m_half_is_exactly_half(eps: float, exp: int) -> None:
    half = 2.0**exp
    assert L.efficiency(half, eps, half) == eps / 2


@FAST
@given(
    st.floats(0, 1e9), st.floats(0, 1e6), st.floats(0, 1e6), eps_st, half_st, half_st, half_st
)
def test_shape_efficiency_bounded_and_below_ramp(
    m: float, n: float, k: float, eps: float, mh: float, nh: float, kh: float
) -> None:
    shaped = L.shape_efficiency(m, n, k, eps, mh, nh, kh)
    assert 0 <= shaped <= eps
    assert shaped <= L.shape_efficiency(m, n, k, eps, mh, 0, 0)


# --- span properties ---------------------------------------------------------------------


@FAST
@given(st.integers(1, 512), st.integers(1, 72), st.floats(1.0, 100.0))
def test_span_bounds(g: int, per_node: int, ratio: float) -> None:
    for value in (
        L.ring_span(g, per_node, ratio),
        L.all2all_span(g, per_node, ratio),
        L.flat_span(g, per_node, ratio),
    ):
        assert 1 <= value <= ratio * (1 + 1e-15)
    assert L.ring_span(g, per_node, ratio) <= L.flat_span(g, per_node, ratio)
    assert L.all2all_span(g, per_node, ratio) <= L.flat_span(g, per_node, ratio)
    if g <= per_node:
        assert L.ring_span(g, per_node, ratio) == L.all2all_span(g, per_node, ratio) == 1


@FAST
@given(st.integers(-5, 100), st.integers(-5, 100), st.floats(allow_nan=True))
def test_span_is_one_or_between_one_and_ratio(cross: int, total: int, ratio: float) -> None:
    value = L.span(cross, total, ratio)
    if cross <= 0 or total <= 0 or not math.isfinite(ratio) or ratio <= 1:
        assert value == 1
    elif math.isinf((ratio - 1) * cross):  # Go evaluates left to right: the product overflows
        assert value == math.inf
    elif cross <= total:
        assert 1 <= value <= ratio * (1 + 1e-15)


# --- DCP / PCP against brute force -------------------------------------------------------


def _striped_busiest(length: int, dcp: int, inter: int) -> int:
    """Brute force: token t lives on rank (t // inter) % dcp; the busiest rank's count."""
    held = [0] * dcp
    for token in range(length):
        held[(token // inter) % dcp] += 1
    return max(held)


def _vllm_rank_len(length: int, dcp: int, inter: int, rank: int) -> int:
    """vLLM get_dcp_local_seq_lens for one rank."""
    base = length // inter // dcp * inter
    return base + min(max(length - base * dcp - rank * inter, 0), inter)


@SLOW
@given(st.integers(0, 20000), st.integers(2, 64), st.integers(-1, 128))
def test_dcp_local_equals_vllm_per_rank_oracle(length: int, dcp: int, interleave: int) -> None:
    inter = max(interleave, 1)
    got = L.dcp_local_tokens([length], dcp, interleave)
    if length == 0:
        assert got == 0
        return
    assert got == _striped_busiest(length, dcp, inter)
    assert got == max(_vllm_rank_len(length, dcp, inter, r) for r in range(dcp))


def _zigzag_ranks(s: int, pcp: int) -> list[list[int]]:
    """Brute force: the token positions each PCP rank holds under the zigzag split."""
    n_chunks = 2 * pcp
    ch = -(-s // n_chunks)
    ranks: list[list[int]] = [[] for _ in range(pcp)]
    for token in range(s):
        chunk = token // ch
        ranks[chunk if chunk < pcp else n_chunks - 1 - chunk].append(token)
    return ranks


@SLOW
@given(st.integers(1, 5000), st.integers(2, 16), st.integers(1, 4))
def test_pcp_local_tokens_equals_zigzag_brute_force(s: int, pcp: int, dcp: int) -> None:
    busiest = max(len(tokens) for tokens in _zigzag_ranks(s, pcp))
    replicated = dcp > 1 and (2 * pcp - 1) * -(-s // (2 * pcp)) >= s
    assert L.pcp_local_tokens(s, pcp, dcp) == (s if replicated else busiest)


@SLOW
@given(st.integers(1, 3000), st.integers(0, 200000), st.integers(2, 16), st.integers(1, 4))
def test_pcp_causal_pairs_equals_brute_force(s: int, prefix: int, pcp: int, dcp: int) -> None:
    whole = 4 * (s * prefix + s * s / 2)
    ranks = _zigzag_ranks(s, pcp)
    local = L.pcp_local_tokens(s, pcp, dcp)
    if local == s:
        expected = whole
    else:
        expected = 4 * max(sum(prefix + t + 0.5 for t in tokens) for tokens in ranks)
    assert L.pcp_causal_pairs(s, prefix, pcp, dcp) == pytest.approx(expected, rel=1e-12)
    chunks = L.pcp_busiest_chunks(s, prefix, pcp, dcp)
    assert sum(n for n, _ in chunks) == local


def _brute_windowed(chunks: list[tuple[int, int]], w: int) -> float:
    total = 0.0
    for s, prefix in chunks:
        for i in range(s):
            p = prefix + i
            total += p - max(0, p - w + 1) + 1 - (0.5 if p + 1 <= w else 0.0)
    return 4 * total


@SLOW
@given(
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 5000)), min_size=0, max_size=4),
    st.integers(1, 3000),
)
def test_case_48_windowed_causal_equals_brute_force(chunks: list[tuple[int, int]], w: int) -> None:
    assert L.windowed_causal_flops(chunks, w) == pytest.approx(
        _brute_windowed(chunks, w), rel=1e-12, abs=1e-6
    )


@FAST
@given(
    st.integers(1, 128), st.integers(1, 64), st.integers(1, 1024), st.integers(1, 256),
    st.sampled_from([0.5, 0.5625, 1.0, 2.0, 4.0]), st.booleans(),
)
def test_case_38_kv_bytes_closed_form(
    n_kv: int, tp: int, head_dim: int, layers: int, dt: float, latent: bool
) -> None:
    expected = max(n_kv // tp, 1) * (head_dim + (0 if latent else head_dim)) * dt * layers
    assert L.kv_bytes_per_token(n_kv, tp, head_dim, layers, dt, latent) == expected


# --- experts, rings, capture, durations --------------------------------------------------


@FAST
@given(st.integers(0, 20000), st.integers(2, 512), st.integers(1, 64))
def test_experts_touched_go_pow_port_tracks_libm(tokens: int, n_experts: int, top_k: int) -> None:
    assume(top_k < n_experts)
    local = 14
    got = L.experts_touched(tokens, n_experts, top_k, local)
    libm = local * (1 - ((n_experts - top_k) / n_experts) ** tokens) if tokens > 0 else 0.0
    assert got == pytest.approx(libm, rel=1e-12, abs=1e-12)
    assert 0 <= got <= local
    assert got <= L.experts_touched(tokens + 1, n_experts, top_k, local)


def test_go_pow_port_matches_repeated_multiplication_for_small_exponents() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        x = rng.random()
        for n in (1, 2, 3):
            product = x
            for _ in range(n - 1):
                product *= x
            # n <= 2 is exact in both (one rounding); n = 3 may differ by an ulp
            got = L._go_pow_int(x, n)
            assert got == product if n <= 2 else abs(got - product) <= 2 * math.ulp(product)


window_st = st.integers(1, 5000)
block_st = st.integers(1, 256)


@FAST
@given(st.integers(-10, 20000), st.integers(-10, 9000), window_st, block_st,
       st.integers(1, 200000))
def test_seed_12_ring_invariants(c: int, f: int, w: int, b: int, cap: int) -> None:
    at = L.ring_pages_at(c, f, w, b, cap)
    bound = L.ring_pages(w, b, f, cap)
    assert 0 <= at <= bound  # invariant 3
    assert at <= L.ring_pages_at(c + 1, f, w, b, cap)  # invariant 4: non-decreasing in c
    assert at <= L.ring_pages_at(c, f + 1, w, b, cap)  # ... and in f
    assert bound <= L.ring_pages(w, b, f + 1, cap)
    cc, ff = max(c, 0), max(f, 0)
    if cc + ff <= cap:
        # the envelope never undercounts vLLM's exact hold
        exact = L.cdiv(cc + ff, b) - max(0, cc - w + 1) // b
        assert exact <= at
        if cc >= w - 1 + b:
            assert at == bound  # "past the window"


@FAST
@given(st.integers(1, 2048), st.integers(1, 8), st.integers(1, 65536), st.booleans(),
       st.booleans(), st.booleans())
def test_seed_12_capture_tokens_at_most_budget(
    seqs: int, q: int, budget: int, blackwell: bool, full: bool, v1: bool
) -> None:
    try:
        sizes = L.capture_sizes(seqs, q, budget, None, None, blackwell, full, v1)
    except ValueError:
        assert q > 1  # only spec-decode rounding can leave nothing
        return
    assert sizes == sorted(set(sizes)) and sizes[0] >= 1
    assert sizes[-1] <= budget  # invariant 8
    assert sizes[-1] <= (1024 if blackwell else 512)


@FAST
@given(st.floats(0, 9.2e9))
def test_to_duration_truncates(seconds: float) -> None:
    assert L.to_duration_ns(seconds) == int(seconds * 1e9)


@FAST
@given(st.integers(0, 2**62))
def test_duration_seconds_matches_go(ns: int) -> None:
    assert L.duration_seconds(ns) == float(ns // 10**9) + float(ns % 10**9) / 1e9
