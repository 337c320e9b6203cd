"""Handlers for recurrent/attention hybrids: Qwen3.5 (GDN), NemotronH (Mamba2), Kimi-K3 and
GLM-5.3-Flash (KDA + latent attention)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import (
    ATTENTION_WEIGHT_ROLES,
    DTYPES,
    Config,
    DeriveError,
    Node,
    act_bytes,
    base_dtype,
    fp8_unquantized_roles,
    quantized_classes,
    skips_attention,
)
from .families import Result
from .nodes import (
    DRAFT_KIND,
    EP,
    TP,
    TP_UNLESS_SP_MOE,
    attention_block,
    collective,
    compress,
    dense_mlp,
    dense_tail,
    gemm,
    head_dim,
    kind,
    lightning_indexer,
    moe_block,
    moe_tail,
    norm,
)


def _state_dtype(c: Config, key: str) -> str:
    return DTYPES.get(str(c.get(key, "float32")).lower(), "fp32")


def handler_qwen3_5(c: Config) -> Result:
    """Qwen3.5/3.6 (MoE and dense): Gated DeltaNet on most layers, full attention where
    ``layer_types`` says (checked against ``full_attention_interval``)."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    types = c.get("layer_types")
    if not types:
        raise DeriveError(f"{c.model}: no layer_types vector")
    if len(types) != layers:
        raise DeriveError(f"{c.model}: layer_types has {len(types)} entries for {layers} layers")
    unknown = set(types) - {"linear_attention", "full_attention"}
    if unknown:
        raise DeriveError(f"{c.model}: layer_types names {sorted(unknown)}; allowed "
                          f"linear_attention, full_attention")
    interval = int(c.get("full_attention_interval") or 0)
    if interval and types != ["full_attention" if (i + 1) % interval == 0
                              else "linear_attention" for i in range(layers)]:
        raise DeriveError(f"{c.model}: layer_types disagrees with full_attention_interval "
                          f"{interval}")
    kh, vh = int(c.key("linear_num_key_heads")), int(c.key("linear_num_value_heads"))
    kd, vd = int(c.key("linear_key_head_dim")), int(c.key("linear_value_head_dim"))
    mixer = [norm("input_norm"),
             {"op": "RecurrentUpdate", "recurrent_kind": "gdn", "n_heads": vh, "state_size": kd,
              "conv_kernel": int(c.key("linear_conv_kernel_dim")),
              "intermediate_size": 2 * kh * kd + vh * vd,
              "state_dtype": _state_dtype(c, "mamba_ssm_dtype")},
             gemm("mixer_out", hidden, vh * vd), collective("AllReduce", "mixer_out", TP)]
    moe = c.pick("num_experts") is not None
    mlp_id = "moe" if moe else "dense"
    def tail() -> list[Node]:  # fresh nodes per kind: shared objects would dump as anchors
        return moe_tail(c, hidden) if moe else dense_tail(c, hidden)

    gdn_id, attn_id = f"gdn_{mlp_id}", f"attn_{mlp_id}"
    kinds = [kind(gdn_id, mixer + tail()), kind(attn_id, attention_block(c, hidden) + tail())]
    return kinds, compress([attn_id if t == "full_attention" else gdn_id for t in types])


def handler_nemotron_h(c: Config) -> Result:
    """NemotronH: a per-layer vector over mamba, MoE, attention and MLP blocks."""
    hidden = int(c.require("hidden_size"))
    vector = c.get("layers_block_type") or c.get("hybrid_override_pattern")
    if not vector:
        raise DeriveError(f"{c.model}: no layers_block_type or hybrid_override_pattern")
    if isinstance(vector, str):
        chars = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
        bad = sorted(set(vector) - set(chars))
        if bad:
            raise DeriveError(f"{c.model}: hybrid_override_pattern has unknown characters "
                              f"{bad}; allowed {sorted(chars)}")
        vector = [chars[ch] for ch in vector]
    stated = c.pick("num_layers")
    if stated is not None and int(stated) != len(vector):
        raise DeriveError(f"{c.model}: num_hidden_layers {stated} disagrees with a "
                          f"{len(vector)}-entry layer vector")
    heads, hdim = int(c.key("mamba_num_heads")), int(c.key("mamba_head_dim"))
    out = gemm("mixer_out", hidden, heads * hdim)
    recurrent_out = quantized_classes(c).get("recurrent_out")
    if recurrent_out:
        out["weight_dtype"] = recurrent_out
    mamba = [norm("input_norm"),
             {"op": "RecurrentUpdate", "recurrent_kind": "mamba2", "n_heads": heads,
              "state_size": int(c.key("ssm_state_size")),
              "n_groups": int(c.get("n_groups") or c.get("mamba_n_groups") or 1),
              "conv_kernel": int(c.key("conv_kernel")), "intermediate_size": heads * hdim,
              "state_dtype": _state_dtype(c, "mamba_ssm_cache_dtype")},
             out, collective("AllReduce", "mixer_out", TP)]
    catalogue: dict[str, Callable[[], list[Node]]] = {
        "mamba": lambda: mamba,
        "moe": lambda: [norm("input_norm"), *moe_block(c, hidden),
                        collective("All2All", "moe_dispatch_combine", EP),
                        collective("AllReduce", "mlp_out", TP_UNLESS_SP_MOE)],
        "attention": lambda: attention_block(c, hidden),
        "mlp": lambda: [norm("input_norm"), *dense_mlp(c, hidden),
                        collective("AllReduce", "mlp_out", TP_UNLESS_SP_MOE)],
    }
    bad = sorted(set(vector) - set(catalogue))
    if bad:
        raise DeriveError(f"{c.model}: unknown layer types {bad}; allowed {sorted(catalogue)}")
    used = list(dict.fromkeys(vector))
    return [kind(n, catalogue[n]()) for n in used], compress(list(vector))


