"""Engine rules packs: the release facts the kernel reads (model.md §12.6).

Only the v0.29 pack is published upstream; every scenario names ``engine_version: "0.29.0"``.
The pack supplies three facts to resolution (custom all-reduce widths, sequence-parallel MoE,
accepted DCP backends) plus the accepted-value sets the rule checks use.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class RulesPack:
    version: str
    all2all_backends: frozenset[str]
    sp_moe_backends: frozenset[str]
    allreduce_backends: frozenset[str]
    cudagraph_modes: frozenset[str]
    cache_dtypes: frozenset[str]
    mamba_cache_modes: frozenset[str]
    scheduler_policies: frozenset[str]
    speculative_methods: frozenset[str]
    async_compatible_spec: frozenset[str]
    offload_specs: frozenset[str]
    dcp_comm_backends: tuple[str, ...]
    quantizations: frozenset[str]
    connectors: frozenset[str]
    eviction_policies: frozenset[str]
    custom_allreduce_world_sizes: frozenset[int]
    default_dbo_decode_threshold: int = 32
    default_dbo_prefill_threshold: int = 512
    triton_fetch_page_bytes: int = 28672
    triton_fetch_sms: int = 12

    def sequence_parallel_moe(self, backend: str, expert_parallel: bool, tp: int, dp: int) -> bool:
        """The engine makes the MoE input sequence-parallel (drops the TP all-reduce)."""
        return sequence_parallel_moe(backend, expert_parallel, tp, dp, self.sp_moe_backends)

    def custom_allreduce_supports_width(self, tp: int) -> bool:
        return custom_allreduce_supports_width(tp, self.custom_allreduce_world_sizes)


# The two rules over a pack's facts, as functions of those facts, so that SQL (which holds the
# pack as the ``rules`` table) calls the same definition through kernel/pool/sql_laws.py.
def sequence_parallel_moe(backend: str, expert_parallel: bool, tp: int, dp: int,
                          sp_moe_backends: Collection[str]) -> bool:
    """Whether the engine makes the MoE input sequence-parallel (drops the TP all-reduce)."""
    return expert_parallel and tp > 1 and dp > 1 and backend in sp_moe_backends


def custom_allreduce_supports_width(tp: int, world_sizes: Collection[int]) -> bool:
    """Whether custom all-reduce runs at ``tp`` ranks (else the engine falls back to NCCL)."""
    return tp in world_sizes


_SPEC_METHODS = frozenset({
    "deepseek_mtp", "dflash", "draft_model", "dspark", "eagle", "eagle3", "glm4_moe_mtp",
    "inkling_mtp", "kimi_k3_mtp", "medusa", "mlp_speculator", "mtp", "nemotron_h_mtp", "ngram",
    "ngram_gpu", "qwen3_next_mtp"})

V0_29 = RulesPack(
    version="0.29.0",
    all2all_backends=frozenset({
        "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
        "flashinfer_all2allv", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
        "mori_high_throughput", "mori_low_latency", "naive", "nixl_ep", "pplx"}),
    sp_moe_backends=frozenset({
        "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
        "flashinfer_nvlink_one_sided", "mori_high_throughput", "mori_low_latency", "nixl_ep"}),
    allreduce_backends=frozenset({"custom", "nccl"}),
    cudagraph_modes=frozenset({"FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "NONE",
                               "PIECEWISE"}),
    cache_dtypes=frozenset({
        "auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
        "fp8_per_token_head", "int4_per_token_head", "int8_per_token_head", "nvfp4",
        "nvfp4_4over6", "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc",
        "turboquant_k8v4"}),
    mamba_cache_modes=frozenset({"align", "all", "none"}),
    scheduler_policies=frozenset({"fcfs", "priority"}),
    speculative_methods=_SPEC_METHODS,
    async_compatible_spec=_SPEC_METHODS - {"medusa", "mlp_speculator", "ngram"},
    offload_specs=frozenset({"CPUOffloadingSpec", "TieringOffloadingSpec"}),
    dcp_comm_backends=("a2a", "ag_rs"),
    quantizations=frozenset({
        "auto_awq", "auto_gptq", "awq", "awq_marlin", "compressed-tensors", "deepseek_v4_fp8",
        "experts_int8", "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_channel",
        "fp8_per_tensor", "fp_quant", "gpt_oss_mxfp4", "gptq", "gptq_marlin", "humming", "inc",
        "int8_per_channel_weight_only", "modelopt", "modelopt_fp4", "modelopt_mixed",
        "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "nvfp4_per_token", "online", "quark",
        "torchao"}),
    connectors=frozenset({
        "DecodeBenchConnector", "ExampleConnector", "ExampleHiddenStatesConnector",
        "FlexKVConnectorV1", "HF3FSKVConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
        "MoRIIOConnector", "MooncakeConnector", "MooncakeStoreConnector", "MultiConnector",
        "NixlConnector", "NixlPullConnector", "NixlPushConnector", "OffloadingConnector",
        "SimpleCPUOffloadConnector"}),
    eviction_policies=frozenset({"arc", "lru"}),
    custom_allreduce_world_sizes=frozenset({2, 4, 6, 8, 16}),
)

PACKS: dict[str, RulesPack] = {V0_29.version: V0_29}


def lookup(version: str) -> RulesPack | None:
    """The pack published for an exact ``engine_version`` string, or None."""
    return PACKS.get(version)
