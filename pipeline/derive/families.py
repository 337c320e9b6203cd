"""Handlers for the attention-plus-MLP families (model.md §13.3–§13.4).

A handler returns ``(layer_kinds, stack)``. Uniform models get one kind and a repeat; per-layer
vectors are expanded and compressed.
"""

from __future__ import annotations

from typing import Any

from .config import Config, DeriveError, Node
from .nodes import (
    DRAFT_KIND,
    TP,
    attention,
    attention_block,
    collective,
    compress,
    dense_tail,
    gemm,
    head_dim,
    indexed_layers,
    kind,
    lightning_indexer,
    moe_block,
    moe_tail,
    norm,
    scorer,
)

Result = tuple[list[dict[str, Any]], dict[str, Any]]


def _window(c: Config) -> int | None:
    window = c.pick("sliding_window")
    if window and c.get("use_sliding_window") is False:
        return None  # a declared window that is switched off (Qwen2.5, MiMo)
    return int(window) if window else None


def handler_dense(c: Config) -> Result:
    """Llama, Mistral, Qwen2/3 (and the Qwen3-VL text decoder): GQA and a dense MLP."""
    hidden = int(c.require("hidden_size"))
    nodes = attention_block(c, hidden, window=_window(c)) + dense_tail(c, hidden)
    return [kind("dense", nodes)], {"pattern": ["dense"], "repeat": int(c.require("num_layers"))}


