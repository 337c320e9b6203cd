"""Reading a HuggingFace ``config.json``: concept aliases, dtypes and quantisation layouts.

The rules are the reference deriver's (model.md §13.2), restated: a concept is
the first present, non-null key among its aliases; a multimodal config's shapes come from its
``text_config``; the global weight width is the base dtype unless a quantisation block says
otherwise, and partial quantisation rides on the nodes it covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Node = dict[str, Any]

ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_q_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels"),
    "ffn_size": ("intermediate_size", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "top_k": ("num_experts_per_tok", "num_experts_per_token", "moe_topk"),
    "moe_ffn_size": ("moe_intermediate_size", "expert_intermediate_size"),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "shared_ffn_size": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
    "sliding_window": ("sliding_window", "sliding_window_size"),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "num_spec_tokens": ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
    "moe_latent_size": ("moe_latent_size", "routed_expert_hidden_size"),
    "index_topk": ("index_topk",),
    "dtype": ("torch_dtype", "dtype"),
}

DTYPES = {
    "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
    "float32": "fp32", "fp32": "fp32", "float8_e4m3fn": "fp8", "fp8": "fp8",
    "nvfp4": "nvfp4", "mxfp4": "mxfp4", "int8": "int8",
}

# Activation byte widths (for Elementwise traffic); sub-byte formats never carry activations.
DTYPE_WIDTHS = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

# Tensor-name fragment -> role class, for checkpoints that list per-tensor widths.
QUANT_ROLE_CLASSES = {
    "experts.": "routed_experts",
    "shared_experts.": "shared_experts",
    "mixer.in_proj": "recurrent_in",
    "mixer.out_proj": "recurrent_out",
}

# Quant-algo spellings (ModelOpt and friends) to graph dtypes; a WxAy spelling is its weight half.
QUANT_ALGOS = {
    "NVFP4": "nvfp4", "MXFP4": "mxfp4", "FP8": "fp8", "INT8": "int8", "INT4": "int4",
    "W4A16_NVFP4": "nvfp4", "W4A16_MXFP4": "mxfp4", "W8A8_FP8": "fp8", "W8A16_INT8": "int8",
}

# vLLM resolves expert_dtype by name (DeepSeek-V4 quant config): fp4 is MXFP4 experts.
EXPERT_DTYPES = {"fp4": "mxfp4", "fp8": "fp8"}

# Checkpoints that state no dtype at all but whose unquantised tensors are documented bf16,
# by catalog name (the reference's table) and by model_type (so any name works).
UNQUANTIZED_BASE = {"gpt-oss-120b": "bf16", "gpt-oss-20b": "bf16"}
UNQUANTIZED_BASE_BY_TYPE = {"gpt_oss": "bf16"}

# Graph roles whose weights belong to a layer's self_attn module (an ignore list naming
# self_attn leaves them at the base width).
ATTENTION_WEIGHT_ROLES = frozenset({
    "qkv_proj", "qkv_a_proj", "kv_a_proj", "q_proj", "q_b_proj", "kv_b_proj", "o_proj",
    "index_wq_b", "index_wk_weights_proj", "index_head_gate_proj", "index_kpool_compress_gate",
    "index_wq_proj", "index_weights_proj", "index_compressor_fused_wkv_wgate", "index_qk_proj",
    "kda_q_proj", "kda_k_proj", "kda_v_proj", "kda_b_proj", "kda_f_a_proj", "kda_f_b_proj",
    "kda_g_a_proj", "kda_g_b_proj", "kda_g_proj", "kda_o_proj",
})


class DeriveError(ValueError):
    """A config the deriver cannot translate faithfully; raised instead of guessing."""


@dataclass(frozen=True)
class Config:
    """One model's config as the deriver reads it: the outer object, the text decoder's view
    (``text_config`` when nested), and the model name used in messages."""

    raw: dict[str, Any]
    model: str
    cfg: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        tc = self.raw.get("text_config")
        object.__setattr__(self, "cfg", tc if isinstance(tc, dict) else self.raw)

    @property
    def multimodal(self) -> bool:
        return "text_config" in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        return self.cfg.get(key, default)

    def pick(self, concept: str) -> Any:
        return pick(self.cfg, concept)

    def require(self, concept: str) -> Any:
        value = self.pick(concept)
        if value is None:
            raise DeriveError(f"{self.model}: config states none of {list(ALIASES[concept])} "
                              f"(the {concept!r} this architecture needs)")
        return value

    def key(self, name: str, within: dict[str, Any] | None = None) -> Any:
        """A family-specific key read by its literal name; absent or null is an error."""
        value = (self.cfg if within is None else within).get(name)
        if value is None:
            raise DeriveError(f"{self.model}: config states no {name!r}, which this "
                              f"architecture needs")
        return value

    def architectures(self) -> list[str]:
        outer = self.raw.get("architectures") or []
        inner = self.cfg.get("architectures") or []
        return [*outer, *inner]

    def quant(self) -> dict[str, Any]:
        q = self.raw.get("quantization_config") or self.cfg.get("quantization_config") or {}
        return q if isinstance(q, dict) else {}

    def inner_quant(self) -> dict[str, Any]:
        """The quantisation block as the text decoder's view sees it (node overrides)."""
        q = self.cfg.get("quantization_config") or {}
        return q if isinstance(q, dict) else {}


