"""Memory per rank (model.md §7, §14.5).

Decision followed throughout (lead's, resolving the old goldens against the seed API):
FixedBytes.comm_buffers is 0 and the communicator reservation + engine workspace are
PreSnapshotBytes. So the old golden "total" is fixed.total() + pre_snapshot_bytes, and the
old golden CommBuffers is pre_snapshot_bytes.
"""

from __future__ import annotations

import dataclasses

import pytest

from kernel.model import memory
from kernel.model.types import MemoryBreakdown
from tests.fixtures_pools import replace, tiny_dense, tiny_hybrid, tiny_moe_mla

GIB = 2**30


# --- fixtures, by hand ---------------------------------------------------------------------


def test_fixed_bytes_dense_by_hand() -> None:
    """4 layers × (1536+1024)·1024·2 B + head 32000·1024·2 + embedding 32000·1024·2, tp 1;
    activation 10·8192·1024·2; capture 1e8; no communicator in FixedBytes."""
    fb = memory.fixed_bytes(tiny_dense())
    assert fb == MemoryBreakdown(weights=4 * 5_242_880 + 65_536_000 + 65_536_000,
                                 activation_peak=10 * 8192 * 1024 * 2,
                                 cuda_graph=100_000_000, comm_buffers=0, eplb_redundant=0,
                                 pre_snapshot=536_870_912)
    assert memory.pre_snapshot_bytes(tiny_dense()) == 536_870_912  # tp 1: workspace only
    assert fb.with_pre_snapshot() == fb.total() + 536_870_912


def test_fixed_bytes_moe_by_hand() -> None:
    """tp 2, EP off: experts sharded by expertTensorShards (2), shared experts and dense by tp."""
    r = tiny_moe_mla()
    per_layer = 2048 * 1024 / 2 + 1_572_864 * 16 / 2 + 1_572_864 / 2
    fb = memory.fixed_bytes(r)
    assert fb.weights == int(6 * per_layer + (65_536_000 + 65_536_000) / 2)
    assert memory.pre_snapshot_bytes(r) == 400_000_000 + 536_870_912


def test_eplb_moved_out_of_weights() -> None:
    """model.md §7.1: eplb = Σ count·EWB·R/EW/ets is reported apart and subtracted from weights."""
    r = tiny_moe_mla()
    r2 = replace(r, eplb_redundant_experts=2)
    a, b = memory.fixed_bytes(r), memory.fixed_bytes(r2)
    eplb = 6 * 1_572_864 * 2 / 1 / 2
    assert b.eplb_redundant == int(eplb)
    assert b.weights == a.weights - int(eplb)
    assert b.total() == a.total()


def test_activation_floor_binds() -> None:
    r = tiny_dense()
    r2 = replace(r, memory=dataclasses.replace(r.memory, batched_tokens=1,
                                               activation_floor=5e7))
    assert memory.fixed_bytes(r2).activation_peak == 50_000_000


def test_sequence_variable_bytes_paged() -> None:
    """case 143: SVB(1) == SVB(16), SVB(17) == 2·SVB(16) at block 16; κ = 4096 B/token."""
    r = tiny_dense()
    assert memory.sequence_variable_bytes(r, 0) == 0
    assert memory.sequence_variable_bytes(r, -5) == 0
    assert memory.sequence_variable_bytes(r, 1) == 16 * 4096
    assert memory.sequence_variable_bytes(r, 16) == 16 * 4096
    assert memory.sequence_variable_bytes(r, 17) == 2 * 16 * 4096
    unpaged = replace(r, block_size=1)
    assert memory.sequence_variable_bytes(unpaged, 17) == 17 * 4096


def test_sequence_variable_bytes_dcp_shards_when_all_layers_shard() -> None:
    """model.md §7.4: t' = ceil(tokens/dcp) when every KV layer shards; else unsharded."""
    r = tiny_moe_mla(dcp=2)
    assert memory.sequence_variable_bytes(r, 33) == 2 * 16 * 3456  # cdiv(33,2)=17 → 2 blocks
    r2 = replace(r, dcp_shards_all_kv_layers=False)
    assert memory.sequence_variable_bytes(r2, 33) == 3 * 16 * 3456


def test_seed_mla_d_worked_example() -> None:
    """model.md §7.4 MLA-D: t = 10,000, d = 8, κ = 70,272, B = 16 → 79·16·70,272 = 88,823,808."""
    r = tiny_moe_mla(dcp=8, kv_bytes_per_token=70_272.0)
    assert memory.sequence_variable_bytes(r, 10_000) == 88_823_808


def test_recurrent_state_fixed_bytes_by_mode() -> None:
    """model.md §7.6 legacy: align → page·(2+K), none → page·(1+K), all → 0 (grows in SVB
    instead)."""
    page = 1_085_440
    assert memory.sequence_fixed_bytes(tiny_hybrid("align")) == 6 * page * 2
    assert memory.sequence_fixed_bytes(tiny_hybrid("none")) == 6 * page
    spec = tiny_hybrid("none", num_spec_tokens=2)
    assert memory.sequence_fixed_bytes(spec) == 6 * page * 3
    r_all = tiny_hybrid("all")
    assert memory.sequence_fixed_bytes(r_all) == 0
    kv = 16 * (2 * 2 * 128 * 2 * 2)
    assert memory.sequence_variable_bytes(r_all, 17) == 2 * kv + 6 * page * 2