def handler_moe(c: Config) -> Result:
    """Attention plus routed experts: Mixtral, Qwen3-MoE, DeepSeek-V2/V3(.2), GLM DSA, gpt-oss,
    Kimi-K2.x; dense prologues, per-layer window vectors and partial indexers expanded."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    window = _window(c)
    index_map = indexed_layers(c, layers)
    indexed_any = index_map is not None and any(index_map)
    split = indexed_any and not all(index_map or [])

    def attn(win: int | None, index: bool | None) -> list[Node]:
        use = indexed_any if index is None else index
        nodes = attention_block(c, hidden, window=win, indexed=use)
        return lightning_indexer(c, hidden, nodes) if use else nodes

    def sparse(win: int | None = None, index: bool | None = None) -> list[Node]:
        return attn(win, index) + moe_tail(c, hidden)

    def dense(win: int | None = None, index: bool | None = None) -> list[Node]:
        return attn(win, index) + dense_tail(c, hidden)

    def suffix(index: bool) -> str:
        return ("_indexed" if index else "_noindex") if split else ""

    def declare_draft(kinds: list[dict[str, Any]]) -> None:
        # vLLM builds the MTP layer's indexer whatever the skip rule says.
        if split and int(c.pick("num_spec_tokens") or 0):
            kinds.append(kind(DRAFT_KIND, sparse(window, True)))

    types = c.get("layer_types")
    if types and window:
        _check_vector(c, "layer_types", types, layers, {"sliding_attention", "full_attention"})
        if split:
            raise DeriveError(f"{c.model}: a per-layer attention vector and a partial indexer "
                              f"pattern together are not supported")
        kinds: list[dict[str, Any]] = [kind("swa_moe", sparse(window)),
                                       kind("full_moe", sparse(None))]
        return kinds, compress(["swa_moe" if t == "sliding_attention" else "full_moe"
                                for t in types])
    local = c.get("local_layer_ids")
    if local and window:
        if split:
            raise DeriveError(f"{c.model}: a local-layer list and a partial indexer pattern "
                              f"together are not supported")
        ids = {int(i) for i in local}
        kinds = [kind("swa_moe", sparse(window)), kind("full_moe", sparse(None))]
        return kinds, compress(["swa_moe" if i in ids else "full_moe" for i in range(layers)])
    mlp_types = c.get("mlp_layer_types")
    if mlp_types:
        if len(mlp_types) != layers:
            raise DeriveError(f"{c.model}: mlp_layer_types has {len(mlp_types)} entries for "
                              f"{layers} layers")
        sequence = [("attn_moe" if t == "sparse" else "attn_dense")
                    + suffix(True if index_map is None else index_map[i])
                    for i, t in enumerate(mlp_types)]
        kinds = []
        for base, build in (("attn_dense", dense), ("attn_moe", sparse)):
            for idx in (True, False):
                kid = base + suffix(idx)
                if kid in sequence and kid not in {k["id"] for k in kinds}:
                    kinds.append(kind(kid, build(window, idx)))
        declare_draft(kinds)
        return kinds, compress(sequence)
    first_dense = int(c.get("first_k_dense_replace") or 0)
    if split and index_map is not None:
        sequence = [("attn_dense" if i < first_dense else "attn_moe") + suffix(index_map[i])
                    for i in range(layers)]
        kinds = []
        for kid in dict.fromkeys(sequence):
            build = dense if kid.startswith("attn_dense") else sparse
            kinds.append(kind(kid, build(window, kid.endswith("_indexed"))))
        declare_draft(kinds)
        return kinds, compress(sequence)
    kinds = [kind("attn_moe", sparse(window))]
    if first_dense:
        kinds.insert(0, kind("attn_dense", dense(window)))
        return kinds, {"prologue": ["attn_dense"] * first_dense, "pattern": ["attn_moe"],
                       "repeat": layers - first_dense}
    return kinds, {"pattern": ["attn_moe"], "repeat": layers}


def _check_vector(c: Config, name: str, vector: list[Any], layers: int,
                  allowed: set[str]) -> None:
    if len(vector) != layers:
        raise DeriveError(f"{c.model}: {name} has {len(vector)} entries for {layers} layers")
    unknown = set(vector) - allowed
    if unknown:
        raise DeriveError(f"{c.model}: {name} names {sorted(unknown)}; this handler prices "
                          f"{sorted(allowed)}")


def handler_minimax_m2(c: Config) -> Result:
    """MiniMax-M2: handler_moe, after checking the per-layer attention vector is uniform."""
    types = c.get("attn_type_list")
    if types:
        layers = int(c.require("num_layers"))
        if len(types) != layers:
            raise DeriveError(f"{c.model}: attn_type_list has {len(types)} entries for "
                              f"{layers} layers")
        if len(set(types)) != 1:
            raise DeriveError(f"{c.model}: attn_type_list mixes {sorted(set(types))}; only a "
                              f"uniform stack is supported")
    return handler_moe(c)


def handler_deepseek_v4(c: Config) -> Result:
    """DeepSeek-V4: compressed sparse latent attention at ratios 4 and 128, an indexer on the
    ratio-4 layers, low-rank projections on both sides, routed experts, an uncompressed draft."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    ratios = c.get("compress_ratios")
    if not ratios:
        raise DeriveError(f"{c.model}: no compress_ratios vector")
    draft_ratio = None
    if len(ratios) == layers + 1:
        ratios, draft_ratio = ratios[:layers], 1  # the trailing MTP entry: vLLM uses ratio 1
    elif len(ratios) != layers:
        raise DeriveError(f"{c.model}: compress_ratios has {len(ratios)} entries for {layers} "
                          f"layers; expected {layers} or {layers + 1}")
    # A 0 entry on a target layer (DeepSeek-V4-Flash layers 0-1) builds no compressor in vLLM:
    # the layer reads its sliding window uncompressed, like the draft layer (decisions.md).
    ratios = [1 if r == 0 else r for r in ratios]
    unknown = sorted(set(ratios) - {1, 4, 128})
    if unknown:
        raise DeriveError(f"{c.model}: compress_ratios names {unknown}; vLLM's compressor "
                          f"accepts 4 and 128 (0 meaning uncompressed)")
    topk = int(c.key("index_topk"))
    index_heads, index_dim = int(c.key("index_n_heads")), int(c.key("index_head_dim"))
    rope, total = int(c.require("qk_rope_head_dim")), int(c.require("head_dim"))
    if total <= rope:
        raise DeriveError(f"{c.model}: head_dim {total} does not exceed qk_rope_head_dim {rope}")
    window = int(c.require("sliding_window"))
    q_lora, o_lora = int(c.key("q_lora_rank")), int(c.key("o_lora_rank"))
    o_groups, nq = int(c.key("o_groups")), int(c.require("num_q_heads"))
    if (nq * total) % o_groups:
        raise DeriveError(f"{c.model}: o_groups {o_groups} does not divide {nq * total}")

    def layer(ratio: int) -> list[Node]:
        selects = ratio == 4
        attn = attention(c, kind_="sparse_mla" if ratio > 1 else "mla", latent_width=total,
                         window=window, compress_ratio=ratio if ratio > 1 else None,
                         index_topk=topk if selects else None)
        nodes = [norm("input_norm"), gemm("fused_wqa_wkv", q_lora + total, hidden),
                 norm("q_norm"), gemm("wq_b", nq * total, q_lora)]
        if ratio > 1:
            nodes.append(gemm("compressor_fused_wkv_wgate", total + 1, hidden))
        if selects:
            nodes += [gemm("index_wq_proj", index_heads * index_dim, q_lora),
                      gemm("index_weights_proj", index_heads, hidden),
                      gemm("index_compressor_fused_wkv_wgate", index_dim + 1, hidden),
                      scorer(index_heads, index_dim)]
        nodes += [attn, gemm("wo_a", o_groups * o_lora, nq * total // o_groups),
                  gemm("wo_b", hidden, o_groups * o_lora), collective("AllReduce", "attn_out", TP)]
        return nodes + moe_tail(c, hidden)

    kinds = [kind(f"csa{r}_moe", layer(r)) for r in sorted(set(ratios))]
    if draft_ratio is not None:
        kinds.append(kind(DRAFT_KIND, layer(draft_ratio)))
    return kinds, compress([f"csa{r}_moe" for r in ratios])


def handler_minimax_m3(c: Config) -> Result:
    """MiniMax-M3: a dense prologue, then block-sparse attention (priced as a bounded window of
    top-k + local + init blocks) with its own index scorer, over routed experts."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    sparse = c.get("sparse_attention_config")
    if not sparse:
        raise DeriveError(f"{c.model}: no sparse_attention_config")
    if sparse.get("use_sparse_attention") is not True:
        raise DeriveError(f"{c.model}: sparse_attention_config.use_sparse_attention is "
                          f"{sparse.get('use_sparse_attention')!r}; only true is supported")
    attn_freq, moe_freq = sparse.get("sparse_attention_freq"), c.get("moe_layer_freq")
    if not attn_freq or not moe_freq:
        raise DeriveError(f"{c.model}: needs sparse_attention_freq and moe_layer_freq")
    for name, vec in (("sparse_attention_freq", attn_freq), ("moe_layer_freq", moe_freq)):
        if len(vec) != layers:
            raise DeriveError(f"{c.model}: {name} has {len(vec)} entries for {layers} layers")
    if list(attn_freq) != list(moe_freq):
        raise DeriveError(f"{c.model}: sparse_attention_freq and moe_layer_freq differ")
    if set(attn_freq) - {0, 1}:
        raise DeriveError(f"{c.model}: sparse_attention_freq names "
                          f"{sorted(set(attn_freq) - {0, 1})}; allowed 0 and 1")
    first = c.get("first_k_dense_replace")
    if first is not None and [0] * int(first) + [1] * (layers - int(first)) != list(attn_freq):
        raise DeriveError(f"{c.model}: first_k_dense_replace {first} disagrees with the "
                          f"per-layer vector")
    bound = (int(c.key("sparse_topk_blocks", sparse)) + int(sparse.get("sparse_local_block") or 0)
             + int(sparse.get("sparse_init_block") or 0)) * int(c.key("sparse_block_size", sparse))
    heads, dim = int(c.key("sparse_num_index_heads", sparse)), int(c.key("sparse_index_dim", sparse))
    dense_nodes = attention_block(c, hidden) + dense_tail(c, hidden,
                                                          int(c.key("dense_intermediate_size")))
    block = attention_block(c, hidden, kind_="swa", window=bound)
    at = next(i for i, n in enumerate(block) if n.get("op") == "Attention")
    sparse_nodes = (block[:at] + [gemm("index_qk_proj", heads * dim + dim, hidden),
                                  scorer(heads, dim)] + block[at:] + moe_tail(c, hidden))
    kinds = [kind("dense", dense_nodes), kind("sparse_attn_moe", sparse_nodes)]
    return kinds, compress(["sparse_attn_moe" if f else "dense" for f in attn_freq])


def handler_llama4(c: Config) -> Result:
    """Llama-4 (text decoder): routed experts on every ``interleave_moe_layer_step``-th layer
    (vLLM: ``(i + 1) % step == 0``), each with one shared expert at ``intermediate_size``; the
    other layers a dense MLP at ``intermediate_size_mlp``. Chunked local attention is still
    priced as full GQA (the reference's documented gap; decisions.md G8)."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    step = int(c.get("interleave_moe_layer_step") or 1)
    if step < 1:
        raise DeriveError(f"{c.model}: interleave_moe_layer_step is {step}; it must be >= 1")
    attn = attention_block(c, hidden)
    moe = [*attn, norm("post_attn_norm"), *moe_block(c, hidden),
           collective("All2All", "moe_dispatch_combine", "expert_parallel"),
           collective("AllReduce", "mlp_out", "tensor_parallel_unless_sp_moe")]
    experts = next(n for n in moe if n.get("role") == "experts")
    experts.setdefault("shared_experts", 1)  # Llama4MoE always builds a shared expert
    sequence = ["attn_moe" if (i + 1) % step == 0 else "attn_dense" for i in range(layers)]
    kinds = []
    if "attn_dense" in sequence:
        ffn = int(c.get("intermediate_size_mlp") or c.require("ffn_size"))
        kinds.append(kind("attn_dense", [*attn, *dense_tail(c, hidden, ffn)]))
    kinds.append(kind("attn_moe", moe))
    return kinds, compress(sequence)


def handler_step3p7(c: Config) -> Result:
    """Step-3.7-Flash (the Step3p5 family): sliding and full attention by ``layer_types``, a
    dense MLP on the first ``first_k_dense_replace`` layers and routed experts (with one shared
    expert at ``share_expert_dim``) after; the two vary independently."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    window = _window(c)
    types = c.get("layer_types")
    if not types or not window:
        raise DeriveError(f"{c.model}: needs layer_types and sliding_window")
    _check_vector(c, "layer_types", types, layers, {"sliding_attention", "full_attention"})
    first_dense = int(c.get("first_k_dense_replace") or 0)
    shared_width = c.get("share_expert_dim")

    def moe() -> list[Node]:
        tail = moe_tail(c, hidden)
        experts = next(n for n in tail if n.get("role") == "experts")
        if shared_width and int(shared_width) != experts["n"]:
            experts["shared_intermediate_size"] = int(shared_width)
        return tail

    sequence = [("swa" if t == "sliding_attention" else "full")
                + ("_dense" if i < first_dense else "_moe") for i, t in enumerate(types)]
    builders = {
        "swa_dense": lambda: attention_block(c, hidden, window=window) + dense_tail(c, hidden),
        "full_dense": lambda: attention_block(c, hidden) + dense_tail(c, hidden),
        "swa_moe": lambda: attention_block(c, hidden, window=window) + moe(),
        "full_moe": lambda: attention_block(c, hidden) + moe(),
    }
    return [kind(k, b()) for k, b in builders.items() if k in sequence], compress(sequence)


def _mimo_attention(c: Config, hidden: int, prefix: str, window: int | None) -> list[Node]:
    """MiMo-V2 attention: its own head counts per layer type and a value width below the
    key width (q/k at ``head_dim``, v at ``v_head_dim``)."""
    nq = int(c.key(f"{prefix}num_attention_heads"))
    nkv = int(c.key(f"{prefix}num_key_value_heads"))
    dk = int(c.key(f"{prefix}head_dim"))
    dv = int(c.key(f"{prefix}v_head_dim"))
    attn: Node = {"op": "Attention", "kind": "swa" if window else "gqa", "n_q": nq,
                  "n_kv": nkv, "d_h": dk}
    if window:
        attn["window"] = int(window)
    return [norm("input_norm"), gemm("qkv_proj", nq * dk + nkv * dk + nkv * dv, hidden), attn,
            gemm("o_proj", hidden, nq * dv), collective("AllReduce", "attn_out", "tensor_parallel")]


def handler_mimo_v2(c: Config) -> Result:
    """MiMo-V2-Flash: sliding-window layers where ``hybrid_layer_pattern`` is 1 (with the
    ``swa_*`` head geometry) and full attention where it is 0, a dense MLP where
    ``moe_layer_freq`` is 0 and routed experts where it is 1."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    pattern, moe_freq = c.get("hybrid_layer_pattern"), c.get("moe_layer_freq")
    for name, vec in (("hybrid_layer_pattern", pattern), ("moe_layer_freq", moe_freq)):
        if not isinstance(vec, list) or len(vec) != layers:
            raise DeriveError(f"{c.model}: {name} must list one 0/1 entry per layer ({layers})")
        if set(vec) - {0, 1}:
            raise DeriveError(f"{c.model}: {name} names {sorted(set(vec) - {0, 1})}; allowed 0, 1")
    window = int(c.require("sliding_window"))
    sequence = [("swa" if p else "full") + ("_moe" if m else "_dense")
                for p, m in zip(pattern, moe_freq, strict=True)]

    def attn(kid: str) -> list[Node]:
        return (_mimo_attention(c, hidden, "swa_", window) if kid.startswith("swa")
                else _mimo_attention(c, hidden, "", None))

    kinds = []
    for kid in ("full_dense", "swa_dense", "full_moe", "swa_moe"):
        if kid in sequence:
            tail = moe_tail(c, hidden) if kid.endswith("_moe") else dense_tail(c, hidden)
            kinds.append(kind(kid, attn(kid) + tail))
    return kinds, compress(sequence)


def _deci_ffn_width(ffn_mult: float, hidden: int) -> int:
    """Nemotron-NAS FFN width: int(2·ffn_mult·hidden/3) rounded up to a multiple of 256."""
    width = int(2 * ffn_mult * hidden / 3)
    return -(-width // 256) * 256


def handler_deci(c: Config) -> Result:
    """Nemotron-NAS (DeciLM): a per-layer ``block_configs`` list; each distinct (attention,
    FFN) pair is a layer kind. A no-op attention contributes no nodes (and holds no KV); the
    FFN width comes from ``ffn_mult``; KV heads are ``num_attention_heads // n_heads_in_group``."""
    hidden = int(c.require("hidden_size"))
    blocks = c.get("block_configs")
    if not isinstance(blocks, list) or not blocks:
        raise DeriveError(f"{c.model}: no block_configs list")
    stated = c.pick("num_layers")
    if stated is not None and int(stated) != len(blocks):
        raise DeriveError(f"{c.model}: num_hidden_layers {stated} disagrees with "
                          f"{len(blocks)} block_configs")
    nq, dh = int(c.require("num_q_heads")), head_dim(c)
    kinds: dict[str, list[Node]] = {}
    sequence = []
    for i, block in enumerate(blocks):
        attn, ffn = block.get("attention") or {}, block.get("ffn") or {}
        for part, spec in (("attention", attn), ("ffn", ffn)):
            if spec.get("replace_with_linear") or spec.get("sparsify") or \
                    (part == "attention" and spec.get("window_length")):
                raise DeriveError(f"{c.model}: block_configs[{i}].{part} uses a linear "
                                  f"replacement, sparsity or a window, which is not derived")
        nodes: list[Node] = []
        kid = ""
        if not attn.get("no_op"):
            group = int(c.key("n_heads_in_group", attn))
            kv = nq // group
            nodes += [norm("input_norm"), gemm("qkv_proj", (nq + 2 * kv) * dh, hidden),
                      {"op": "Attention", "kind": "gqa", "n_q": nq, "n_kv": kv, "d_h": dh},
                      gemm("o_proj", hidden, nq * dh),
                      collective("AllReduce", "attn_out", "tensor_parallel")]
            kid = f"attn_kv{kv}_"
        if not ffn.get("no_op"):
            width = _deci_ffn_width(float(c.key("ffn_mult", ffn)), hidden)
            nodes += dense_tail(c, hidden, width)
            kid += f"ffn{width}"
        if not nodes:
            raise DeriveError(f"{c.model}: block_configs[{i}] has neither attention nor FFN")
        kid = kid.rstrip("_")
        kinds.setdefault(kid, nodes)
        sequence.append(kid)
    return [kind(k, n) for k, n in kinds.items()], compress(sequence)
