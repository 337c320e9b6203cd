"""Node builders shared by every family (model.md §13.3).

Key order inside each node is the reference builder's, because the emitted YAML keeps
insertion order: ``op, role, n, k`` for GEMM; ``op, kind, n_q, n_kv, d_h, …`` for Attention;
``op, role, n, k, experts, top_k, …`` for GroupedGEMM; ``op, role, emit`` for collectives.
"""

from __future__ import annotations

from typing import Any

from .config import (
    ATTENTION_WEIGHT_ROLES,
    DTYPES,
    EXPERT_DTYPES,
    Config,
    DeriveError,
    Node,
    act_bytes,
    base_dtype,
    quantized_classes,
    skips_attention,
)

TP = "tensor_parallel"
EP = "expert_parallel"
TP_UNLESS_SP_MOE = "tensor_parallel_unless_sp_moe"
DRAFT_KIND = "mtp_moe"  # a handler that prices its draft module itself declares this kind


def norm(role: str, bytes_per_token: int | None = None) -> Node:
    node: Node = {"op": "Elementwise", "role": role}
    if bytes_per_token is not None:
        node["bytes_per_token"] = int(bytes_per_token)
    return node


def gemm(role: str, n: int, k: int, weight_dtype: str | None = None) -> Node:
    node: Node = {"op": "GEMM", "role": role, "n": int(n), "k": int(k)}
    if weight_dtype:
        node["weight_dtype"] = weight_dtype
    return node


def collective(op: str, role: str, emit: str) -> Node:
    return {"op": op, "role": role, "emit": emit}


def chain(nodes: list[Node]) -> list[list[int]]:
    return [[i, i + 1] for i in range(len(nodes) - 1)]


def kind(kind_id: str, nodes: list[Node]) -> dict[str, Any]:
    return {"id": kind_id, "nodes": nodes, "edges": chain(nodes)}


def scorer(heads: int, dim: int) -> Node:
    """An indexer's context-wide scoring pass (role-bearing, so it holds no main KV)."""
    return {"op": "Attention", "role": "block_index_scores", "kind": "gqa", "n_q": int(heads),
            "n_kv": 1, "d_h": int(dim)}


