"""What resolution hands to pricing: one pool, fully resolved, in SI units.

The SQL views (``sql/``) do the resolving; :mod:`kernel.pool.build` reads their rows into these
frozen records (:func:`kernel.pool.rows.from_row`: a scalar field is read from the row column of
its name, or the one its ``column(...)`` metadata names); pricing (:mod:`kernel.model.step`, :mod:`kernel.model.memory`, :mod:`kernel.model.transfer`,
:mod:`kernel.bulk`) reads only these. Units: seconds for ``*_s``, integer nanoseconds for
``*_ns``, bytes/s for ``*_bps``, FLOP/s for ``peak_flops``, tokens/s for recurrent rates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.arrow_schema import column

if TYPE_CHECKING:
    from .caches import StatedCaches

# Collective ops and groups (model.md §9.4, §5.2).
ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL2ALL = "all2all"
GROUP_TP = "tp"
GROUP_EXPERT = "expert"
GROUP_DCP = "dcp"
GROUP_PCP = "pcp"

# Graph modes.
FULL = "FULL"
PIECEWISE = "PIECEWISE"
NONE = "NONE"


@dataclass(frozen=True)
class CollectiveKey:
    """One lifted (op, group) collective: its law coefficients and where it runs."""

    op: str
    group: str
    width: int  # the group's width
    ranks: int  # the snapped measured width whose coefficients price it
    floor_ns: int  # collective_floor_*, µs → ns by int(us*1000)
    peak_bps: float
    transition_bps: float
    crosses_nodes: bool
    span: float  # bytes multiplier when it crosses nodes (1.0 otherwise)
    # vLLM's all-reduce as measured (docs/decisions.md AC1): message bytes ascending and the
    # latency at each, in ns; empty where the NCCL law above prices it
    knot_bytes: tuple[float, ...] = ()
    knot_ns: tuple[int, ...] = ()


@dataclass(frozen=True)
class PlannedGemm:
    n: int
    k: int
    flops_per_token: float
    shard_n: bool


@dataclass(frozen=True)
class PlannedAttention:
    q_heads: int
    kv_heads: int
    head_dim: int
    kind: str
    window: int
    role: str
    compress_ratio: int

    @property
    def holds_kv(self) -> bool:
        return self.role == ""


@dataclass(frozen=True)
class PlannedCollective:
    op: str
    group: str
    bytes_per_token: float
    routed_by_top_k: bool


@dataclass(frozen=True)
class PlannedLayer:
    """One distinct layer kind (or the head), with everything pre-summed."""

    kind_id: str = field(metadata=column("layer_kind"))
    count: int
    dense_gemms: tuple[PlannedGemm, ...] = ()
    dense_flops_per_token: float = 0.0
    dense_weight_bytes: float = 0.0
    expert_flops_per_token_per_expert: float = 0.0
    expert_weight_bytes_per_expert: float = 0.0
    top_k: int = 0
    shared_expert_flops_per_token: float = 0.0
    shared_expert_weight_bytes: float = 0.0
    attn_q_heads: int = 0
    attn_kv_heads: int = 0
    attn_head_dim: int = 0
    attn_kind: str = ""
    attn_window: int = 0
    attn_index_top_k: int = 0
    attn_compress_ratio: int = 0
    attn_kv_lora_rank: int = 0
    attentions: tuple[PlannedAttention, ...] = ()
    elementwise_bytes_per_token: float = 0.0
    recurrent_kind: str = ""
    recurrent_state_bytes: float = 0.0
    collectives: tuple[PlannedCollective, ...] = ()
    kernels: int = 0


@dataclass(frozen=True)
class Plan:
    layers: tuple[PlannedLayer, ...]
    head: PlannedLayer
    total_layers: int
    total_kernels: int
    piecewise_segments: int


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    pcp: int
    dcp: int
    expert_width: int
    moe_group_width: int
    gpus_per_node: int
    gpus_per_rack: int
    nodes_spanned: int
    enable_expert_parallel: bool
    all2all_backend: str
    sequence_parallel_moe: bool
    custom_all_reduce: bool
    rack_is_one_domain: bool
    intra_node_bw_gbps: float
    inter_node_bw_gbps: float

    @property
    def moe_group(self) -> int:
        return max(self.moe_group_width, self.expert_width)

    @property
    def routed_all2all(self) -> bool:
        """Expert dispatch sends top-k copies (EP on and a real all-to-all backend)."""
        return self.enable_expert_parallel and self.all2all_backend not in (
            "", "naive", "allgather_reducescatter")


@dataclass(frozen=True)
class Coefficients:
    """Lifted coefficients (model.md §9.9), SI units."""

    hbm_bps: float
    peak_flops: float
    gemm_suffix: str
    eps_max: float
    m_half: float
    n_half: float
    k_half: float
    shape_aware: bool
    nvlink_bps: float
    nic_bps: float
    attention_floor_ns: int
    attention_rate_bps: float
    # kind -> (floor_ns, rate_bps); a kind is present only when its rate > 0.
    attention_by_kind: dict[str, tuple[int, float]]
    attention_prefill_floor_ns: int
    attention_prefill_scale: float
    # recurrent kind -> (floor_ns, rate tokens/s); present only when both > 0.
    recurrent: dict[str, tuple[int, float]]
    host_link_bps: float
    moe_imbalance: float
    host_admission_per_token_ns: int
    host_admission_per_request_ns: int
    host_output_token_ns: int
    host_completion_ns: int
    host_launch_eager_per_layer_ns: int
    host_launch_per_kernel_ns: int
    host_replay_graph_per_step_ns: int
    # per decode request of a full-attention layer priced by the part-wide pair (decision AC4);
    # 0 where the coefficient sets hold none (the reference)
    attention_per_request_ns: int = 0
    # 1 where the measured layer says vLLM's fused MoE splits each expert's FLOPs over tp (decision
    # MO1); 0 in the reference, which keeps routed FLOPs undivided by tp (model.md §4.2)
    moe_expert_tp_split: float = 0.0
    # vLLM's fused MoE layer as its operator rows measure it (decision MF1): a floor, the touched
    # weights at their own rate, routed FLOPs at their own fraction of the peak;
    # rate 0 (the reference) prices routed experts by the dense ramp and the derated HBM rate
    moe_fused_floor_ns: int = 0
    moe_fused_rate_bps: float = 0.0
    moe_fused_efficiency: float = 0.0


@dataclass(frozen=True)
class MemoryMagnitudes:
    """The memory coefficients as resolved (model.md §7.1), bytes."""

    comm_bytes: int  # nccl_communicator_bytes_<N>rank, 0 when no group is wider than 1
    workspace_bytes: int
    capture_bytes: int
    activation_buffers: float
    activation_floor: float
    activation_width: int
    batched_tokens: int = field(metadata=column("max_num_batched_tokens"))
    # global weight dtype bytes (the embedding's width)
    checkpoint_weight_bytes: float = field(metadata=column("checkpoint_bytes"))
    vocab_size: int
    hidden_size: int


@dataclass(frozen=True)
class StorageTier:
    name: str
    read_bps: float
    write_bps: float
    latency_s: float


@dataclass(frozen=True)
class Origin:
    """One provenance row: a coefficient in scope or one of the kernel's assumptions."""

    name: str
    set: str
    method: str
    scope: str


