"""The document kinds the kernel reads, as frozen dataclasses (model.md §12.2–§12.5).

Each class is also the strict schema for its YAML form: a key the class does not declare is an
error. Absent keys take the zero value (0, "", False, empty); tri-state settings are
``bool | None`` so that "absent" and "false" stay different.

Each class is the schema of its database rows too (``pipeline.arrow_schema``): a field is a
column of the same name and type, in field order, unless its ``column(...)`` metadata says
otherwise. So adding a field here is the one edit a new setting needs: the decoder reads it,
the normalised table carries it. Field order is column order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arrow_schema import column
from .decode import key

_KIND = "the document kind, fixed per class"

# ---------------------------------------------------------------------------------------
# Scenario (model.md §12.2)


@dataclass(frozen=True)
class TraceServer:
    type: str = ""
    model: str = ""
    tensor_parallel: int = 0
    max_num_seqs: int = 0
    block_size: int = 0
    gpu_memory_utilization: float = 0.0
    max_model_len: int = 0


@dataclass(frozen=True)
class SLODimTargets:
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0


@dataclass(frozen=True)
class TraceHeader:
    trace_version: int = 0
    time_unit: str = ""
    mode: str = ""
    workload_seed: int | None = None
    server: TraceServer | None = None
    goodput_slo_targets: dict[str, SLODimTargets] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceRef:
    data: str = ""
    sha256: str = ""
    rows: int = 0
    header: TraceHeader = field(default_factory=TraceHeader)


@dataclass(frozen=True)
class Binding:
    shape: str = ""
    trace: TraceRef | None = field(
        default=None, metadata=column(skip="the bound trace file; bulk pricing reads it, "
                                      "resolution does not"))


@dataclass(frozen=True)
class Cluster:
    hardware: str = ""
    fabric: str = field(default="", metadata=column(null_if_empty=True))
    nodes: int = 0
    gpus_per_node: int = 0
    gpus_per_rack: int = 0
    storage: tuple[str, ...] = field(default=(), metadata=column(rows="scenario_storage",
                                                                   item="tier"))


@dataclass(frozen=True)
class Scenario:
    kind: str = field(default="", metadata=column(skip=_KIND))
    name: str = field(default="", metadata=column(
        skip="the key column scenario holds it (the name, else the file stem)"))
    model: str = field(default="", metadata=column("model_ref"))
    coefficients: tuple[str, ...] = field(default=(), metadata=column(
        rows="scenario_coefficient_sets", item="set"))
    cluster: Cluster = field(default_factory=Cluster)
    engine_version: str = ""
    workload: Binding | None = field(default=None, metadata=column(prefix="workload_"))


# ---------------------------------------------------------------------------------------
# Deployment (model.md §12.2)


@dataclass(frozen=True)
class Parallelism:
    tp: int = 0
    pp: int = 0
    dp: int = 0
    dp_local: int = 0
    pcp: int = 0
    dcp: int = 0
    enable_expert_parallel: bool = False

    def expert_parallel_width(self) -> int:
        """tp × pcp × dp with expert parallelism on (each < 1 read as 1), else 1."""
        if not self.enable_expert_parallel:
            return 1
        return max(self.tp, 1) * max(self.pcp, 1) * max(self.dp, 1)


@dataclass(frozen=True)
class DBO:
    enable_dbo: bool = field(default=False, metadata=column("dbo_enable", absent=None))
    dbo_decode_token_threshold: int = 0
    dbo_prefill_token_threshold: int = 0


@dataclass(frozen=True)
class EPLB:
    enable_eplb: bool = field(default=False, metadata=column("eplb_enable"))
    num_redundant_experts: int = 0
    window_size: int = 0
    step_interval: int = 0


@dataclass(frozen=True)
class Speculative:
    method: str = field(default="", metadata=column("speculative_method"))
    num_spec_tokens: int = 0


@dataclass(frozen=True)
class Engine:
    all2all_backend: str = ""
    disable_custom_all_reduce: bool | None = None
    allreduce_backend: str = ""
    dbo: DBO | None = None
    block_size: int = 0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0
    max_model_len: int = 0
    gpu_memory_utilization: float = 0.0
    scheduling_policy: str = ""
    async_scheduling: bool | None = None
    cudagraph_mode: str = ""
    # vLLM's capture-size knobs (model.md §9.6); not in the spec's engine table, see
    # docs/decisions.md D2.
    max_cudagraph_capture_size: int | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    quantization: str = ""
    cache_dtype: str = ""
    enable_prefix_caching: bool | None = None
    mamba_cache_dtype: str = ""
    mamba_ssm_cache_dtype: str = ""
    mamba_cache_mode: str = ""
    disable_cascade_attn: bool | None = None
    speculative: Speculative | None = None
    eplb: EPLB | None = field(default=None, metadata=column(prefix="eplb_"))
    dcp_comm_backend: str = ""
    dcp_q_replicate: bool | None = None
    cp_kv_cache_interleave_size: int = 0


@dataclass(frozen=True)
class Pool:
    role: str = ""
    nodes: int = 0
    parallel: Parallelism = field(default_factory=Parallelism)
    engine: Engine = field(default_factory=Engine)


@dataclass(frozen=True)
class Tier:
    tier: str = ""
    bytes: int = 0


@dataclass(frozen=True)
class Offload:
    connector: str = ""
    spec: str = ""
    eviction_policy: str = ""
    prefetch_depth: int = 0
    tiers: tuple[Tier, ...] = field(default=(), metadata=column(rows="offload_tiers"))


@dataclass(frozen=True)
class PDTransfer:
    connector: str = ""


@dataclass(frozen=True)
class Deployment:
    kind: str = field(default="", metadata=column(skip=_KIND))
    name: str = field(default="", metadata=column("deployment"))
    pools: tuple[Pool, ...] = field(default=(), metadata=column(rows="pools",
                                                                 count="pool_count"))
    pd_transfer: PDTransfer | None = field(default=None, metadata=column(prefix="pd_"))
    offload: Offload | None = field(default=None, metadata=column(prefix="offload_"))


# ---------------------------------------------------------------------------------------
# Model graph (model.md §12.3)

_DERIVATION = "where the graph was derived from: provenance, no view reads it"


@dataclass(frozen=True)
class Derivation:
    format: str = ""
    path: str = field(default="", metadata=column(skip=_DERIVATION))
    sha256: str = field(default="", metadata=column(skip=_DERIVATION))
    deriver_version: int = field(default=0, metadata=column(skip=_DERIVATION))


@dataclass(frozen=True)
class GlobalShape:
    hidden_size: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    weight_dtype: str = ""


@dataclass(frozen=True)
class Node:
    op: str = ""
    role: str = ""
    emit: str = ""
    n: int = 0
    k: int = 0
    weight_dtype: str = ""
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    shared_intermediate_size: int = 0
    latent_size: int = 0
    kind: str = ""
    n_q: int = 0
    n_kv: int = 0
    d_h: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    window: int = 0
    index_topk: int = 0
    compress_ratio: int = 0
    recurrent_kind: str = ""
    n_heads: int = 0
    state_size: int = 0
    n_groups: int = 0
    conv_kernel: int = 0
    intermediate_size: int = 0
    state_dtype: str = ""
    bytes_per_token: int = 0


@dataclass(frozen=True)
class LayerKind:
    id: str = field(default="", metadata=column(skip="the key column layer_kind holds it"))
    nodes: tuple[Node, ...] = field(default=(), metadata=column(rows="graph_nodes",
                                                                 count="node_count"))
    edges: tuple[tuple[int, ...], ...] = field(default=(), metadata=column(
        skip="dataflow edges; resolution reads the nodes in order"))


@dataclass(frozen=True)
class Stack:
    prologue: tuple[str, ...] = ()
    pattern: tuple[str, ...] = ()
    repeat: int = 0
    epilogue: tuple[str, ...] = ()

    def expand(self) -> list[str]:
        """Layer-kind ids in execution order: prologue, pattern × repeat, epilogue."""
        return [*self.prologue, *(list(self.pattern) * max(self.repeat, 0)), *self.epilogue]


@dataclass(frozen=True)
class Speculator:
    method: str = ""
    num_spec_tokens: int = 0
    stack: Stack = field(default_factory=Stack)


@dataclass(frozen=True)
class Graph:
    kind: str = field(default="", metadata=column(skip=_KIND))
    name: str = field(default="", metadata=column("model"))
    global_: GlobalShape = field(default_factory=GlobalShape, metadata=key("global"))
    modality: str = ""
    derived_from: Derivation = field(default_factory=Derivation,
                                     metadata=column(prefix="derived_"))
    layer_kinds: tuple[LayerKind, ...] = field(default=(), metadata=column(
        rows="graph_layer_kinds", count="layer_kind_count"))
    stack: Stack = field(default_factory=Stack, metadata=column(rows="graph_stack"))
    # The head's nodes are graph_nodes rows under the reserved layer kind __head__.
    head: tuple[Node, ...] = field(default=(), metadata=column(rows="graph_nodes"))
    speculator: Speculator | None = field(default=None, metadata=column(
        present="has_speculator"))


@dataclass(frozen=True)
class ModelSource:
    provider: str = ""
    repo: str = ""
    revision: str = ""
    retrieved: str = ""


@dataclass(frozen=True)
class ModelIdentity:
    name: str = ""
    source: ModelSource | None = None


# ---------------------------------------------------------------------------------------
# Hardware (model.md §12.4). Name = file stem / mapping key.


@dataclass(frozen=True)
class Chip:
    _allow_comments = True
    name: str = field(default="", metadata={"computed": True} | column("chip"))
    provenance: str = field(default="", metadata=key("Provenance"))
    tflops_peak: float = field(default=0.0, metadata=key("TFlopsPeak") | column("tflops_bf16"))
    tflops_fp8: float = field(default=0.0, metadata=key("TFlopsFP8"))
    tflops_nvfp4: float = field(default=0.0, metadata=key("TFlopsNVFP4"))
    bw_peak_tbs: float = field(default=0.0, metadata=key("BwPeakTBs"))
    memory_gib: float = field(default=0.0, metadata=key("MemoryGiB"))
    intra_node_bw_gbps: float = field(default=0.0, metadata=key("IntraNodeBwGBps"))
    sm_count: int = field(default=0, metadata=key("SMCount"))
    gpus_per_node: int = field(default=0, metadata=key("GPUsPerNode"))
    gpus_per_rack: int = field(default=0, metadata=key("GPUsPerRack"))
    intra_rack_bw_gbps: float = field(default=0.0, metadata=key("IntraRackBwGBps"))


@dataclass(frozen=True)
class Fabric:
    _allow_comments = True
    name: str = field(default="", metadata={"computed": True} | column("fabric"))
    provenance: str = field(default="", metadata=key("Provenance"))
    inter_node_bw_gbps: float = field(default=0.0, metadata=key("InterNodeBwGBps"))
    rdma: bool = field(default=False, metadata=key("RDMA"))


@dataclass(frozen=True)
class StorageDevice:
    _allow_comments = True
    _tolerate_name = True
    name: str = field(default="", metadata={"computed": True} | column("device"))
    read_bandwidth_mb_s: float = 0.0
    write_bandwidth_mb_s: float = 0.0
    base_latency_us: float = 0.0


# ---------------------------------------------------------------------------------------
# Coefficient set (model.md §12.5)


@dataclass(frozen=True)
class Scope:
    # Columns computed by a method, after the fields: (column suffix, method name).
    _derived_columns = (("text", "describe"),)
    hardware: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    tp: tuple[int, ...] = ()
    ep: tuple[int, ...] = ()
    nodes_spanned: tuple[int, ...] = ()

    def describe(self) -> str:
        """Canonical text: ``hardware=h100,h200;tp=2`` (sorted values), or ``unscoped``."""
        parts = []
        for label in ("hardware", "model", "tp", "ep", "nodes_spanned"):
            values = getattr(self, label)
            if values:
                parts.append(f"{label}=" + ",".join(str(v) for v in sorted(values)))
        return ";".join(parts) or "unscoped"


@dataclass(frozen=True)
class Source:
    kind: str = ""
    cite: str = ""
    role: str = ""


@dataclass(frozen=True)
class CoefficientEntry:
    _tolerate_name = True
    name: str = field(default="", metadata={"computed": True})
    value: float = 0.0
    units: str = ""
    method: str = ""
    fitted: bool = field(default=False, metadata={"required_present": True})
    scope: Scope = field(default_factory=Scope, metadata=column(prefix="scope_"))
    ci95: tuple[float, ...] | None = field(default=None, metadata={"length": 2}
                                           | column(split=("low", "high")))
    sources: tuple[Source, ...] | None = field(default=None, metadata={"nonempty": True}
                                               | column(as_json=True))
    rationale: str = ""
    copied_from: str = ""
    supersedes: str = ""
    validated: str | tuple[str, ...] | None = field(default=None, metadata=column(
        skip="what the entry was validated on: documentation, no view reads it"))
    unsupported: str | tuple[str, ...] | None = field(default=None, metadata=column(
        skip="what the entry does not cover: documentation, no view reads it"))


@dataclass(frozen=True)
class CoefficientSet:
    kind: str = field(default="", metadata=column(skip=_KIND))
    name: str = field(default="", metadata=column(skip="the key column set of its entries"))
    coefficients: tuple[CoefficientEntry, ...] = field(
        default=(), metadata={"single_key_map": True} | column(rows="coefficients")
    )