def pick(cfg: dict[str, Any], concept: str) -> Any:
    for key in ALIASES[concept]:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def base_dtype(c: Config) -> str:
    """The declared parameter dtype, ignoring any quantisation block."""
    declared = c.pick("dtype") or pick(c.raw, "dtype")
    if declared is None:
        known = (UNQUANTIZED_BASE.get(c.model)
                 or UNQUANTIZED_BASE_BY_TYPE.get(str(c.raw.get("model_type"))))
        if known:
            return known
        raise DeriveError(f"{c.model}: config declares no dtype (torch_dtype or dtype)")
    name = DTYPES.get(str(declared).lower())
    if name is None:
        raise DeriveError(f"{c.model}: dtype {declared!r} is not one of {sorted(DTYPES)}")
    return name


def act_bytes(c: Config) -> int:
    width = DTYPE_WIDTHS.get(base_dtype(c))
    if width is None:
        raise DeriveError(f"{c.model}: base dtype {base_dtype(c)!r} has no activation width")
    return width


def quantized_classes(c: Config) -> dict[str, str]:
    """Role class -> width, from a per-tensor ``quantized_layers`` map ({} when none)."""
    layers = c.inner_quant().get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        return {}
    found: dict[str, set[str]] = {}
    for name, spec in layers.items():
        algo = spec.get("quant_algo") if isinstance(spec, dict) else spec
        width = QUANT_ALGOS.get(str(algo).upper())
        if width is None:
            raise DeriveError(f"{c.model}: quantized_layers[{name!r}] names algo {algo!r}; "
                              f"known: {sorted(QUANT_ALGOS)}")
        # A ModelOpt module name ("layers.0.ffn.experts") has no trailing dot; match it too.
        matches = [frag for frag in QUANT_ROLE_CLASSES
                   if frag in name or name.endswith(frag.rstrip("."))]
        if matches:
            found.setdefault(QUANT_ROLE_CLASSES[max(matches, key=len)], set()).add(width)
    out = {}
    for role, widths in found.items():
        if len(widths) > 1:
            raise DeriveError(f"{c.model}: role class {role!r} is quantised at more than one "
                              f"width {sorted(widths)}; one node cannot price both")
        out[role] = widths.pop()
    return out


def skips_attention(c: Config) -> bool:
    """compressed-tensors with the blanket ``re:.*self_attn.*`` ignore entry."""
    q = c.quant()
    if "compressed-tensors" not in str(q.get("quant_method", "")).lower():
        return False
    return any(str(e) == "re:.*self_attn.*" for e in q.get("ignore") or ())


def fp8_unquantized_roles(c: Config, roles: dict[str, str]) -> dict[str, str]:
    """Graph role -> base width for module suffixes an fp8 checkpoint leaves unquantised."""
    q = c.quant()
    if "fp8" not in str(q.get("quant_method", "")).lower():
        return {}
    names = set(q.get("modules_to_not_convert") or ())
    matched = {role for suffix, role in roles.items()
               if any(n == suffix or n.endswith("." + suffix) for n in names)}
    if not matched:
        return {}
    base = base_dtype(c)
    return {role: base for role in matched}