@dataclass(frozen=True)
class Override:
    field: str
    requested: str
    resolved: str
    reason: str


@dataclass(frozen=True)
class ResolvedPool:
    """Everything pricing needs for one pool."""

    scenario: str
    pool_index: int = field(metadata=column("pool"))
    role: str
    chip_name: str = field(metadata=column("chip"))
    chip_sm_count: int
    chip_memory_gib: float
    chip_nvfp4_tflops: float
    model_name: str = field(metadata=column("model"))
    served_dtype: str
    layout: Layout
    coefficients: Coefficients
    collectives: dict[tuple[str, str], CollectiveKey]
    plan: Plan
    # Expert geometry (model.md §4.1).
    experts: int  # physical experts E (0 for dense)
    total_experts: int  # E + redundant
    experts_per_rank: int
    local_expert_share: float
    expert_tensor_shards: int
    eplb_redundant_experts: int = field(metadata=column("redundant"))
    # KV geometry.
    kv_bytes_per_token: float
    kv_layers: int
    dcp_shards_all_kv_layers: bool
    cache_bytes: float
    cache_layout: str  # the stated or resolved cache dtype (e.g. fp8_ds_mla)
    state_bytes: float
    # Engine resolution.
    block_size: int
    block_size_final: bool
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_spec_tokens: int
    uniform_decode_width: int
    decode_graph_mode: str
    other_graph_mode: str
    cudagraph_mode: str
    capture_tokens: int
    recurrent_cache_mode: str  # "" for models without recurrent layers
    dcp_comm_backend: str
    dcp_interleave: int
    mla_context_chunk: int
    async_scheduling: bool
    cascade_attention: bool
    memory: MemoryMagnitudes
    tiers: dict[str, StorageTier]
    provenance: tuple[Origin, ...]
    overrides: tuple[Override, ...]
    # Typed rows for notebooks and exports ("provenance", "resolved"; Arrow tables), not
    # read by pricing and left out of equality and hashing.
    tables: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    assumptions: tuple[Origin, ...] = field(default=())
    # The caches this pool states (windowed or hybrid graphs, kernel/model/caches.py); None keeps the
    # legacy per-token formulas.
    caches: StatedCaches | None = None
    # The chip's catalog HBM bandwidth, not derated (MBU's denominator); 0 = not from a catalog.
    chip_hbm_peak_bps: float = 0.0