def compress(sequence: list[str]) -> dict[str, Any]:
    """The split (prologue, pattern × repeat, epilogue) storing the fewest entries; ties go
    to the shortest period; the literal sequence as a prologue when nothing is shorter."""
    n = len(sequence)
    best: tuple[int, int, int, list[str], int, list[str]] | None = None
    for head in range(n):
        rest = sequence[head:]
        for period in range(1, len(rest) // 2 + 1):
            repeats = len(rest) // period
            body = rest[:period]
            if body * repeats != rest[:period * repeats]:
                continue
            tail = rest[period * repeats:]
            stored = head + period + len(tail)
            if best is None or (stored, period) < (best[0], best[1]):
                best = (stored, period, head, body, repeats, tail)
    if best is None or best[0] >= n:
        return {"prologue": list(sequence)}
    _, _, head, body, repeats, tail = best
    out: dict[str, Any] = {}
    if head:
        out["prologue"] = sequence[:head]
    out["pattern"] = body
    out["repeat"] = repeats
    if tail:
        out["epilogue"] = tail
    return out


def head_dim(c: Config) -> int:
    stated = c.pick("head_dim")
    if stated:
        return int(stated)
    hidden, heads = int(c.require("hidden_size")), int(c.require("num_q_heads"))
    if hidden % heads:
        raise DeriveError(f"{c.model}: hidden_size {hidden} is not divisible by {heads} heads "
                          f"and no head_dim is stated")
    return hidden // heads


def attention(c: Config, *, kind_: str | None = None, window: int | None = None,
              compress_ratio: int | None = None, index_topk: int | None = None,
              latent_width: int | None = None) -> Node:
    """The Attention node; its kind comes from the config's own evidence unless given."""
    nq = int(c.require("num_q_heads"))
    nkv = int(c.require("num_kv_heads"))
    lora = c.pick("kv_lora_rank")
    if kind_ is None:
        if lora:
            kind_ = "sparse_mla" if c.pick("index_topk") else "mla"
        else:
            kind_ = "swa" if window else "gqa"
    node: Node = {"op": "Attention", "kind": kind_, "n_q": nq}
    if latent_width is not None:
        if kind_ not in ("mla", "sparse_mla"):
            raise DeriveError(f"{c.model}: a latent width given for attention kind {kind_!r}")
        node.update(n_kv=1, d_h=int(latent_width),
                    qk_rope_head_dim=int(c.require("qk_rope_head_dim")))
        if window:
            node["window"] = int(window)
        if index_topk:
            node["index_topk"] = int(index_topk)
        if compress_ratio:
            node["compress_ratio"] = int(compress_ratio)
        if kind_ == "sparse_mla" and not (index_topk or compress_ratio):
            raise DeriveError(f"{c.model}: a sparse latent read bounded by neither a top-k "
                              f"nor a compressed stream")
        return node
    if kind_ in ("mla", "sparse_mla"):
        rope = int(c.pick("qk_rope_head_dim") or 0)
        if not rope and not c.get("mla_use_nope"):
            raise DeriveError(f"{c.model}: latent attention with no qk_rope_head_dim")
        node.update(n_kv=1, d_h=int(lora or 0) + rope, kv_lora_rank=int(lora or 0),
                    qk_rope_head_dim=rope)
        if kind_ == "sparse_mla":
            node["index_topk"] = int(c.pick("index_topk"))
        return node
    node.update(n_kv=nkv, d_h=head_dim(c))
    if kind_ == "swa":
        if not window:
            raise DeriveError(f"{c.model}: sliding-window attention with no window")
        node["window"] = int(window)
    return node


# MLA latent-stage layouts per architecture (vLLM's attention class, not family resemblance).
MLA_LAYOUTS: dict[str, dict[str, bool]] = {
    "DeepseekV2ForCausalLM": {},
    "DeepseekV3ForCausalLM": {},
    "GlmMoeDsaForCausalLM": {"fused_norm": True, "fused_index_norm": True},
    "DeepseekV32ForCausalLM": {"fused_norm": True, "fused_index_norm": True},
    "DeepseekV4ForCausalLM": {"fused_norm": True},
    "KimiK3ForConditionalGeneration": {"fused_norm": True},
    "KimiLinearForCausalLM": {"fused_norm": True},
    "Glm5NextForConditionalGeneration": {"fused_norm": True},
}
MLA_MODULE_UNQUANTIZED = frozenset({"Glm5NextForConditionalGeneration"})
HEAD_GATE_RECOMPUTED = frozenset({"Glm5NextForConditionalGeneration"})


def mla_layout(c: Config) -> dict[str, bool]:
    layout = {"fused_a": True, "fused_norm": False, "fused_index_norm": False}
    for arch in c.architectures():
        if arch in MLA_LAYOUTS:
            return {**layout, **MLA_LAYOUTS[arch]}
    return layout


def _arch_in(c: Config, names: frozenset[str]) -> bool:
    return any(a in names for a in c.architectures())


def attention_block(c: Config, hidden: int, *, kind_: str | None = None,
                    window: int | None = None, compress_ratio: int | None = None,
                    index_topk: int | None = None, latent_width: int | None = None,
                    indexed: bool = True) -> list[Node]:
    """input_norm, projections, attention, output projection, attn_out reduction."""
    nq = int(c.require("num_q_heads"))
    nkv = int(c.require("num_kv_heads"))
    attn = attention(c, kind_=kind_, window=window, compress_ratio=compress_ratio,
                     index_topk=index_topk, latent_width=latent_width)
    if latent_width is not None:
        qkv_out, o_in = (nq + 1) * int(latent_width), nq * int(latent_width)
    elif attn["kind"] in ("mla", "sparse_mla"):
        return _latent_block(c, hidden, attn, nq, indexed)
    else:
        qkv_out, o_in = (nq + 2 * nkv) * attn["d_h"], nq * attn["d_h"]
    return [norm("input_norm"), gemm("qkv_proj", qkv_out, hidden), attn,
            gemm("o_proj", hidden, o_in), collective("AllReduce", "attn_out", TP)]


def _latent_block(c: Config, hidden: int, attn: Node, nq: int, indexed: bool) -> list[Node]:
    nope = int(c.pick("qk_nope_head_dim") or 0)
    rope = int(c.pick("qk_rope_head_dim") or 0)
    v = int(c.pick("v_head_dim") or nope)
    kv_lora = int(c.pick("kv_lora_rank") or 0)
    q_lora = int(c.get("q_lora_rank") or 0)
    if nope + rope == 0 or v == 0:
        raise DeriveError(f"{c.model}: latent attention with no head widths")
    if kv_lora == 0:
        raise DeriveError(f"{c.model}: latent attention with no kv_lora_rank")
    act = act_bytes(c)
    attn_width = base_dtype(c) if skips_attention(c) else None

    def staged(node: Node) -> Node:
        if attn_width and node.get("role") in ATTENTION_WEIGHT_ROLES:
            return {**node, "weight_dtype": attn_width}
        return node

    layout = mla_layout(c)
    gate = c.get("mla_use_output_gate")
    stages: list[Node] = []
    if q_lora:
        gate_rows = nq * v if gate else 0
        if layout["fused_a"]:
            stages.append(gemm("qkv_a_proj", q_lora + kv_lora + rope + gate_rows, hidden))
        else:  # pragma: no cover - no architecture splits the A-projections
            stages += [gemm("q_a_proj", q_lora, hidden), gemm("kv_a_proj", kv_lora + rope, hidden)]
        if layout["fused_norm"]:
            width = q_lora + kv_lora
            if layout["fused_index_norm"] and indexed:
                width += int(c.key("index_head_dim"))
            stages.append(norm("qkv_a_layernorm", 2 * width * act))
        else:
            stages += [norm("q_a_layernorm", 2 * q_lora * act),
                       norm("kv_a_layernorm", 2 * kv_lora * act)]
        stages.append(gemm("q_b_proj", nq * (nope + rope), q_lora))
    else:
        stages += [gemm("kv_a_proj", kv_lora + rope, hidden),
                   norm("kv_a_layernorm", 2 * kv_lora * act),
                   gemm("q_proj", nq * (nope + rope), hidden)]
    stages.append(gemm("kv_b_proj", nq * (nope + v), kv_lora))
    post = [norm("mla_output_gate", 3 * nq * v * act)] if q_lora and gate else []
    return [norm("input_norm"), *[staged(n) for n in stages], attn, *post,
            staged(gemm("o_proj", hidden, nq * v)), collective("AllReduce", "attn_out", TP)]


def dense_mlp(c: Config, hidden: int, ffn: int | None = None) -> list[Node]:
    width = int(ffn if ffn is not None else c.require("ffn_size"))
    return [gemm("mlp_gate_up", 2 * width, hidden), gemm("mlp_down", hidden, width)]


def experts_node(c: Config, hidden: int) -> Node:
    inner = int(c.pick("moe_ffn_size") or c.require("ffn_size"))
    node: Node = {"op": "GroupedGEMM", "role": "experts", "n": inner, "k": hidden,
                  "experts": int(c.require("num_experts")), "top_k": int(c.require("top_k"))}
    shared = c.pick("num_shared_experts")
    shared_inner = c.pick("shared_ffn_size")
    if shared is None and shared_inner:
        shared = 1  # a stated shared width with no count is one shared expert (Qwen3.5)
    if shared:
        node["shared_experts"] = int(shared)
        if shared_inner and int(shared_inner) != inner:
            node["shared_intermediate_size"] = int(shared_inner)
    q = c.inner_quant()
    fmt = str(q.get("quant_method", "")).lower()
    if fmt in ("mxfp4", "nvfp4") and q.get("modules_to_not_convert"):
        node["weight_dtype"] = fmt
    routed = quantized_classes(c).get("routed_experts")
    if routed:
        node["weight_dtype"] = routed
    expert_dtype = c.get("expert_dtype")
    if expert_dtype is not None:
        mapped = EXPERT_DTYPES.get(str(expert_dtype))
        if mapped is None:
            raise DeriveError(f"{c.model}: expert_dtype {expert_dtype!r} is not one of "
                              f"{sorted(EXPERT_DTYPES)}")
        if mapped != DTYPES.get(str(c.pick("dtype") or "").lower()):
            node["weight_dtype"] = mapped
    latent = c.pick("moe_latent_size")
    if latent:
        node["latent_size"] = int(latent)
    return node


def moe_block(c: Config, hidden: int) -> list[Node]:
    """Routed experts, a separately-stored shared expert, and latent projections."""
    node = experts_node(c, hidden)
    nodes = [node]
    shared_width = quantized_classes(c).get("shared_experts")
    if shared_width and shared_width != node.get("weight_dtype") and node.get("shared_experts"):
        shared: Node = {"op": "GroupedGEMM", "role": "shared_experts",
                        "n": int(node.get("shared_intermediate_size") or node["n"]),
                        "k": node["k"], "experts": int(node["shared_experts"]),
                        "top_k": int(node["shared_experts"]), "weight_dtype": shared_width}
        if node.get("latent_size"):
            shared["latent_size"] = node["latent_size"]
        node.pop("shared_experts", None)
        node.pop("shared_intermediate_size", None)
        nodes.append(shared)
    latent = node.get("latent_size")
    if not latent:
        return nodes
    return [gemm("routed_expert_down_proj", latent, hidden), *nodes,
            gemm("routed_expert_up_proj", hidden, latent)]


def moe_tail(c: Config, hidden: int, first: str = "post_attn_norm") -> list[Node]:
    return [norm(first), *moe_block(c, hidden), collective("All2All", "moe_dispatch_combine", EP),
            collective("AllReduce", "mlp_out", TP_UNLESS_SP_MOE)]


def dense_tail(c: Config, hidden: int, ffn: int | None = None,
               first: str = "post_attn_norm") -> list[Node]:
    return [norm(first), *dense_mlp(c, hidden, ffn),
            collective("AllReduce", "mlp_out", TP_UNLESS_SP_MOE)]


def indexed_layers(c: Config, layers: int) -> list[bool] | None:
    """Which layers build a DSA indexer (vLLM's skip_topk rule), or None with no indexer."""
    if not (c.pick("index_topk") and c.get("index_n_heads") is not None):
        return None
    pattern = c.get("index_topk_pattern")
    if pattern is not None:
        if len(pattern) < layers:
            raise DeriveError(f"{c.model}: index_topk_pattern has {len(pattern)} entries for "
                              f"{layers} layers")
        unknown = set(pattern[:layers]) - {"S", "I"}
        if unknown:
            raise DeriveError(f"{c.model}: index_topk_pattern names {sorted(unknown)}; "
                              f"allowed: 'S' (skip), 'I' (index)")
        return [pattern[i] != "S" for i in range(layers)]
    freq = int(c.get("index_topk_freq") or 1)
    offset = c.get("index_skip_topk_offset")
    offset = 2 if offset is None else int(offset)
    if freq < 1:
        raise DeriveError(f"{c.model}: index_topk_freq is {freq}; it must be at least 1")
    return [max(i - offset + 1, 0) % freq == 0 for i in range(layers)]


def lightning_indexer(c: Config, hidden: int, nodes: list[Node]) -> list[Node]:
    """Splice the DSA indexer's projections and scorer in front of the attention node."""
    heads = int(c.key("index_n_heads"))
    dim = int(c.key("index_head_dim"))
    kpool = int(c.get("index_kpool") or 0)
    q_lora = int(c.get("q_lora_rank") or 0)
    if not q_lora:
        raise DeriveError(f"{c.model}: a lightning indexer projects its query from "
                          f"q_lora_rank, which the config does not state")
    at = next(i for i, n in enumerate(nodes) if n.get("op") == "Attention")
    base = base_dtype(c)
    unquantized_module = _arch_in(c, MLA_MODULE_UNQUANTIZED)
    proj = [gemm("index_wq_b", heads * dim, q_lora, base if unquantized_module else None),
            gemm("index_wk_weights_proj", dim + heads, hidden, base)]
    if _arch_in(c, HEAD_GATE_RECOMPUTED):
        proj.append(gemm("index_head_gate_proj", heads, hidden, "fp32"))
    act = act_bytes(c)
    if kpool > 1:
        proj.append(gemm("index_kpool_compress_gate", dim, hidden, base))
        per_pool = (2 * kpool * dim * act + 2 * kpool * dim * 4 + kpool * dim * act + dim + 4)
        proj.append(norm("index_kpool_compress", per_pool // kpool))
    if not mla_layout(c)["fused_index_norm"]:
        proj.append(norm("index_k_norm", 2 * dim * act))
    score = scorer(heads, dim)
    if kpool > 1:
        score["kind"] = "sparse_mla"
        score["compress_ratio"] = kpool
    return nodes[:at] + proj + [score] + nodes[at:]
