"""Stated caches: window rings and hybrid groups as vLLM's allocator holds them (issue 15;
model.md §7.3–§7.5)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.model import caches, laws, memory
from kernel.model.resolved import Plan, PlannedAttention, PlannedLayer


def _attention(kind: str, window: int = 0, role: str = "") -> PlannedAttention:
    return PlannedAttention(q_heads=8, kv_heads=8, head_dim=64, kind=kind, window=window,
                            role=role, compress_ratio=0)


def _plan(full: int, windows: dict[int, int], state: int = 0, state_page: float = 0.0,
          scored_window: bool = False) -> Plan:
    layers = []
    if full:
        layers.append(PlannedLayer("full", full, attentions=(_attention("gqa"),)))
    for w, n in windows.items():
        att: tuple[PlannedAttention, ...] = (_attention("swa", w),)
        if scored_window:
            att = (_attention("gqa", role="block_index_scores"), *att)
        layers.append(PlannedLayer(f"swa{w}", n, attentions=att))
    if state:
        layers.append(PlannedLayer("mamba", state, recurrent_kind="mamba2",
                                   recurrent_state_bytes=state_page))
    head = PlannedLayer("__head__", 1)
    return Plan(tuple(layers), head, sum(x.count for x in layers), 0, 0)


# --- the seed's worked examples --------------------------------------------------------------

def test_sw_a_pool_block_rings_and_pages() -> None:
    # SW-A: 18 full + 18 sliding (w 128), n_kv 8, d_h 64, bf16: 2048 B/token/layer, B 16.
    c = caches.state_caches(_plan(18, {128: 18}), 36 * 2048, 36, 16, "")
    assert c is not None
    assert (c.block, c.page_bytes, c.group_size, c.pool_block_bytes) == (16, 32768, 18, 589_824)
    L = 131072
    assert caches.bounded_bytes(c, 1, 0, L) == 5_308_416  # SequenceFixedBytes, K = 0
    assert caches.bounded_bytes(c, 2, 1, L) == 5_898_240  # K = 1
    assert caches.bounded_bytes(c, 8192, 0, L) == 307_298_304  # admission, M = 8192
    assert caches.bounded_bytes(c, 2048, 0, L) == 80_805_888
    assert caches.variable_bytes(c, 1000, 1) == 37_158_912
    assert caches.variable_bytes(c, L, 1) == 4_831_838_208
    assert caches.bounded_bytes_at(c, 50, 1, 0, L) == 2_359_296
    assert caches.bounded_bytes_at(c, 0, 8192, 0, L) == 301_989_888


def test_hy_m_hybrid_block_padding_and_groups() -> None:
    # HY-M: 4 attention layers (4096 B/token) and 24 mamba2 layers of 1,085,440 B state.
    plan = _plan(4, {}, state=24, state_page=1_085_440)
    c = caches.state_caches(plan, 4 * 4096, 4, 16, "none")
    assert c is not None
    assert (c.block, c.page_bytes, c.group_size) == (272, 1_114_112, 4)
    assert [(t.kind, t.groups) for t in c.types] == [("full", 1), ("state", 6)]
    assert c.pool_block_bytes == 4_456_448
    assert caches.bounded_bytes(c, 1, 0, 131072) == 26_738_688  # none, K = 0
    assert dataclasses.replace(c, state_mode="align") is not None
    align = caches.state_caches(plan, 4 * 4096, 4, 16, "align")
    assert align is not None and caches.bounded_bytes(align, 1, 0, 131072) == 53_477_376
    assert caches.variable_bytes(c, 1000, 1) == 17_825_792
    assert caches.variable_bytes(c, 131072, 1) == 482 * 4_456_448


def test_legacy_graphs_state_nothing() -> None:
    assert caches.state_caches(_plan(32, {}), 32 * 4096, 32, 16, "") is None
    # a window the layer selects blocks from (an index scorer beside it) is not a ring
    assert caches.state_caches(_plan(3, {2176: 57}, scored_window=True), 60 * 512, 60, 16,
                               "") is None
    # mamba mode "all" needs the chunk-aligned block the graph does not carry: legacy
    assert caches.state_caches(_plan(4, {}, 24, 1e6), 4 * 4096, 4, 16, "all") is None


# --- gpt-oss-120b on 8 x H200 (tp 8, fp8 cache, B 16, L 32768, M 8192) --------------------

def test_gpt_oss_120b_figures_change_as_vllms_would() -> None:
    k = kernel.open("gpt-oss-120b-h200-fp4-vllm-tp8")
    r = k.resolved_pool
    legacy = dataclasses.replace(r, caches=None)
    # 36 layers: 18 sliding (w 128) + 18 full; 8 KV heads / tp 8 = 1 per rank, d_h 64, fp8:
    # 2·1·64·1 = 128 B per token per layer; page P = 16·128 = 2048 B; G = 18; PB = 36,864 B.
    c = r.caches
    assert c is not None
    assert [(t.kind, t.layers, t.groups, t.window) for t in c.types] == [
        ("full", 18, 1, 0), ("window", 18, 1, 128)]
    assert (c.block, c.page_bytes, c.group_size, c.pool_block_bytes) == (16, 2048, 18, 36_864)
    # The figure: legacy pages every layer as full KV, 36·128·131072 B.
    assert memory.sequence_variable_bytes(legacy, 131072) == 603_979_776
    # Stated: only the 18 full layers grow: cdiv(131072, 16) = 8192 pool blocks.
    assert k.sequence_variable_bytes(131072) == 8192 * 36_864 == 301_989_888
    # The ring at one decode token: cdiv(128 - 1 + 1, 16) + 1 = 9 pool blocks.
    assert k.sequence_fixed_bytes() == 9 * 36_864 == 331_776
    assert memory.sequence_fixed_bytes(legacy) == 0
    # Admission at M = 8192: cdiv(min(127 + 8192, 32768), 16) + 1 = 521 pool blocks.
    assert k.sequence_admission_bytes() == 521 * 36_864 == 19_206_144
    assert k.sequence_bounded_bytes(8192) == k.sequence_admission_bytes()
    assert k.sequence_bounded_bytes_at(50, 1) == 4 * 36_864  # before the window fills
    # Capacity: num_blocks = budget // PB; per request SVB(L) + admission = 2048 + 521 blocks.
    cap, old = k.kv_capacity(), memory.kv_capacity(legacy, k.fixed_bytes(), 0.9)
    assert cap.budget_bytes == old.budget_bytes
    assert cap.page_bytes == 36_864 and cap.num_blocks == cap.budget_bytes // 36_864
    assert cap.max_concurrency == cap.num_blocks / 2569
    assert cap.tokens == cap.num_blocks // 2 * 16  # two groups share the pool
    # Legacy: 73,728 B pages of 16 tokens of all 36 layers, 2048 per request.
    assert old.page_bytes == 73_728 and old.max_concurrency == old.num_blocks / 2048
    ratio = cap.max_concurrency / old.max_concurrency
    assert abs(ratio - 2 * 2048 / 2569) < 1e-4  # ≈ 1.59x the legacy concurrency


def test_hybrid_embedded_scenario_states_padded_groups() -> None:
    r = kernel.open("nemotron3-ultra-h100-agg").resolved_pool
    c = r.caches
    assert c is not None and c.state_mode == r.recurrent_cache_mode
    kinds = {t.kind: t for t in c.types}
    assert set(kinds) == {"full", "state"}
    per_token = r.kv_bytes_per_token / r.kv_layers
    assert c.page_bytes == int(c.block * per_token)
    state = max(x.recurrent_state_bytes for x in r.plan.layers) / r.layout.tp
    assert c.page_bytes >= state  # the state page is padded up to the attention page
    assert c.block % caches.KERNEL_BLOCK_ALIGNMENT == 0


def test_pure_attention_embedded_scenario_is_legacy() -> None:
    assert kernel.open("llama-3.1-8b-h100-tp1").resolved_pool.caches is None


# --- ring identities as properties -----------------------------------------------------------

configs = st.fixed_dictionaries({
    "full": st.integers(0, 40),
    "windows": st.dictionaries(st.sampled_from([64, 128, 512, 1024, 4096]),
                               st.integers(1, 40), max_size=2),
    "state": st.integers(0, 60),
    "state_page": st.integers(10_000, 3_000_000),
    "per_token": st.sampled_from([128, 256, 1152, 2048, 4096]),
    "block": st.sampled_from([1, 16, 32, 64]),
    "mode": st.sampled_from(["none", "align"]),
    "spec": st.integers(0, 3),
    "max_len": st.integers(1, 200_000),
    "budget": st.integers(1, 500_000),
})


def _caches(cfg: dict) -> caches.StatedCaches | None:
    kv_layers = cfg["full"] + sum(cfg["windows"].values())
    plan = _plan(cfg["full"], cfg["windows"], cfg["state"], float(cfg["state_page"]))
    return caches.state_caches(plan, kv_layers * cfg["per_token"], kv_layers, cfg["block"],
                               cfg["mode"] if cfg["state"] else "")


@settings(max_examples=300, deadline=None)
@given(cfg=configs, f=st.integers(-5, 20_000), c=st.integers(-5, 300_000))
def test_ring_identities(cfg: dict, f: int, c: int) -> None:
    sc = _caches(cfg)
    if sc is None:
        kv_layers = cfg["full"] + sum(cfg["windows"].values())
        assert (not cfg["windows"] and not cfg["state"]) or kv_layers == 0
        return
    k, L = cfg["spec"], cfg["max_len"]
    M = max(cfg["budget"], 1 + k)  # vLLM schedules at least one decode step's tokens
    fixed = caches.bounded_bytes(sc, 1 + k, k, L)
    admission = caches.bounded_bytes(sc, M, k, L)
    pb = sc.pool_block_bytes
    # the state part is the same at every in-flight count; rings grow from fixed to admission
    assert fixed <= admission
    state_only = caches.bounded_bytes_at(sc, 0, 0, k, L)
    assert state_only == pb * sum(t.groups for t in sc.types if t.kind == "state") * \
        caches.state_pages(sc.state_mode, k)
    # non-decreasing in in-flight tokens; negative in-flight clamps to 0
    assert caches.bounded_bytes(sc, f, k, L) <= caches.bounded_bytes(sc, f + 1, k, L)
    assert caches.bounded_bytes(sc, min(f, 0), k, L) == caches.bounded_bytes(sc, 0, k, L)
    # a ring holds what it has seen, never more than its bound
    at = caches.bounded_bytes_at(sc, c, f, k, L)
    assert at <= caches.bounded_bytes(sc, f, k, L)
    ff = max(f, 0)
    if max(c, 0) >= max(sc.types, key=lambda t: t.window).window - 1 + sc.block and \
            max(c, 0) + ff <= L:
        assert at == caches.bounded_bytes(sc, f, k, L)  # past the window
    # whole pool blocks everywhere
    for value in (fixed, admission, at, caches.variable_bytes(sc, c, 1)):
        assert value % pb == 0
    # grouping: every layer of a type has a slot, and no group is wholly padding
    for t in sc.types:
        assert t.groups * sc.group_size >= t.layers > (t.groups - 1) * sc.group_size
    # a state page fits in the (padded) shared page; rings never exceed cdiv(L,B)+1 pages
    if cfg["state"]:
        assert sc.page_bytes >= cfg["state_page"]
    for t in sc.types:
        if t.kind == "window":
            assert laws.ring_pages(t.window, sc.block, f, L) <= laws.cdiv(L, sc.block) + 1


@settings(max_examples=200, deadline=None)
@given(cfg=configs, tokens=st.integers(1, 300_000), shard=st.sampled_from([1, 2, 8]))
def test_variable_bytes_grow_only_with_full_caches(cfg: dict, tokens: int, shard: int) -> None:
    sc = _caches(cfg)
    if sc is None:
        return
    full_groups = sum(t.groups for t in sc.types if t.kind == "full")
    expected = sc.pool_block_bytes * full_groups * laws.cdiv(laws.cdiv(tokens, shard), sc.block)
    assert caches.variable_bytes(sc, tokens, shard) == expected
    assert caches.variable_bytes(sc, 0, shard) == 0


def test_pages_of_different_width_are_unified_with_longer_blocks() -> None:
    # 4 full layers of 4 KV heads and 12 sliding layers of 8 (MiMo-V2-like), bf16, d_h 64,
    # tp 1: 1024 and 2048 B/token. vLLM keeps the larger page P = 16·2048 and gives the
    # narrower layers a block of 32 tokens, so both pages are P.
    full = PlannedAttention(q_heads=64, kv_heads=4, head_dim=64, kind="gqa", window=0, role="",
                            compress_ratio=0)
    swa = PlannedAttention(q_heads=64, kv_heads=8, head_dim=64, kind="swa", window=128,
                           role="", compress_ratio=0)
    plan = Plan((PlannedLayer("full", 4, attentions=(full,)),
                 PlannedLayer("swa", 12, attentions=(swa,))), PlannedLayer("__head__", 1),
                16, 0, 0)
    c = caches.state_caches(plan, 4 * 1024 + 12 * 2048, 16, 16, "", tp=1, cache_bytes=2.0)
    assert c is not None
    assert c.page_bytes == 16 * 2048
    blocks = {t.kind: t.block for t in c.types}
    assert blocks == {"full": 32, "window": 16}
    assert c.group_size == 4 and [t.groups for t in c.types] == [1, 3]
    assert caches.variable_bytes(c, 33, 1) == 2 * c.pool_block_bytes  # cdiv(33, 32) = 2
