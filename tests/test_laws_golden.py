"""Pure-function goldens of kernel/model/laws.py.

`case N` is the reference's golden case N (model.md §14.1; §14.2 lists these,
and the case's stated tolerance is used); SW-A, HY-M and MLA-D are the worked examples
of model.md §14.4; the remaining vectors are recomputed from the formulas (§14.2).
Cases 39-44 (planner) and 49-51 (kernel) belong to the kernel owner and are not here.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from kernel.model import laws as L

INF, NAN = math.inf, math.nan


# --- model.md §2.1 efficiency ramps: cases 1-10, 25-29 ------------------------------------


@pytest.mark.parametrize(
    ("case", "m", "eps_max", "m_half", "expected"),
    [
        (1, 512, 0.890, 102, 0.742),
        (2, 32, 0.890, 102, 0.213),
        (3, 512, 0.788, 94, 0.666),
        (4, 32, 0.788, 94, 0.200),
        (5, 512, 0.640, 110, 0.527),
        (6, 32, 0.640, 110, 0.144),
        (9, 1e12, 0.890, 102, 0.890),
    ],
)
def test_cases_1_to_6_and_9_efficiency_ramp(
    case: int, m: float, eps_max: float, m_half: float, expected: float
) -> None:
    assert L.efficiency(m, eps_max, m_half) == pytest.approx(expected, abs=1e-3)


def test_case_7_efficiency_at_m_half_is_half_eps_max() -> None:
    assert L.efficiency(102, 0.890, 102) == pytest.approx(0.445, abs=1e-12)


@pytest.mark.parametrize("m", [0, -1])
def test_case_8_efficiency_of_no_tokens_is_zero(m: int) -> None:
    assert L.efficiency(m, 0.890, 102) == 0


def test_case_10_efficiency_asymptote_ratio() -> None:
    ratio = L.efficiency(1e9, 0.788, 94) / L.efficiency(1e9, 0.640, 110)
    assert ratio == pytest.approx(1.23, abs=0.02)


def test_case_25_shape_efficiency_without_nk_halves_is_the_ramp() -> None:
    shaped = L.shape_efficiency(1024, 3072, 6144, 0.9, 256, 0, 0)
    assert shaped == pytest.approx(L.efficiency(1024, 0.9, 256), abs=1e-12)


def test_case_26_shape_factors_lower_efficiency() -> None:
    case_25 = L.shape_efficiency(1024, 3072, 6144, 0.9, 256, 0, 0)
    assert L.shape_efficiency(1024, 3072, 6144, 0.9, 256, 3072, 2048) < case_25


def test_case_27_short_k_is_worse_than_long_k() -> None:
    short_k = L.shape_efficiency(1024, 6144, 1024, 1, 256, 3072, 2048)
    assert short_k < L.shape_efficiency(1024, 3072, 6144, 1, 256, 3072, 2048)
    assert short_k < L.efficiency(1024, 1, 256)


@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 1, 1), (1024, 6144, 1024), (8192, 24576, 16384), (1e6, 1e6, 1e6)]
)
def test_case_28_shape_efficiency_bounded(m: float, n: float, k: float) -> None:
    assert 0 <= L.shape_efficiency(m, n, k, 0.95, 256, 3072, 2048) <= 0.95


@pytest.mark.parametrize(
    ("n", "k", "n_half", "k_half"), [(0, 6144, 0, 2048), (3072, 0, 3072, 0), (0, 0, 0, 0)]
)
def test_case_29_shape_efficiency_finite_for_zero_dims(
    n: int, k: int, n_half: int, k_half: int
) -> None:
    assert math.isfinite(L.shape_efficiency(1024, n, k, 0.9, 256, n_half, k_half))


# --- model.md §5.5 spans: cases 11-20, 90 -------------------------------------------------


def test_case_11_span_without_crossing_is_one() -> None:
    assert L.span(0, 15, 9) == 1


@pytest.mark.parametrize("ratio", [0, 0.5, NAN, INF, -INF])
def test_case_12_span_of_degenerate_ratio_is_one(ratio: float) -> None:
    assert L.span(1, 15, ratio) == 1


def test_case_13_ring_span_16_8_9() -> None:
    assert L.ring_span(16, 8, 9) == pytest.approx(1.533, abs=0.01)


def test_case_14_flat_span_16_8_9() -> None:
    assert L.flat_span(16, 8, 9) == pytest.approx(9.0, abs=0.01)


def test_case_15_all2all_span_16_8_9() -> None:
    assert L.all2all_span(16, 8, 9) == pytest.approx(5.267, abs=0.01)


def test_case_16_all2all_span_72_8_9() -> None:
    assert L.all2all_span(72, 8, 9) == pytest.approx(8.211, abs=0.01)


def test_case_17_all2all_over_ring_16_8_9() -> None:
    assert L.all2all_span(16, 8, 9) / L.ring_span(16, 8, 9) == pytest.approx(3.435, abs=0.02)


def test_case_18_ring_span_of_partial_node_is_flat() -> None:
    assert L.ring_span(12, 8, 9) == pytest.approx(L.flat_span(12, 8, 9), abs=1e-12)


@pytest.mark.parametrize("g", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("r", [1, 2, 9, 18, 25])
def test_case_19_ring_span_matches_two_level_ring_formula(g: int, n: int, r: float) -> None:
    big_g = g * n
    expected = (
        1.0
        if big_g == 1
        else (2 * (g - 1) / g + 2 * (n - 1) / n / g * r) / (2 * (big_g - 1) / big_g)
    )
    assert L.ring_span(big_g, g, r) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("g", [2, 4, 8, 72])
def test_case_20_all2all_equals_ring_on_one_node(g: int) -> None:
    assert L.all2all_span(g, g, 9) == pytest.approx(L.ring_span(g, g, 9), abs=1e-12)


@pytest.mark.parametrize(
    ("intra", "inter", "expected"),
    [(450, 50, 9), (450, 25, 18), (900, 900, 1), (450, 0, 1), (0, 50, 1)],
)
def test_case_90_fabric_ratio(intra: float, inter: float, expected: float) -> None:
    assert L.fabric_ratio(intra, inter) == expected


# --- model.md §5.1 floor-and-rate and collectives: cases 21-24, 30-34 ---------------------


def test_case_21_floor_dominates_small_transfer() -> None:
    assert L.floor_and_rate(1024, 35.39e9, 10e-6) == 10e-6


def test_case_22_rate_dominates_large_transfer() -> None:
    assert L.floor_and_rate(2**30, 35.39e9, 10e-6) == pytest.approx(2**30 / 35.39e9, abs=1e-12)


def test_case_23_no_bytes_cost_the_floor() -> None:
    assert L.floor_and_rate(0, 35.39e9, 10e-6) == 10e-6


def test_case_24_no_rate_is_infinite() -> None:
    assert L.floor_and_rate(2**20, 0, 10e-6) == INF


def test_case_30_small_collective_sits_on_the_floor() -> None:
    assert L.collective_time(256, 92500e6, 131566e6, 15.98e-6) / 15.98e-6 <= 1.01


@pytest.mark.parametrize("nbytes", [1024, 2**20, 2**30])
def test_case_31_collective_without_transition_is_floor_and_rate(nbytes: int) -> None:
    assert L.collective_time(nbytes, 0, 200e9, 10e-6) == L.floor_and_rate(nbytes, 200e9, 10e-6)


def test_case_32_collective_never_beats_peak() -> None:
    assert L.collective_time(2**30, 2000e9, 200e9, 10e-6) >= 2**30 / 200e9


# h200 8-rank fp16 all-reduce (bytes, µs), model.md §14.2.
H200_ALL_REDUCE = [
    (256, 16.01), (1024, 15.98), (2048, 16.04), (4096, 16.67), (8192, 18.30), (16384, 18.38),
    (32768, 19.89), (65536, 21.45), (131072, 20.80), (262144, 20.46), (524288, 26.14),
    (1048576, 37.46), (2097152, 51.37), (4194304, 78.30), (8388608, 121.74),
    (16777216, 197.34), (33554432, 319.63), (67108864, 564.52), (134217728, 1052.63),
    (268435456, 2040.31),
]
FLOOR, PEAK, TRANS = 15.98e-6, 131566e6, 92500e6


def _predicted(nbytes: int, trans: float) -> float:
    return L.collective_time(nbytes, trans, PEAK, FLOOR)


def test_case_33_three_parameter_law_fits_the_h200_table() -> None:
    def geo_mean_error(trans: float) -> float:
        logs = [abs(math.log(_predicted(b, trans) / (us * 1e-6))) for b, us in H200_ALL_REDUCE]
        return math.exp(sum(logs) / len(logs))

    three, two = geo_mean_error(TRANS), geo_mean_error(0)
    assert three <= 1.25
    assert three < two


def test_case_34_transition_band_error_bounds() -> None:
    band = [(b, us * 1e-6) for b, us in H200_ALL_REDUCE if 65536 <= b <= 8 * 2**20]
    assert max(meas / _predicted(b, 0) for b, meas in band) >= 2.0
    assert max(meas / _predicted(b, TRANS) for b, meas in band) <= 1.5


# --- model.md §3.1 KV bytes: cases 35-38 --------------------------------------------------


def test_case_35_latent_kv_bytes_deepseek_v3() -> None:
    assert L.kv_bytes_per_token(1, 1, 576, 61, 1, True) == 35136


def test_case_36_non_latent_kv_bytes_is_twice_latent() -> None:
    assert L.kv_bytes_per_token(1, 1, 576, 61, 1, False) == 70272


@pytest.mark.parametrize("tp", [2, 4, 8, 16])
def test_case_37_one_kv_head_floors_at_one_per_rank(tp: int) -> None:
    assert L.kv_bytes_per_token(1, tp, 576, 61, 1, True) == 35136


def test_case_38_kv_bytes_closed_form_20000_draws_seed_1() -> None:
    rng = random.Random(1)
    for _ in range(20_000):
        n_kv, tp = rng.randint(1, 128), rng.randint(1, 64)
        head_dim, layers = rng.randint(1, 1024), rng.randint(1, 256)
        dt = rng.choice([0.5, 0.5625, 1.0, 2.0, 4.0])
        latent = rng.random() < 0.5
        expected = max(n_kv // tp, 1) * (head_dim + (0 if latent else head_dim)) * dt * layers
        assert L.kv_bytes_per_token(n_kv, tp, head_dim, layers, dt, latent) == expected


# --- model.md §3.5 windowed causal work: cases 45-48, §14.2 ----------------------


def test_case_45_fully_windowed_chunk() -> None:
    assert L.windowed_causal_flops([(1024, 131072)], 2176) == 4 * 1024 * 2176 == 8_912_896


@pytest.mark.parametrize(("s", "c"), [(1024, 0), (1024, 8192), (4096, 131072), (1, 0)])
def test_case_46_inactive_window_is_full_causal(s: int, c: int) -> None:
    expected = 4 * (s * c + s * s / 2)
    assert L.windowed_causal_flops([(s, c)], s + c) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("window", [0, -1])
def test_case_47_no_window_is_zero(window: int) -> None:
    assert L.windowed_causal_flops([(1024, 4096)], window) == 0


def _brute_windowed(chunks: list[tuple[int, int]], w: int) -> float:
    total = 0.0
    for s, prefix in chunks:
        for i in range(s):
            p = prefix + i
            lo = max(0, p - w + 1)
            total += p - lo + 1 - (0.5 if p + 1 <= w else 0.0)
    return 4 * total


@pytest.mark.parametrize(
    ("chunks", "w"),
    [
        ([(100, 0)], 64),
        ([(100, 30)], 64),
        ([(7, 60)], 64),
        ([(1, 0), (33, 5)], 16),
        ([(250, 1000), (3, 2)], 128),
        ([(64, 63)], 64),
        ([(512, 0)], 2176),
    ],
)
def test_case_48_windowed_equals_brute_force(chunks: list[tuple[int, int]], w: int) -> None:
    assert L.windowed_causal_flops(chunks, w) == pytest.approx(
        _brute_windowed(chunks, w), abs=1e-6
    )


@pytest.mark.parametrize(("prefix", "ratio"), [(8192, 4.0), (32768, 15.29), (131072, 60.47)])
def test_behaviour_10_7_windowed_prefill_overcharge(prefix: int, ratio: float) -> None:
    windowed = L.windowed_causal_flops([(1024, prefix)], 2176)
    assert L.causal_pairs(1024, prefix) / windowed == pytest.approx(ratio, abs=0.005)


# --- model.md §3.7 DCP: cases 52-59 -------------------------------------------------------


def _vllm_dcp_rank_len(length: int, dcp: int, inter: int, rank: int) -> int:
    """vLLM get_dcp_local_seq_lens for one rank."""
    base = length // inter // dcp * inter
    remainder = length - base * dcp
    return base + min(max(remainder - rank * inter, 0), inter)


def test_case_52_dcp_local_tokens_is_vllm_busiest_rank() -> None:
    for dcp in (2, 4, 8):
        for inter in (1, 16, 32):
            for length in range(600):
                ranks = [_vllm_dcp_rank_len(length, dcp, inter, r) for r in range(dcp)]
                expected = max(max(ranks), 1) if length > 0 else 0
                assert L.dcp_local_tokens([length], dcp, inter) == expected


@pytest.mark.parametrize("length", [1, 7, 100, 999, 8192, 131072])
@pytest.mark.parametrize("dcp", [2, 3, 8])
def test_case_53_dcp_interleave_one_is_ceil(length: int, dcp: int) -> None:
    assert L.dcp_local_tokens([length], dcp, 1) == math.ceil(length / dcp)


def test_case_54_dcp_interleave_32() -> None:
    assert L.dcp_local_tokens([1000], 8, 32) == 128


def test_case_55_dcp_sums_per_request_shares() -> None:
    assert L.dcp_local_tokens([1000] * 4, 3, 1) == 1336
    assert L.dcp_local_tokens([4000], 3, 1) == 1334


@pytest.mark.parametrize("dcp", [2, 8, 64])
def test_case_56_one_token_is_one_per_rank(dcp: int) -> None:
    assert L.dcp_local_tokens([1], dcp, 1) == 1


@pytest.mark.parametrize("dcp", [0, -4])
def test_case_57_dcp_off_is_minus_one(dcp: int) -> None:
    assert L.dcp_local_tokens([4096], dcp, 1) == -1


def test_case_58_interleave_zero_means_one() -> None:
    assert L.dcp_local_tokens([4096], 4, 0) == 1024


@pytest.mark.parametrize(
    ("kind", "shards"),
    [("gqa", True), ("mla", True), ("sparse_mla", True), ("swa", False), ("something-new", False)],
)
def test_case_59_dcp_shards_kv(kind: str, shards: bool) -> None:
    assert L.dcp_shards_kv(kind) is shards


def test_behaviour_10_7_dcp_interleave_64() -> None:
    assert L.dcp_local_tokens([100], 8, 64) == 64


# --- model.md §3.8 PCP: cases 60-68, §14.2 ---------------------------------------


def _zigzag_busiest(s: int, pcp: int) -> int:
    n_chunks = 2 * pcp
    ch = math.ceil(s / n_chunks)
    held = [0] * pcp
    for token in range(s):
        chunk = token // ch
        held[chunk if chunk < pcp else n_chunks - 1 - chunk] += 1
    return max(held)


def test_case_60_pcp_local_tokens_is_zigzag_busiest_rank() -> None:
    for pcp in (2, 4, 8):
        for s in range(1, 600):
            assert L.pcp_local_tokens(s, pcp, 1) == _zigzag_busiest(s, pcp)


def test_case_61_pcp_with_dcp_replicates_short_requests() -> None:
    for pcp in (2, 4, 8):
        for s in range(1, 80):
            replicated = (2 * pcp - 1) * math.ceil(s / (2 * pcp)) >= s
            expected = s if replicated else _zigzag_busiest(s, pcp)
            assert L.pcp_local_tokens(s, pcp, 2) == expected


def test_case_62_pcp_replication_edge() -> None:
    assert L.pcp_local_tokens(17, 8, 2) == 17
    assert L.pcp_local_tokens(16, 8, 2) == 2


@pytest.mark.parametrize(("s", "pcp"), [(4096, 1), (4096, 0), (4096, -2), (0, 4)])
def test_case_63_pcp_off_is_minus_one(s: int, pcp: int) -> None:
    assert L.pcp_local_tokens(s, pcp, 1) == -1


@pytest.mark.parametrize(("s", "c"), [(4096, 8192), (2048, 0), (8192, 131072), (1024, 203760)])
@pytest.mark.parametrize("pcp", [2, 4, 8])
def test_case_64_even_zigzag_splits_causal_work_evenly(s: int, c: int, pcp: int) -> None:
    assert s % (2 * pcp) == 0
    expected = 4 * (s * c + s * s / 2) / pcp
    assert L.pcp_causal_pairs(s, c, pcp, 1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("case", "s", "c", "pcp", "ratio", "tol"),
    [
        (65, 4096, 0, 8, 1.000000, 1e-12),
        (66, 1001, 0, 8, 1.014035, 1e-5),
        (67, 1001, 8192, 4, 1.007398, 1e-5),
        (68, 100, 0, 8, 1.254400, 1e-5),
    ],
)
def test_cases_65_to_68_pcp_causal_pairs_over_even_share(
    case: int, s: int, c: int, pcp: int, ratio: float, tol: float
) -> None:
    even = 4 * (s * c + s * s / 2) / pcp
    assert L.pcp_causal_pairs(s, c, pcp, 1) / even == pytest.approx(ratio, abs=tol)


def test_behaviour_10_7_pcp_vectors() -> None:
    assert L.pcp_causal_pairs(100, 0, 8, 1) / (4 * 100**2 / 2) == pytest.approx(0.1568, abs=1e-12)
    assert L.pcp_local_tokens(100, 8, 1) / 100 == pytest.approx(0.14)
    assert L.pcp_local_tokens(2, 2, 1) == 1


def test_pcp_busiest_chunks_zigzag_and_replicated() -> None:
    # ch = 63: rank 0 holds chunks 0 and 15 (63 + 56 tokens), rank 1 chunks 1 and 14 (126)
    chunks = L.pcp_busiest_chunks(1001, 0, 8, 1)
    assert sum(n for n, _ in chunks) == L.pcp_local_tokens(1001, 8, 1)
    assert chunks == [(63, 63), (63, 882)]  # rank 1 is the first with 126 tokens
    assert L.pcp_busiest_chunks(17, 5, 8, 2) == [(17, 5)]  # replicated
    assert L.pcp_busiest_chunks(17, 5, 1, 1) == [(17, 5)]  # pcp off


# --- model.md §3.6 sparse selection: cases 69-72 ------------------------------------------


def test_case_69_short_contexts_read_whole() -> None:
    assert L.selected_kv_tokens([1024] * 4, 1024, 4) == 4096


def test_case_70_past_topk_is_compressed() -> None:
    assert L.selected_kv_tokens([4096], 1024, 4) == 1792


def test_case_71_window_as_topk() -> None:
    topk = L.sparse_top_k("sparse_mla", 0, 128)
    assert topk == 128
    assert L.selected_kv_tokens([65536], topk, 128) == 128 + 65408 / 128 == 639


@pytest.mark.parametrize("kind", ["gqa", "mla", "sparse_mla"])
def test_case_72_no_selection_is_minus_one(kind: str) -> None:
    assert L.selected_kv_tokens([65536], L.sparse_top_k(kind, 0, 0), 0) == -1


# --- model.md §9.3 dtypes: cases 73-76 ----------------------------------------------------


def test_case_73_int4_runs_at_bf16_peak() -> None:
    int4 = L.dtype_fit("int4", 1000, 2000, 4000)
    assert int4 == L.dtype_fit("bf16", 1000, 2000, 4000) == ("bf16", 1e15)
    assert int4[1] != L.dtype_fit("nvfp4", 1000, 2000, 4000)[1]


@pytest.mark.parametrize("declared", ["auto", ""])
@pytest.mark.parametrize(
    ("served", "expected"),
    [("int4", 2), ("nvfp4", 2), ("mxfp4", 2), ("fp8", 2), ("bf16", 2), ("fp32", 4)],
)
def test_case_74_auto_cache_is_at_least_bf16(declared: str, served: str, expected: float) -> None:
    assert L.cache_dtype_bytes(declared, L.dtype_bytes(served)) == expected


def test_case_75_fp8_cache_on_int4_weights() -> None:
    assert L.cache_dtype_bytes("fp8", L.dtype_bytes("int4")) == 1


def test_case_76_nvfp4_cache_counts_its_scales() -> None:
    assert L.cache_dtype_bytes("nvfp4", L.dtype_bytes("bf16")) == 0.5625


def test_cache_dtype_table_and_dtype_fit_fallbacks() -> None:
    assert L.cache_dtype_bytes("nvfp4_ds_mla", 2) == 0.5
    assert L.cache_dtype_bytes("float32", 2) == 4
    assert L.cache_dtype_bytes("fp8_e5m2", 2) == 1
    assert L.cache_dtype_bytes("something-new", 1.0) == 1.0  # unknown -> fallback
    assert L.dtype_fit("fp8", 1000, 0, 0) == ("bf16", 1e15)
    assert L.dtype_fit("nvfp4", 1000, 2000, 0) == ("fp8", 2e15)
    assert L.dtype_fit("mxfp4", 1000, 0, 0) == ("bf16", 1e15)
    assert L.dtype_fit("int8", 1000, 0, 4000) == ("fp8", 0.0)  # int8 has no fallback


# --- model.md §5.3, §7.1 width snapping: cases 83-89 (pure parts) -------------------------


def test_case_83_unmeasured_width_inside_sweep_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        L.snap_collective_width(8, [2, 4], op="all_reduce", chip="gb300")
    for part in ("8-rank", "all_reduce", "gb300", "[2 4]"):
        assert part in str(err.value)


@pytest.mark.parametrize(("case", "width", "expected"), [(84, 32, 8), (86, 4, 4), (87, 8, 8)])
def test_cases_84_86_87_collective_width_snaps(case: int, width: int, expected: int) -> None:
    assert L.snap_collective_width(width, [2, 4, 8]) == expected


def test_case_85_width_16_without_measurement_is_refused() -> None:
    with pytest.raises(ValueError):
        L.snap_collective_width(16, [2, 4, 8])


def test_collective_width_below_narrowest_and_none_measured() -> None:
    assert L.snap_collective_width(1, [2, 4, 8]) == 2
    with pytest.raises(ValueError, match="no measured"):
        L.snap_collective_width(8, [])


def test_case_88_measured_widths_need_a_full_triple() -> None:
    names = [
        "collective_floor_all_reduce_fp16_2rank_h200",
        "collective_peak_rate_all_reduce_fp16_2rank_h200",
        "collective_transition_rate_all_reduce_fp16_2rank_h200",
        "collective_floor_all_reduce_fp16_4rank_h200",
        "collective_peak_rate_all_reduce_fp16_4rank_h200",
        "collective_floor_all_gather_fp16_8rank_h200",
        "hbm_derate",
    ]
    assert L.measured_collective_widths(names, "all_reduce", "h200") == [2]


def test_case_89_snap_declared() -> None:
    assert L.snap_declared(8, [2, 4, 8]) == 8
    assert L.snap_declared(16, [2, 4, 8]) == 8
    assert L.snap_declared(1, [2, 4, 8]) == 2
    assert L.snap_declared(3, []) == 3


# --- model.md §9.5 defaults: case 110 (chip memory sizes are the public figures) ----------


@pytest.mark.parametrize(
    ("chip", "gib", "expected"),
    [
        ("a100-80", 80, 2048), ("a100-sxm", 80, 2048), ("l40s", 48, 2048),
        ("h100", 80, 8192), ("h200", 141, 8192),
        ("b200", 180, 16384), ("b300", 288, 16384), ("gb200-nvl72", 186, 16384),
        ("gb300", 288, 16384),
    ],
)
def test_case_110_default_max_num_batched_tokens(chip: str, gib: float, expected: int) -> None:
    assert L.default_max_num_batched_tokens(gib, chip) == expected


def test_default_max_num_seqs() -> None:
    assert L.default_max_num_seqs(141, "h200") == 1024
    assert L.default_max_num_seqs(80, "A100-80") == 256
    assert L.default_max_num_seqs(48, "l40s") == 256


# --- model.md §4.1, §7 experts and recurrent state, §14.2 ------------------------


def test_behaviour_10_7_experts_touched() -> None:
    assert L.experts_touched(1, 224, 8, 14) == pytest.approx(0.5, abs=1e-12)
    assert L.experts_touched(128, 224, 8, 14) / 14 == pytest.approx(0.9905, abs=0.01)
    assert L.experts_touched(0, 224, 8, 14) == 0
    assert L.experts_touched(5, 8, 8, 14) == 14  # top-k covers every expert


def test_experts_per_rank() -> None:
    assert L.experts_per_rank(256, 8) == (32, 32)
    assert L.experts_per_rank(258, 8) == (32, 33)
    assert L.experts_per_rank(7, 8) == (0, 1)


def test_recurrent_state_bytes_modes() -> None:
    assert L.recurrent_state_bytes(100.0, "none", 1000, 16, 2, 0) == 300
    assert L.recurrent_state_bytes(100.0, "align", 1000, 16, 2, 1) == 500
    assert L.recurrent_state_bytes(100.0, "all", 1000, 16, 2, 0) == 100 * (63 + 2)
    assert L.recurrent_state_bytes(100.0, "all", 1000, 0, 2, 0) == 100
    assert L.recurrent_state_bytes(0.0, "none", 1000, 16, 2, 0) == 0


def test_mla_context_chunk_alignment() -> None:
    assert L.mla_context_chunk(0, 256, 16, 1, 1) == 65536
    assert L.mla_context_chunk(4096, 256, 16, 1, 1) == 32768
    assert L.mla_context_chunk(1 << 20, 1024, 64, 8, 1) == 65536
    assert L.mla_context_chunk(100, 1, 16, 3, 1) == 17 * 48  # lcm(16, 3) = 48


# --- model.md §0.1 durations --------------------------------------------------------------


def test_durations() -> None:
    assert L.to_duration_ns(NAN) == 0
    assert L.to_duration_ns(-1.0) == 0
    assert L.to_duration_ns(INF) == L.MAX_DURATION_NS == 2**63 - 1
    assert L.to_duration_ns(1e300) == L.MAX_DURATION_NS
    assert L.to_duration_ns(1.9999999999e-9) == 1  # truncated
    assert L.us_to_duration_ns(15.98) == 15980
    assert L.duration_seconds(1_500_000_000) == 1.5
    assert L.duration_seconds(L.us_to_duration_ns(7.39)) == 7.39e-6


# --- model.md §7.3–§7.5: SW-A ring and page arithmetic ----------------------------------

SW_A_PAGE = L.paged_bytes(16, 16, L.kv_bytes_per_token(8, 1, 64, 1, 2, False))
SW_A_PB = 18 * SW_A_PAGE  # G = 18 layers per group
SW_A = {"window": 128, "block": 16, "max_model_len": 131072}


def test_seed_0_6_sw_a_page_and_pool_block() -> None:
    assert SW_A_PAGE == 32768
    assert SW_A_PB == 589_824


def test_seed_0_5_ring_bound_versus_exact_hold() -> None:
    # Exact worst-case hold 1 + cdiv(w + f - 2, B) is one page under the bound iff B | w+f-2.
    for f in range(1, 200):
        exact = 1 + L.cdiv(128 + f - 2, 16)
        bound = L.ring_pages(in_flight=f, **SW_A)
        assert bound == exact + (1 if (128 + f - 2) % 16 == 0 else 0)
    assert L.ring_pages(in_flight=1, **SW_A) == 9
    assert L.ring_pages(in_flight=2, **SW_A) == 10


@pytest.mark.parametrize(
    ("k", "expected"), [(0, 5_308_416), (1, 5_898_240)]
)
def test_seed_1_sequence_fixed_bytes_sw_a(k: int, expected: int) -> None:
    assert L.ring_pages(in_flight=1 + k, **SW_A) * SW_A_PB == expected


def test_seed_1_hy_m_pool_block_and_fixed_bytes() -> None:
    state_page = ((4096 + 2 * 8 * 128) * 3 + 64 * 64 * 128) * 2
    assert state_page == 1_085_440
    attn_block = 16 * L.cdiv(state_page, 16 * 4096)
    assert attn_block == 272
    pool_block = 4 * attn_block * 4096
    assert pool_block == 4_456_448
    assert 6 * (1 + 0) * pool_block == 26_738_688  # mode none, K = 0
    assert 6 * (2 + 0) * pool_block == 53_477_376  # mode align
    legacy = 24 * L.recurrent_state_bytes(state_page, "none", 131072, 272, 0, 0)
    assert legacy == 26_050_560


@pytest.mark.parametrize(
    ("tokens", "expected"), [(1000, 37_158_912), (131072, 4_831_838_208)]
)
def test_seed_2_sequence_variable_bytes_sw_a(tokens: int, expected: int) -> None:
    assert L.cdiv(L.cdiv(tokens, 1), 16) * SW_A_PB == expected


@pytest.mark.parametrize(("tokens", "expected"), [(1000, 17_825_792), (131072, 2_148_007_936)])
def test_seed_2_sequence_variable_bytes_hy_m(tokens: int, expected: int) -> None:
    assert L.cdiv(tokens, 272) * 4_456_448 == expected


def test_seed_2_mla_d_legacy_paged_bytes() -> None:
    kappa = L.kv_bytes_per_token(1, 8, 576, 61, 2, True)
    assert kappa == 70_272
    assert L.paged_bytes(L.cdiv(10_000, 8), 16, kappa) == 88_823_808
    assert L.cdiv(10_000, 16 * 8) == 79  # vLLM's block count agrees


@pytest.mark.parametrize(
    ("budget", "pages", "expected"), [(8192, 521, 307_298_304), (2048, 137, 80_805_888)]
)
def test_seed_3_sequence_admission_bytes_sw_a(budget: int, pages: int, expected: int) -> None:
    assert L.ring_pages(in_flight=budget, **SW_A) == pages
    assert pages * SW_A_PB == expected


def test_seed_3_reported_blocks_per_request_sw_a() -> None:
    full = L.cdiv(131072, 16)
    assert full + L.ring_pages(in_flight=8192, **SW_A) == 8713


@pytest.mark.parametrize(
    ("in_flight", "pages", "expected"),
    [(1, 9, 5_308_416), (2, 10, 5_898_240), (512, 41, 24_182_784), (8192, 521, 307_298_304)],
)
def test_seed_4_sequence_bounded_bytes_sw_a(in_flight: int, pages: int, expected: int) -> None:
    assert L.ring_pages(in_flight=in_flight, **SW_A) == pages
    assert pages * SW_A_PB == expected


def test_seed_4_negative_in_flight_clamps_to_zero() -> None:
    assert L.ring_pages(in_flight=-5, **SW_A) == L.cdiv(127, 16) + 1 == 9


@pytest.mark.parametrize(
    ("computed", "in_flight", "pages", "expected"),
    [
        (50, 1, 4, 2_359_296),
        (120, 1, 8, 4_718_592),
        (130, 1, 9, 5_308_416),
        (50, 512, 36, 21_233_664),
        (0, 8192, 512, 301_989_888),
        (1000, 1, 9, 5_308_416),
    ],
)
def test_seed_5_sequence_bounded_bytes_at_sw_a(
    computed: int, in_flight: int, pages: int, expected: int
) -> None:
    assert L.ring_pages_at(computed, in_flight, **SW_A) == pages
    assert pages * SW_A_PB == expected


def test_seed_5_edges() -> None:
    assert L.ring_pages_at(0, 0, **SW_A) == 0
    assert L.ring_pages_at(-3, -1, **SW_A) == 0
    # c + f >= L with w - 1 + f >= L: one page under the bound
    capped = {"window": 128, "block": 16, "max_model_len": 100}
    assert L.ring_pages_at(200, 50, **capped) == L.cdiv(100, 16)
    assert L.ring_pages(in_flight=50, **capped) == L.cdiv(100, 16) + 1


# --- model.md §9.6 CaptureTokens: every row of the table, and the edges ------------------


@pytest.mark.parametrize(
    ("row", "kwargs", "expected"),
    [
        ("H200 S=1024 M=8192 K=0", {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, 512),
        ("S=100 M=2048 K=0", {"max_num_seqs": 100, "max_num_batched_tokens": 2048}, 200),
        ("S=130 M=8192", {"max_num_seqs": 130, "max_num_batched_tokens": 8192}, 256),
        ("M=300 <= C0=512", {"max_num_seqs": 1024, "max_num_batched_tokens": 300}, 300),
        (
            "B200 S=256 K=3",
            {"max_num_seqs": 256, "decode_query_len": 4, "max_num_batched_tokens": 16384,
             "blackwell_family_100": True},
            1024,
        ),
        (
            "H200 S=256 K=2 FULL runner V1",
            {"max_num_seqs": 256, "decode_query_len": 3, "max_num_batched_tokens": 8192},
            504,
        ),
        (
            "H200 S=256 K=2 FULL runner V2",
            {"max_num_seqs": 256, "decode_query_len": 3, "max_num_batched_tokens": 8192,
             "model_runner_v1": False},
            512,
        ),
        (
            "stated max 300, no sizes, M=8192",
            {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "max_capture_size": 300},
            288,
        ),
        (
            "stated sizes [1..64]",
            {"max_num_seqs": 1024, "max_num_batched_tokens": 8192,
             "stated_sizes": [1, 2, 4, 8, 16, 32, 64]},
            64,
        ),
    ],
)
def test_seed_7_capture_tokens_table(row: str, kwargs: dict[str, object], expected: int) -> None:
    args: dict[str, Any] = {"decode_query_len": 1, **kwargs}
    assert max(L.capture_sizes(**args)) == expected  # CaptureTokens: the largest size


def test_seed_7_capture_sizes_edges() -> None:
    # old kernel ceiling 260 is off the grid; vLLM captures up to 256
    assert L.capture_sizes(130, 1, 8192)[-8:] == [200, 208, 216, 224, 232, 240, 248, 256]
    # C < 8: only {1, 2, 4} under the ceiling
    assert L.capture_sizes(1, 1, 8192) == [1, 2]
    assert L.capture_sizes(3, 1, 5) == [1, 2, 4, 5]  # M = 5 <= C0 = 6 is appended
    with pytest.raises(ValueError):
        L.capture_sizes(256, 1, 64, stated_sizes=[128, 256])  # every stated size > M
    with pytest.raises(ValueError):
        L.capture_sizes(256, 1, 8192, max_capture_size=48, stated_sizes=[8, 16, 32])


# --- model.md §6.2 TierTime via floor_and_rate + to_duration ----------------------------


def _tier_time_ns(read_mbs: float, write_mbs: float, latency_us: float, host_mbs: float,
                  to_tier: bool, nbytes: float, depth: int) -> int:
    rate = (write_mbs if to_tier else read_mbs) * 1e6
    host = host_mbs * 1e6
    if host > 0 and rate > host:
        rate = host
    if depth > 1:
        rate /= depth
    return L.to_duration_ns(L.floor_and_rate(nbytes, rate, latency_us * 1e-6))


@pytest.mark.parametrize(
    ("call", "to_tier", "nbytes", "depth", "expected"),
    [
        ("read 64 MiB depth 1", False, 64 * 2**20, 1, 2_684_354),
        ("read 64 MiB depth 4", False, 64 * 2**20, 4, 10_737_418),
        ("write 64 MiB depth 1", True, 64 * 2**20, 1, 3_355_443),
        ("bytes = 0", False, 0, 1, 10_000),
    ],
)
def test_seed_11_tier_time_table(
    call: str, to_tier: bool, nbytes: int, depth: int, expected: int
) -> None:
    assert _tier_time_ns(25_000, 20_000, 10, 32_000, to_tier, nbytes, depth) == expected


def test_seed_11_unknown_tier_and_no_rate_are_max_duration() -> None:
    assert L.to_duration_ns(INF) == 9_223_372_036_854_775_807  # unknown tier sentinel
    assert _tier_time_ns(0, 0, 10, 32_000, False, 1024, 1) == 9_223_372_036_854_775_807
