"""Hand-built ResolvedPools that switch on every per-request path of the walk (PCP, DCP,
sliding windows, sparse MLA selection, secondary attentions, MLA context gathers, experts,
recurrent layers), so bulk == scalar is tested even where no embedded scenario combines them.
They are variants of :func:`tests.fixtures_pools.make_pool`.
"""

from __future__ import annotations

from typing import Any

from kernel.model.resolved import (
    ALL2ALL,
    ALL_GATHER,
    ALL_REDUCE,
    GROUP_DCP,
    GROUP_EXPERT,
    GROUP_PCP,
    GROUP_TP,
    REDUCE_SCATTER,
    PlannedAttention,
    PlannedCollective,
    PlannedGemm,
    PlannedLayer,
    ResolvedPool,
)

from .fixtures_pools import ckey, make_pool


def pool(*, pcp: int = 1, dcp: int = 1, window: int = 0, sparse: bool = False,
         recurrent: bool = False, shape_aware: bool = False, prefill_scale: float = 0.6,
         dcp_backend: str = "", uniform_width: int = 1, capture: int = 512,
         interleave: int = 1, sm: int = 132, kind: str = "mla") -> ResolvedPool:
    tp = 8
    colls = {}
    for op, grp, w in ((ALL_REDUCE, GROUP_TP, tp), (ALL2ALL, GROUP_EXPERT, 8),
                       (ALL_GATHER, GROUP_TP, tp), (ALL_GATHER, GROUP_DCP, dcp),
                       (REDUCE_SCATTER, GROUP_DCP, dcp), (ALL_REDUCE, GROUP_DCP, dcp),
                       (ALL2ALL, GROUP_DCP, dcp), (ALL_GATHER, GROUP_PCP, pcp)):
        crosses = grp == GROUP_PCP
        colls[(op, grp)] = ckey(op, grp, w, floor_ns=9_000, peak=380e9, trans=120e9,
                                crosses=crosses, span=1.7 if crosses else 1.0)
    attn_kind = "sparse_mla" if sparse else kind
    attns: tuple[PlannedAttention, ...] = (PlannedAttention(128, 1, 576, attn_kind, window, "", 0),)
    if sparse:
        attns += (PlannedAttention(64, 1, 128, "indexer", 0, "indexer", 4),)
    layer = PlannedLayer(
        kind_id="moe", count=58,
        dense_gemms=(PlannedGemm(7168, 2048, 2.9e7, True), PlannedGemm(2048, 7168, 2.9e7, False)),
        dense_flops_per_token=1.9e8, dense_weight_bytes=1.1e9,
        expert_flops_per_token_per_expert=4.4e7, expert_weight_bytes_per_expert=4.4e7,
        top_k=8, shared_expert_flops_per_token=4.4e7, shared_expert_weight_bytes=4.4e7,
        attn_q_heads=128, attn_kv_heads=1, attn_head_dim=576, attn_kind=attn_kind,
        attn_window=window, attn_index_top_k=2048 if sparse else 0,
        attn_compress_ratio=4 if sparse else 0, attn_kv_lora_rank=512, attentions=attns,
        elementwise_bytes_per_token=57344.0,
        collectives=(PlannedCollective(ALL_REDUCE, GROUP_TP, 14336.0, False),
                     PlannedCollective(ALL2ALL, GROUP_EXPERT, 7168.0, True)),
        kernels=20)
    layers = [layer]
    if recurrent:
        layers.append(PlannedLayer(
            kind_id="linear", count=3, dense_flops_per_token=1.2e8, dense_weight_bytes=3e8,
            elementwise_bytes_per_token=30000.0, recurrent_kind="gdn",
            recurrent_state_bytes=1e6,
            collectives=(PlannedCollective(ALL_REDUCE, GROUP_TP, 14336.0, False),),
            kernels=9))
    if window and not sparse:  # a full-attention layer beside the windowed one
        layers.append(PlannedLayer(
            kind_id="full", count=3, dense_flops_per_token=1.9e8, dense_weight_bytes=1.1e9,
            attn_q_heads=64, attn_kv_heads=8, attn_head_dim=128, attn_kind="gqa",
            attentions=(PlannedAttention(64, 8, 128, "gqa", 0, "", 0),),
            elementwise_bytes_per_token=20000.0, kernels=12))
    head = PlannedLayer(kind_id="head", count=1, dense_flops_per_token=1.8e9,
                        dense_weight_bytes=9.3e8)
    return make_pool(
        layers=tuple(layers), head=head, collectives=colls,
        layout_kw=dict(tp=tp, pcp=pcp, dcp=dcp, expert_width=8, moe_group_width=8,
                       nodes_spanned=max(pcp, 1), enable_expert_parallel=True,
                       all2all_backend="deepep_low_latency", intra_node_bw_gbps=900.0,
                       inter_node_bw_gbps=400.0),
        coeff_kw=dict(
            hbm_bps=4.8e12, peak_flops=989e12, gemm_suffix="fp8", eps_max=0.71, m_half=96.0,
            n_half=512.0, k_half=256.0, shape_aware=shape_aware, attention_floor_ns=7_000,
            attention_rate_bps=3.1e12,
            attention_by_kind={"mla": (9_000, 2.7e12), "indexer": (3_000, 2.0e12)},
            attention_prefill_floor_ns=11_000, attention_prefill_scale=prefill_scale,
            recurrent={"gdn": (5_000, 2.5e7)}, host_link_bps=50e9, moe_imbalance=1.15,
            host_admission_per_token_ns=10, host_admission_per_request_ns=1000,
            host_output_token_ns=100, host_completion_ns=1000,
            host_launch_eager_per_layer_ns=45_000, host_launch_per_kernel_ns=3_100,
            host_replay_graph_per_step_ns=120_000),
        memory_kw=dict(workspace_bytes=0, capture_bytes=0, activation_buffers=0.0,
                       activation_floor=0.0, activation_width=0, checkpoint_weight_bytes=1.0,
                       vocab_size=129280, hidden_size=7168),
        scenario="synthetic", role="", chip_name="h200", chip_sm_count=sm,
        chip_memory_gib=141.0, model_name="synthetic", served_dtype="fp8", experts=256,
        total_experts=256, experts_per_rank=32, local_expert_share=0.125,
        kv_bytes_per_token=70272.0, kv_layers=61, cache_bytes=1.0, cache_layout="fp8",
        state_bytes=0.0, block_size=64, max_model_len=163840,
        uniform_decode_width=uniform_width, capture_tokens=capture,
        dcp_comm_backend=dcp_backend, dcp_interleave=interleave, mla_context_chunk=4096,
        tiers={})


VARIANTS: dict[str, dict[str, Any]] = {
    "plain-mla": {},
    "pcp2": {"pcp": 2},
    "pcp2-dcp4": {"pcp": 2, "dcp": 4, "interleave": 2},
    "dcp4-ctxgather": {"dcp": 4},
    "dcp2-a2a": {"dcp": 2, "dcp_backend": "a2a"},
    "sparse-dcp2": {"sparse": True, "dcp": 2},
    "window-gqa": {"window": 4096, "kind": "gqa", "shape_aware": True},
    "window-pcp2": {"window": 1024, "kind": "gqa", "pcp": 2},
    "recurrent": {"recurrent": True, "uniform_width": 2, "sm": 0},
    "no-prefill-scale": {"prefill_scale": 0.0, "kind": "gqa"},
}