def _kda_projections(c: Config, hidden: int, linear: dict[str, Any]) -> tuple[list[Node], Node]:
    heads = int(linear.get("num_heads") or c.require("num_q_heads"))
    dim = int(linear.get("head_dim") or head_dim(c))
    inner = heads * dim
    proj = [gemm("kda_q_proj", inner, hidden), gemm("kda_k_proj", inner, hidden),
            gemm("kda_v_proj", inner, hidden), gemm("kda_f_a_proj", dim, hidden),
            gemm("kda_f_b_proj", inner, dim), gemm("kda_b_proj", heads, hidden)]
    if linear.get("use_full_rank_gate"):
        proj.append(gemm("kda_g_proj", inner, hidden))
    else:
        proj += [gemm("kda_g_a_proj", dim, hidden), gemm("kda_g_b_proj", inner, dim)]
    recurrent: Node = {"op": "RecurrentUpdate", "recurrent_kind": "kda", "n_heads": heads,
                       "state_size": dim}
    return proj, recurrent


def handler_kimi_k3(c: Config) -> Result:
    """Kimi-K3: KDA on most layers, MLA on ``linear_attn_config.full_attn_layers`` (1-based
    unless it contains 0), dense MLP on the first ``first_k_dense_replace`` layers."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    linear = c.get("linear_attn_config") or {}
    full = linear.get("full_attn_layers")
    if not full:
        raise DeriveError(f"{c.model}: no linear_attn_config.full_attn_layers")
    proj, recurrent = _kda_projections(c, hidden, linear)
    conv = int(linear.get("short_conv_kernel_size") or 0)
    if conv:
        recurrent["conv_kernel"] = conv
    recurrent["state_dtype"] = "fp32"
    mixer = [norm("input_norm"), *proj, recurrent, gemm("kda_o_proj", hidden, proj[0]["n"]),
             collective("AllReduce", "mixer_out", TP)]
    if skips_attention(c):
        base = base_dtype(c)
        mixer = [{**n, "weight_dtype": base} if n.get("role") in ATTENTION_WEIGHT_ROLES else n
                 for n in mixer]
    kinds = [kind("kda_moe", mixer + moe_tail(c, hidden)),
             kind("mla_moe", attention_block(c, hidden) + moe_tail(c, hidden))]
    first_dense = int(c.get("first_k_dense_replace") or 0)
    if first_dense:
        kinds += [kind("kda_dense", mixer + dense_tail(c, hidden)),
                  kind("mla_dense", attention_block(c, hidden) + dense_tail(c, hidden))]
    full_set = {int(i) for i in full}
    offset = 0 if 0 in full_set else 1
    sequence = [("mla" if (i + offset) in full_set else "kda")
                + ("_dense" if i < first_dense else "_moe") for i in range(layers)]
    return [k for k in kinds if k["id"] in sequence], compress(sequence)


# GLM-5.3-Flash checkpoint module suffixes its fp8 quantisation leaves at the base width.
GLM5_NEXT_UNQUANTIZED = {
    "self_attn.q_proj": "kda_q_proj", "self_attn.k_proj": "kda_k_proj",
    "self_attn.v_proj": "kda_v_proj", "self_attn.f_a_proj": "kda_f_a_proj",
    "self_attn.f_b_proj": "kda_f_b_proj", "self_attn.b_proj": "kda_b_proj",
    "self_attn.g_a_proj": "kda_g_a_proj", "self_attn.g_b_proj": "kda_g_b_proj",
    "self_attn.o_proj": "kda_o_proj", "self_attn.kv_b_proj": "kv_b_proj",
    "eh_proj": "mtp_eh_proj",
}


def mhc_mixing_bytes(c: Config, hidden: int, hc_mult: int) -> int:
    """Per-token traffic of one fused mHC post+pre over ``hc_mult`` residual streams: bf16
    streams and layer input, fp32 post/comb mixes (vLLM's mhc reference kernel shapes)."""
    act = act_bytes(c)
    bundle = hc_mult * hidden * act
    mixes = hc_mult * 4 + hc_mult * hc_mult * 4
    post = hidden * act + bundle + mixes + bundle
    pre = bundle + mixes + hidden * act
    return post + pre


def handler_glm5_next(c: Config) -> Result:
    """GLM-5.3-Flash: KDA and sparse MLA by ``layer_types``, dense/MoE by ``mlp_layer_types``,
    manifold hyper-connections replacing both norms, and its own MTP draft layer."""
    hidden = int(c.require("hidden_size"))
    layers = int(c.require("num_layers"))
    mixer_types, mlp_types = c.get("layer_types"), c.get("mlp_layer_types")
    for name, vec in (("layer_types", mixer_types), ("mlp_layer_types", mlp_types)):
        if not vec:
            raise DeriveError(f"{c.model}: no {name} vector")
        if len(vec) != layers:
            raise DeriveError(f"{c.model}: {name} has {len(vec)} entries for {layers} layers")
    linear = c.get("linear_attn_config") or {}
    if not linear:
        raise DeriveError(f"{c.model}: no linear_attn_config")
    use_mhc = bool(c.get("mhc"))
    hc_mult = int(c.get("hc_mult") or 0)
    if use_mhc and hc_mult < 2:
        raise DeriveError(f"{c.model}: mhc is set but hc_mult is {hc_mult}; it needs >= 2")
    if use_mhc and int(c.get("hc_sinkhorn_iters") or 0) < 1:
        raise DeriveError(f"{c.model}: mhc is set but hc_sinkhorn_iters is not positive")
    mix = (2 + hc_mult) * hc_mult
    mix_bytes = mhc_mixing_bytes(c, hidden, hc_mult) if use_mhc else 0

    def mhc(nodes: list[Node]) -> list[Node]:
        if not use_mhc:
            return nodes
        out: list[Node] = []
        for n in nodes:
            side = {"input_norm": "attn", "post_attn_norm": "ffn"}.get(n.get("role", ""))
            if side:
                out += [gemm(f"hc_{side}_fn", mix, hc_mult * hidden, "fp32"),
                        norm(f"hc_{side}_mix", mix_bytes)]
            else:
                out.append(n)
        return out

    proj, recurrent = _kda_projections(c, hidden, linear)
    recurrent["state_dtype"] = "fp32"
    conv = int(linear.get("short_conv_kernel_size") or 0)
    if conv:
        recurrent["conv_kernel"] = conv
    kda_mixer = [norm("input_norm"), *proj, recurrent, gemm("kda_o_proj", hidden, proj[0]["n"]),
                 collective("AllReduce", "mixer_out", TP)]
    mla_mixer = lightning_indexer(c, hidden, attention_block(c, hidden))
    builders: dict[str, Callable[[], list[Node]]] = {
        "kda_moe": lambda: kda_mixer + moe_tail(c, hidden),
        "kda_dense": lambda: kda_mixer + dense_tail(c, hidden),
        "mla_moe": lambda: mla_mixer + moe_tail(c, hidden),
        "mla_dense": lambda: mla_mixer + dense_tail(c, hidden),
    }
    sequence = []
    for mixer_t, mlp_t in zip(mixer_types, mlp_types, strict=True):
        mixer = {"linear_attention": "kda", "deepseek_sparse_attention": "mla"}.get(mixer_t)
        if mixer is None:
            raise DeriveError(f"{c.model}: layer_types entry {mixer_t!r}; allowed "
                              f"linear_attention, deepseek_sparse_attention")
        if mlp_t not in ("sparse", "dense"):
            raise DeriveError(f"{c.model}: mlp_layer_types entry {mlp_t!r}; allowed sparse, "
                              f"dense")
        sequence.append(f"{mixer}_{'moe' if mlp_t == 'sparse' else 'dense'}")
    unquant = fp8_unquantized_roles(c, GLM5_NEXT_UNQUANTIZED)

    def priced(nodes: list[Node]) -> list[Node]:
        # In place, as the reference does: kinds built from one mixer share its node objects,
        # which the YAML dump writes as anchors (byte-identical output needs the same sharing).
        for n in nodes:
            if n.get("role") in unquant and n["op"] in ("GEMM", "GroupedGEMM"):
                n["weight_dtype"] = unquant[n["role"]]
        return nodes

    kinds = [kind(kid, mhc(priced(build()))) for kid, build in builders.items()
             if kid in sequence]
    if int(c.pick("num_spec_tokens") or 0) > 0:
        draft = priced([norm("mtp_enorm"), norm("mtp_hnorm"),
                        gemm("mtp_eh_proj", hidden, 2 * hidden), *builders["mla_moe"](),
                        norm("mtp_shared_head_norm")])
        kinds.append(kind(DRAFT_KIND, draft))
    return kinds, compress(sequence)
