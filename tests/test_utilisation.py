"""Per-step FLOPs, bytes, MFU and MBU: hand arithmetic on the round-number fixtures, and the
array path equal, bit for bit, to the scalar path on random batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.model import step, utilisation
from kernel.model.types import Batch, Request

from .fixtures_pools import HIDDEN, replace, tiny_dense, tiny_moe_mla, tiny_pcp

HBM_PEAK = 2e12  # the fixtures' catalog HBM bandwidth (the derated hbm_bps is 1e12)
PEAK = 1e15  # the fixtures' dense peak

# tiny_dense, per layer (4 layers, tp 1): q/k/v/o GEMMs of 2·1536·1024 + 2·1024·1024 FLOPs per
# token, the same elements of bf16 weight, 4,096 element-wise bytes per token, KV of
# 2 kv heads × 128 × 2 (K and V) × 2 bytes = 1,024 bytes per token, an all-reduce of
# HIDDEN × 2 bytes per token. Head: 2·32,000·1,024 FLOPs per token, 32,000·1,024·2 bytes.
DENSE_FLOPS = 2 * 1536 * 1024 + 2 * 1024 * 1024
DENSE_WEIGHT = (1536 * 1024 + 1024 * 1024) * 2
ELEMENTWISE = 4096
KV_PER_TOKEN_LAYER = 2 * 128 * 2 * 2
AR_BYTES = HIDDEN * 2
HEAD_FLOPS = 2 * 32000 * 1024
HEAD_WEIGHT = 32000 * 1024 * 2


def _price(r, batch: Batch) -> tuple[utilisation.Utilisation, int]:
    ns = step.step_time_into(r, batch, None).no_overlap
    return utilisation.step_utilisation(r, batch, ns), ns


def _check_rates(u: utilisation.Utilisation, ns: int) -> None:
    secs = ns / 1e9
    assert u.mfu == pytest.approx(u.flops / (secs * PEAK), rel=1e-15)
    assert u.mbu == pytest.approx(u.hbm_bytes / (secs * HBM_PEAK), rel=1e-15)


def test_dense_decode_step_by_hand() -> None:
    r = replace(tiny_dense(), chip_hbm_peak_bps=HBM_PEAK)
    batch = Batch([Request(1, 1023)] * 8, decode_threshold=1)  # 8 decodes at context 1,024
    u, ns = _price(r, batch)
    T, layers = 8, 4
    flops = layers * T * DENSE_FLOPS + T * HEAD_FLOPS  # 692,060,160
    kv_read = 8 * 1024 * KV_PER_TOKEN_LAYER  # every decode reads its whole context
    hbm = layers * (DENSE_WEIGHT + T * ELEMENTWISE + kv_read) + HEAD_WEIGHT  # 120,193,024
    assert (flops, hbm) == (692_060_160, 120_193_024)
    assert u.flops == pytest.approx(flops, rel=1e-15)
    assert u.hbm_bytes == pytest.approx(hbm, rel=1e-15)
    assert u.nvlink_bytes == pytest.approx(layers * T * AR_BYTES, rel=1e-15)
    assert u.nic_bytes == 0.0
    _check_rates(u, ns)
    assert 0 < u.mfu < u.mbu < 1  # a small decode is memory-bound


def test_prefill_chunk_by_hand() -> None:
    r = replace(tiny_dense(), chip_hbm_peak_bps=HBM_PEAK)
    batch = Batch([Request(512, 1024)], decode_threshold=1)  # a 512-token chunk after 1,024
    u, ns = _price(r, batch)
    T, layers = 512, 4
    # Causal attention: 4·(s·C + s²/2) pair-FLOPs per q-head dimension (QKᵀ and PV, 2 each).
    pairs = 4 * (512 * 1024 + 512 * 512 / 2)
    attn = pairs * 8 * 128  # 8 q heads × head dim 128, tp 1
    flops = layers * (T * DENSE_FLOPS + attn) + T * HEAD_FLOPS
    hbm = layers * (DENSE_WEIGHT + T * ELEMENTWISE) + HEAD_WEIGHT  # no decode: no KV read
    assert u.flops == pytest.approx(flops, rel=1e-15)
    assert u.hbm_bytes == pytest.approx(hbm, rel=1e-15)
    assert u.nvlink_bytes == pytest.approx(layers * T * AR_BYTES, rel=1e-15)
    _check_rates(u, ns)
    assert u.mfu > u.mbu  # a prefill chunk is compute-heavy


def test_moe_step_by_hand() -> None:
    # 6 MLA+MoE layers, tp 2, 16 experts top-2, expert weights split over 2 tensor shards,
    # MoE imbalance 1.25; no DCP. Four decodes at context 2,048.
    r = replace(tiny_moe_mla(dcp=1), chip_hbm_peak_bps=HBM_PEAK)
    batch = Batch([Request(1, 2047)] * 4, decode_threshold=1)
    u, ns = _price(r, batch)
    T, tp, layers = 4, 2, 6
    dense = T * (2 * 2048 * 1024) / tp
    routed = T * 2 * 1.0 * (2 * 3 * 512 * 1024) * 1.25  # not ÷ tp: the kernel's over-charge
    shared = T * (2 * 3 * 512 * 1024) / tp
    head = T * HEAD_FLOPS / tp
    flops = layers * (dense + routed + shared) + head
    touched = 16 * (1 - (14 / 16) ** 4)  # experts 4 tokens × top-2 touch, of 16 local
    weights = 2048 * 1024 / tp + 3 * 512 * 1024 / tp  # dense + shared expert, fp8
    experts = (3 * 512 * 1024 / 2) * touched
    kv = 4 * 2048 * 576  # MLA latent cache: 576 bytes per token per layer
    hbm = layers * (weights + T * ELEMENTWISE / tp + experts + kv) + HEAD_WEIGHT / tp
    assert u.flops == pytest.approx(flops, rel=1e-15)
    assert u.hbm_bytes == pytest.approx(hbm, rel=1e-12)
    assert u.nvlink_bytes == pytest.approx(layers * T * AR_BYTES, rel=1e-15)
    _check_rates(u, ns)


def test_empty_step_does_no_work_and_a_missing_peak_is_an_error() -> None:
    r = replace(tiny_dense(), chip_hbm_peak_bps=HBM_PEAK)
    u, _ = _price(r, Batch([], decode_threshold=1))
    assert (u.flops, u.hbm_bytes, u.nvlink_bytes, u.nic_bytes, u.mfu, u.mbu) == (0,) * 6
    with pytest.raises(ValueError, match="chip_hbm_peak_bps"):
        utilisation.peaks(tiny_dense())


def test_cross_node_gathers_count_as_nic_bytes() -> None:
    r = replace(tiny_pcp(2), chip_hbm_peak_bps=HBM_PEAK)
    u, _ = _price(r, Batch([Request(1024, 0)], decode_threshold=1))
    assert u.nic_bytes > 0  # the PCP all-gather crosses nodes (span 1.5)
    u0, _ = _price(r, Batch([Request(1, 100)], decode_threshold=1))
    assert u0.nic_bytes == 0.0  # no prefill, no PCP gather


_POOLS = {"dense": lambda: tiny_dense(), "moe-dcp": lambda: tiny_moe_mla(dcp=2),
          "moe-dcp-a2a": lambda: tiny_moe_mla(dcp=2, backend="a2a"),
          "pcp": lambda: tiny_pcp(2)}


@settings(max_examples=25, deadline=None)
@given(pool=st.sampled_from(sorted(_POOLS)), seed=st.integers(0, 2**32 - 1))
def test_arrays_equal_scalars_bit_for_bit(pool: str, seed: int) -> None:
    r = replace(_POOLS[pool](), chip_hbm_peak_bps=HBM_PEAK)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(12):
        n = int(rng.integers(0, 9))
        reqs = [Request(int(rng.choice([1, 1, 1, 2, int(rng.integers(2, 3000))])),
                        int(rng.choice([0, int(rng.integers(0, 200_000))])))
                for _ in range(n)]
        batches.append(Batch(reqs, decode_threshold=1))
    summaries = [step.summarise(r, b) for b in batches]
    ns = np.array([step.step_time_into(r, b, None).no_overlap for b in batches], np.int64)
    cols = utilisation.utilisation(r, utilisation.work_counts(r, step.stack_summaries(summaries)),
                                   ns)
    for i, b in enumerate(batches):
        one = utilisation.step_utilisation(r, b, int(ns[i]))
        for name, got in zip(utilisation.Utilisation._fields, cols, strict=True):
            want = getattr(one, name)
            assert np.float64(want).tobytes() == np.float64(got[i]).tobytes(), (name, i)


def test_kernel_utilisation_on_an_embedded_scenario() -> None:
    import kernel

    k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
    r = k.resolved_pool
    assert r.chip_hbm_peak_bps > r.coefficients.hbm_bps  # the catalog peak, not derated
    batch = Batch([Request(1, 4095)] * 32, decode_threshold=1)
    u = k.utilisation(batch)
    est = k.step_time(batch)
    assert u == utilisation.step_utilisation(r, batch, est.no_overlap)
    assert 0 < u.mfu < 1 and 0 < u.mbu < 1


@pytest.mark.parametrize("scenario", ["llama-3.1-8b-h100-tp1", "deepseek-v3-h200-fp8-sglang-tp8",
                                      "glm5-h200-tp8-dcp4", "deepseek-v3-h200-tp8-pcp2",
                                      "gpt-oss-120b-h200-fp4-vllm-tp8"])
def test_bulk_columns_equal_the_scalar_path_bit_for_bit(scenario: str) -> None:
    import polars as pl

    import kernel
    from kernel import bulk
    from kernel.bulk.utilisation import column_producer

    from .test_bulk import random_trace

    k = kernel.open(scenario)
    r = k.resolved_pool
    df = random_trace(150, seed=17)
    got = bulk.price(k, df, producers=[column_producer()])
    assert got.columns[-10:] == [*utilisation.UTILISATION_COLUMNS, *utilisation.EXTRA_COLUMNS,
                                 "scenario", "pool"]
    by_id = {b: g for (b,), g in df.group_by("batch_id", maintain_order=True)}
    for row in got.iter_rows(named=True):
        g = by_id[row["batch_id"]]
        s, c = g["scheduled"].to_list(), g["computed"].to_list()
        batch = Batch(list(zip(s, c, strict=True)), decode_threshold=int(g["decode_threshold"][0]),
                      sm_budget=int(g["sm_budget"][0]))
        est = step.step_time_into(r, batch, None)
        assert est.no_overlap == row["no_overlap_ns"]
        one = utilisation.step_utilisation(r, batch, est.no_overlap)
        for name in utilisation.UTILISATION_COLUMNS:
            want = np.float64(getattr(one, name)).tobytes()
            assert want == np.float64(row[name]).tobytes(), (scenario, row["batch_id"], name)
        summ = step.summarise(r, batch)
        assert row["prefill_tokens"] == summ.tokens_all - summ.decode_tokens
        shard = r.layout.dcp if r.layout.dcp > 1 and r.dcp_shards_all_kv_layers else 1
        assert row["kv_blocks"] == sum(-(-(x + y) // (r.block_size * shard))
                                       for x, y in zip(s, c, strict=True))
    assert isinstance(got, pl.DataFrame)