def test_seed_hy_m_legacy_figure() -> None:
    """model.md §7.5 HY-M, mode none, legacy unpadded: 24·1,085,440 = 26,050,560."""
    r = tiny_hybrid("none", layers=(dataclasses.replace(tiny_hybrid().plan.layers[0], count=24),
                                    tiny_hybrid().plan.layers[1]))
    assert memory.sequence_fixed_bytes(r) == 26_050_560


def test_pure_attention_sequence_fixed_bytes_zero() -> None:
    """case 143 / model.md §14.5 item 5: no recurrent or window caches → every bounded method is
    0."""
    r = tiny_dense()
    assert memory.sequence_fixed_bytes(r) == 0
    assert memory.sequence_admission_bytes(r) == 0
    assert memory.sequence_bounded_bytes(r, 8192) == 0
    assert memory.sequence_bounded_bytes_at(r, 100, 1) == 0


@pytest.mark.parametrize("mode", ["align", "none", "all"])
def test_seed_invariants_legacy(mode: str) -> None:
    """model.md §14.5 items 1–4 on a legacy graph: Bounded(1+K) == Fixed; Bounded(M) == Admission;
    At(c, f) <= Bounded(f); non-decreasing in f and c."""
    r = tiny_hybrid(mode)
    k = r.num_spec_tokens
    fixed = memory.sequence_fixed_bytes(r)
    assert memory.sequence_bounded_bytes(r, 1 + k) == fixed
    assert memory.sequence_bounded_bytes(r, r.max_num_batched_tokens) == \
        memory.sequence_admission_bytes(r)
    prev = -1
    for f in (0, 1, 2, 512, 8192):
        b = memory.sequence_bounded_bytes(r, f)
        assert b >= prev
        prev = b
        for c in (0, 100, 10_000):
            assert memory.sequence_bounded_bytes_at(r, c, f) <= b


def test_kv_capacity_by_hand() -> None:
    """budget = 80 GiB·0.9 − FixedBytes total; page = SVB(16); concurrency per model.md §14.5 item
    9."""
    r = tiny_dense()
    fixed = memory.fixed_bytes(r)
    cap = memory.kv_capacity(r, fixed, 0.9)
    assert not cap.utilization_assumed
    budget = int(80 * GIB * 0.9) - fixed.total()
    assert cap.budget_bytes == budget
    assert cap.page_bytes == 65_536
    assert cap.num_blocks == budget // 65_536
    assert cap.tokens == cap.num_blocks * 16
    assert cap.max_concurrency == cap.num_blocks * 65_536 / (32768 * 4096)
    assert memory.kv_capacity(r, fixed, 0.5).budget_bytes == int(80 * GIB * 0.5) - fixed.total()
    unstated = memory.kv_capacity(r, fixed)  # vLLM's default 0.92 (docs/decisions.md)
    assert unstated.utilization_assumed and unstated.utilization == 0.92
    assert unstated.budget_bytes == int(80 * GIB * 0.92) - fixed.total()


def test_kv_capacity_dcp_tokens_and_admission() -> None:
    r = tiny_moe_mla(dcp=2)
    cap = memory.kv_capacity(r, memory.fixed_bytes(r))
    assert cap.page_bytes == 16 * 3456
    assert cap.tokens == cap.num_blocks * 16 * 2
    h = tiny_hybrid("align")
    cap_h = memory.kv_capacity(h, memory.fixed_bytes(h))
    per_req = memory.sequence_variable_bytes(h, h.max_model_len) + \
        memory.sequence_admission_bytes(h)
    assert cap_h.max_concurrency == cap_h.num_blocks * cap_h.page_bytes / per_req


def test_tripling_memory_magnitudes_moves_memory_not_steps() -> None:
    """case 113 style: comm/workspace/capture/activation ×3 → those parts ×3; SVB unchanged."""
    from kernel.model import step
    from kernel.model.types import Batch

    r = tiny_moe_mla()
    m = r.memory
    r3 = replace(r, memory=dataclasses.replace(
        m, comm_bytes=3 * m.comm_bytes, workspace_bytes=3 * m.workspace_bytes,
        capture_bytes=3 * m.capture_bytes, activation_buffers=3 * m.activation_buffers))
    a, b = memory.fixed_bytes(r), memory.fixed_bytes(r3)
    assert b.activation_peak == 3 * a.activation_peak
    assert b.cuda_graph == 3 * a.cuda_graph
    assert memory.pre_snapshot_bytes(r3) == 3 * memory.pre_snapshot_bytes(r)
    assert b.weights == a.weights
    assert memory.sequence_variable_bytes(r3, 4096) == memory.sequence_variable_bytes(r, 4096)
    batch = Batch([(1, 4095)] * 8, decode_threshold=8)
    assert step.step_time_into(r3, batch, {}) == step.step_time_into(r, batch, {})