def _group_width(c: Config, q: dict[str, Any]) -> str | None:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    best: tuple[int, int, Any, Any, Any] | None = None
    for spec in groups.values():
        weights = (spec or {}).get("weights") or {}
        bits = weights.get("num_bits")
        if bits is None:
            continue
        count = len(spec.get("targets") or ())
        if best is None or count > best[1]:
            best = (int(bits), count, weights.get("type"), spec.get("format"),
                    weights.get("group_size"))
    if best is None:
        return None
    bits, _, kind, fmt, group = best
    if bits == 4 and kind == "float":
        name = str(fmt or q.get("format") or "").lower()
        if "mxfp4" in name:
            return "mxfp4"
        if "nvfp4" in name or group == 16:
            return "nvfp4"
        if group == 32:
            return "mxfp4"
        raise DeriveError(f"{c.model}: a 4-bit float weight group names no format and has "
                          f"group_size {group!r}; NVFP4 and MXFP4 cannot be told apart")
    widths = {(8, "float"): "fp8", (8, "int"): "int8", (4, "int"): "int4"}
    if (bits, kind) in widths:
        return widths[(bits, kind)]
    raise DeriveError(f"{c.model}: a {bits}-bit {kind!r} weight group has no graph dtype")


def weight_dtype(c: Config) -> str:
    """The graph's global weight width (model.md §13.2)."""
    q = c.quant()
    if not q:
        return base_dtype(c)
    if quantized_classes(c):
        return base_dtype(c)
    fmt = str(q.get("quant_method", "")).lower()
    if "nvfp4" in fmt or "modelopt_fp4" in fmt:
        return "nvfp4"
    if "fp8" in fmt:
        return "fp8"
    grouped = _group_width(c, q)
    if grouped is not None:
        return grouped
    if fmt == "compressed-tensors" and q.get("weight_block_size"):
        return "fp8"
    if fmt in ("mxfp4", "nvfp4"):
        return base_dtype(c) if q.get("modules_to_not_convert") else fmt
    if fmt:
        raise DeriveError(f"{c.model}: quant_method {fmt!r} states no group widths; the stored "
                          f"width cannot be inferred")
    return base_dtype(c)


def merge_hf_quant(raw: dict[str, Any], hf_quant: dict[str, Any], source: str) -> dict[str, Any]:
    """Fold a ModelOpt ``hf_quant_config.json`` into the config as vLLM does (it prefers that
    file): NVFP4 -> ``modelopt_fp4``, FP8 -> ``modelopt_fp8``, MIXED_PRECISION keeps the base
    width with per-tensor ``quantized_layers``. The result is a new dict; ``raw`` is unchanged."""
    body = hf_quant.get("quantization", hf_quant)
    if not isinstance(body, dict) or "quant_algo" not in body:
        raise DeriveError(f"{source}: not an hf_quant_config (no quantization.quant_algo)")
    algo = str(body["quant_algo"]).upper()
    if algo == "MIXED_PRECISION":
        if not isinstance(body.get("quantized_layers"), dict):
            raise DeriveError(f"{source}: MIXED_PRECISION without a quantized_layers map")
        quant: dict[str, Any] = {"quant_method": "modelopt_mixed",
                                 "quantized_layers": body["quantized_layers"]}
    elif algo in ("NVFP4", "FP8"):
        quant = {"quant_method": "modelopt_fp4" if algo == "NVFP4" else "modelopt_fp8"}
    else:
        raise DeriveError(f"{source}: quantization.quant_algo {body['quant_algo']!r} is not "
                          f"one of NVFP4, FP8, MIXED_PRECISION")
    merged = dict(raw)
    if isinstance(raw.get("text_config"), dict):
        merged["text_config"] = {**raw["text_config"], "quantization_config": quant}
    else:
        merged["quantization_config"] = quant
    return merged
