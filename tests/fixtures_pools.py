"""Hand-built ResolvedPool fixtures with round numbers, for hand-checked unit tests.

Every coefficient is chosen so the terms are easy to compute by hand (peak 1e15 FLOP/s,
HBM 1e12 B/s, floors in whole µs). ``make_pool(**overrides)`` starts from a tiny dense model;
``tiny_dense``, ``tiny_moe_mla`` (DCP 2), ``tiny_pcp`` (PCP 2, MLA) and ``tiny_hybrid``
(mamba2 + gqa, recurrent mode align) are the four shapes the tests use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernel.model.resolved import (
    ALL2ALL,
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    Coefficients,
    CollectiveKey,
    Layout,
    MemoryMagnitudes,
    Plan,
    PlannedAttention,
    PlannedCollective,
    PlannedGemm,
    PlannedLayer,
    ResolvedPool,
    StorageTier,
)

HIDDEN = 1024


def layout(**kw: Any) -> Layout:
    base: dict[str, Any] = dict(
        tp=1, pp=1, dp=1, pcp=1, dcp=1, expert_width=1, moe_group_width=1, gpus_per_node=8,
        gpus_per_rack=0, nodes_spanned=1, enable_expert_parallel=False, all2all_backend="",
        sequence_parallel_moe=False, custom_all_reduce=True, rack_is_one_domain=False,
        intra_node_bw_gbps=450.0, inter_node_bw_gbps=50.0)
    base.update(kw)
    return Layout(**base)


def coefficients(**kw: Any) -> Coefficients:
    base: dict[str, Any] = dict(
        hbm_bps=1e12, peak_flops=1e15, gemm_suffix="bf16", eps_max=0.8, m_half=100.0,
        n_half=0.0, k_half=0.0, shape_aware=False, nvlink_bps=450e9, nic_bps=50e9,
        attention_floor_ns=10_000, attention_rate_bps=1e12, attention_by_kind={},
        attention_prefill_floor_ns=20_000, attention_prefill_scale=0.5, recurrent={},
        host_link_bps=32e9, moe_imbalance=1.0, host_admission_per_token_ns=350,
        host_admission_per_request_ns=40_000_000, host_output_token_ns=1_000,
        host_completion_ns=2_000, host_launch_eager_per_layer_ns=30_000,
        host_launch_per_kernel_ns=1_000, host_replay_graph_per_step_ns=5_000)
    base.update(kw)
    return Coefficients(**base)


def ckey(op: str, group: str, width: int = 1, *, floor_ns: int = 10_000,
         peak: float = 100e9, trans: float = 50e9, crosses: bool = False,
         span: float = 1.0) -> CollectiveKey:
    return CollectiveKey(op=op, group=group, width=width, ranks=max(width, 2),
                         floor_ns=floor_ns, peak_bps=peak, transition_bps=trans,
                         crosses_nodes=crosses, span=span)


def memory(**kw: Any) -> MemoryMagnitudes:
    base: dict[str, Any] = dict(
        comm_bytes=0, workspace_bytes=536_870_912, capture_bytes=100_000_000,
        activation_buffers=10.0, activation_floor=1_000_000.0, activation_width=HIDDEN,
        batched_tokens=8192, checkpoint_weight_bytes=2.0, vocab_size=32_000,
        hidden_size=HIDDEN)
    base.update(kw)
    return MemoryMagnitudes(**base)


def dense_layer(**kw: Any) -> PlannedLayer:
    """One gqa layer: 8 q heads, 2 kv heads, head dim 128, all-reduce over TP."""
    base: dict[str, Any] = dict(
        kind_id="dense", count=4,
        dense_gemms=(PlannedGemm(n=1536, k=1024, flops_per_token=2 * 1536 * 1024, shard_n=True),
                     PlannedGemm(n=1024, k=1024, flops_per_token=2 * 1024 * 1024, shard_n=False)),
        dense_flops_per_token=2 * 1536 * 1024 + 2 * 1024 * 1024,
        dense_weight_bytes=(1536 * 1024 + 1024 * 1024) * 2.0,
        attn_q_heads=8, attn_kv_heads=2, attn_head_dim=128, attn_kind="gqa",
        attentions=(PlannedAttention(8, 2, 128, "gqa", 0, "", 0),),
        elementwise_bytes_per_token=4096.0,
        collectives=(PlannedCollective(ALL_REDUCE, "tp", HIDDEN * 2.0, False),),
        kernels=6)
    base.update(kw)
    return PlannedLayer(**base)


def head_layer(**kw: Any) -> PlannedLayer:
    base: dict[str, Any] = dict(kind_id="head", count=1, dense_flops_per_token=2 * 32000 * 1024,
                                dense_weight_bytes=32000 * 1024 * 2.0, kernels=2)
    base.update(kw)
    return PlannedLayer(**base)


def tiers() -> dict[str, StorageTier]:
    return {"cpu": StorageTier("cpu", read_bps=25e9, write_bps=20e9, latency_s=10e-6),
            "s3": StorageTier("s3", read_bps=1e9, write_bps=0.5e9, latency_s=0.02)}


def make_pool(*, layers: tuple[PlannedLayer, ...] | None = None,
              head: PlannedLayer | None = None, layout_kw: dict[str, Any] | None = None,
              coeff_kw: dict[str, Any] | None = None, collectives: dict[Any, Any] | None = None,
              memory_kw: dict[str, Any] | None = None, **kw: Any) -> ResolvedPool:
    layers = layers if layers is not None else (dense_layer(),)
    head = head if head is not None else head_layer()
    total_layers = sum(layer.count for layer in layers)
    plan = Plan(layers=layers, head=head, total_layers=total_layers,
                total_kernels=sum(layer.kernels * layer.count for layer in layers) + head.kernels,
                piecewise_segments=total_layers + 1)
    lay = layout(**(layout_kw or {}))
    if collectives is None:
        collectives = {
            (ALL_REDUCE, "tp"): ckey(ALL_REDUCE, "tp", lay.tp),
            (ALL_GATHER, "tp"): ckey(ALL_GATHER, "tp", lay.tp),
            (REDUCE_SCATTER, "tp"): ckey(REDUCE_SCATTER, "tp", lay.tp),
            (ALL2ALL, "expert"): ckey(ALL2ALL, "expert", lay.moe_group, floor_ns=7_000),
        }
    base: dict[str, Any] = dict(
        scenario="fixture", pool_index=0, role="colocated", chip_name="h100", chip_sm_count=132,
        chip_memory_gib=80.0, chip_nvfp4_tflops=0.0, model_name="tiny", served_dtype="bf16",
        layout=lay, coefficients=coefficients(**(coeff_kw or {})), collectives=collectives,
        plan=plan, experts=0, total_experts=0, experts_per_rank=0, local_expert_share=1.0,
        expert_tensor_shards=1, eplb_redundant_experts=0,
        kv_bytes_per_token=2 * 2 * 128 * 2.0 * total_layers, kv_layers=total_layers,
        dcp_shards_all_kv_layers=True, cache_bytes=2.0, cache_layout="auto", state_bytes=4.0,
        block_size=16, block_size_final=True, max_model_len=32768,
        max_num_batched_tokens=8192, max_num_seqs=256, num_spec_tokens=0,
        uniform_decode_width=1, decode_graph_mode="FULL", other_graph_mode="PIECEWISE",
        cudagraph_mode="FULL_AND_PIECEWISE", capture_tokens=512, recurrent_cache_mode="",
        dcp_comm_backend="ag_rs", dcp_interleave=1, mla_context_chunk=65536,
        async_scheduling=True, cascade_attention=False, memory=memory(**(memory_kw or {})),
        tiers=tiers(), provenance=(), overrides=())
    base.update(kw)
    return ResolvedPool(**base)


def tiny_dense(**kw: Any) -> ResolvedPool:
    """4 gqa layers, tp 1, bf16, no experts."""
    return make_pool(**kw)


def mla_layer(**kw: Any) -> PlannedLayer:
    base: dict[str, Any] = dict(
        kind_id="moe", count=6,
        dense_gemms=(PlannedGemm(n=2048, k=1024, flops_per_token=2 * 2048 * 1024, shard_n=True),),
        dense_flops_per_token=2 * 2048 * 1024, dense_weight_bytes=2048 * 1024 * 1.0,
        expert_flops_per_token_per_expert=2 * 3 * 512 * 1024,
        expert_weight_bytes_per_expert=3 * 512 * 1024 * 1.0, top_k=2,
        shared_expert_flops_per_token=2 * 3 * 512 * 1024,
        shared_expert_weight_bytes=3 * 512 * 1024 * 1.0,
        attn_q_heads=16, attn_kv_heads=1, attn_head_dim=576, attn_kind="mla",
        attn_kv_lora_rank=512, attentions=(PlannedAttention(16, 1, 576, "mla", 0, "", 0),),
        elementwise_bytes_per_token=4096.0,
        collectives=(PlannedCollective(ALL_REDUCE, "tp", HIDDEN * 2.0, False),),
        kernels=12)
    base.update(kw)
    return PlannedLayer(**base)


def tiny_moe_mla(dcp: int = 2, backend: str = "ag_rs", **kw: Any) -> ResolvedPool:
    """6 MLA+MoE layers (16 experts, top-2), tp 2, fp8 weights, MLA cache 576 B/token/layer,
    DCP ``dcp`` with backend ``backend``; measured `mla` decode kind."""
    lay = dict(tp=2, dcp=dcp, moe_group_width=1, expert_width=1)
    colls = {
        (ALL_REDUCE, "tp"): ckey(ALL_REDUCE, "tp", 2),
        (ALL_GATHER, "tp"): ckey(ALL_GATHER, "tp", 2),
        (REDUCE_SCATTER, "tp"): ckey(REDUCE_SCATTER, "tp", 2),
        (ALL2ALL, "expert"): ckey(ALL2ALL, "expert", 1, floor_ns=7_000),
    }
    if dcp > 1:
        colls[(ALL_GATHER, "dcp")] = ckey(ALL_GATHER, "dcp", dcp, floor_ns=8_000)
        if backend == "a2a":
            colls[(ALL2ALL, "dcp")] = ckey(ALL2ALL, "dcp", dcp, floor_ns=9_000)
        else:
            colls[(REDUCE_SCATTER, "dcp")] = ckey(REDUCE_SCATTER, "dcp", dcp, floor_ns=6_000)
    layers = (mla_layer(),)
    base: dict[str, Any] = dict(
        layers=layers, layout_kw=lay, collectives=colls, served_dtype="fp8",
        coeff_kw=dict(attention_by_kind={"mla": (12_000, 2e12)}, moe_imbalance=1.25),
        experts=16, total_experts=16, experts_per_rank=16, local_expert_share=1.0,
        expert_tensor_shards=2, kv_bytes_per_token=576 * 6.0, kv_layers=6, cache_bytes=1.0,
        dcp_comm_backend=backend, mla_context_chunk=4096,
        memory_kw=dict(comm_bytes=400_000_000))
    base.update(kw)
    return make_pool(**base)


def tiny_pcp(pcp: int = 2, **kw: Any) -> ResolvedPool:
    """The MLA+MoE model with prefill-context parallelism ``pcp`` (dcp 1), tp 2."""
    colls = {
        (ALL_REDUCE, "tp"): ckey(ALL_REDUCE, "tp", 2),
        (ALL_GATHER, "tp"): ckey(ALL_GATHER, "tp", 2),
        (REDUCE_SCATTER, "tp"): ckey(REDUCE_SCATTER, "tp", 2),
        (ALL2ALL, "expert"): ckey(ALL2ALL, "expert", 1, floor_ns=7_000),
        (ALL_GATHER, "pcp"): ckey(ALL_GATHER, "pcp", pcp, floor_ns=11_000, crosses=True,
                                  span=1.5),
    }
    return tiny_moe_mla(dcp=1, layout_kw=dict(tp=2, pcp=pcp), collectives=colls, **kw)


def mamba_layer(**kw: Any) -> PlannedLayer:
    base: dict[str, Any] = dict(
        kind_id="mamba", count=6, dense_flops_per_token=2 * 4096 * 1024,
        dense_weight_bytes=4096 * 1024 * 2.0, elementwise_bytes_per_token=4096.0,
        recurrent_kind="mamba2", recurrent_state_bytes=1_085_440.0, kernels=5)
    base.update(kw)
    return PlannedLayer(**base)


def tiny_hybrid(mode: str = "align", **kw: Any) -> ResolvedPool:
    """6 mamba2 layers + 2 gqa layers; only the 2 gqa layers hold KV (kv_layers = 2)."""
    layers = (mamba_layer(), dense_layer(count=2, kind_id="attn"))
    base: dict[str, Any] = dict(
        layers=layers, kv_bytes_per_token=2 * 2 * 128 * 2.0 * 2, kv_layers=2,
        recurrent_cache_mode=mode, coeff_kw=dict(recurrent={"mamba2": (15_000, 2e6)}))
    base.update(kw)
    return make_pool(**base)


def replace(r: ResolvedPool, **kw: Any) -> ResolvedPool:
    return dataclasses.replace(r, **kw)


def replace_coeffs(r: ResolvedPool, **kw: Any) -> ResolvedPool:
    return dataclasses.replace(r, coefficients=dataclasses.replace(r.coefficients, **kw))
