"""Architecture -> handler, speculative methods, refusals, and the driver (model.md §13.3,
model.md §13.4)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from .config import Config, DeriveError, fp8_unquantized_roles, merge_hf_quant, weight_dtype
from .families import (
    Result,
    handler_deci,
    handler_deepseek_v4,
    handler_dense,
    handler_llama4,
    handler_mimo_v2,
    handler_minimax_m2,
    handler_minimax_m3,
    handler_moe,
    handler_step3p7,
)
from .hybrids import handler_glm5_next, handler_kimi_k3, handler_nemotron_h, handler_qwen3_5
from .nodes import DRAFT_KIND, gemm, norm

DERIVER_VERSION = 1

HANDLERS: dict[str, Callable[[Config], Result]] = {
    "LlamaForCausalLM": handler_dense,
    "MistralForCausalLM": handler_dense,
    "Qwen2ForCausalLM": handler_dense,
    "Qwen3ForCausalLM": handler_dense,
    "MixtralForCausalLM": handler_moe,
    "Qwen3MoeForCausalLM": handler_moe,
    "Llama4ForConditionalGeneration": handler_llama4,  # decisions.md G8
    "GraniteMoeForCausalLM": handler_moe,
    "DeepseekV2ForCausalLM": handler_moe,
    "DeepseekV3ForCausalLM": handler_moe,
    "DeepseekV4ForCausalLM": handler_deepseek_v4,
    "GlmMoeDsaForCausalLM": handler_moe,
    "InklingForConditionalGeneration": handler_moe,
    "GptOssForCausalLM": handler_moe,
    "MiniMaxM2ForCausalLM": handler_minimax_m2,
    "MiniMaxM3SparseForCausalLM": handler_minimax_m3,
    "MiniMaxM3SparseForConditionalGeneration": handler_minimax_m3,
    "NemotronHForCausalLM": handler_nemotron_h,
    "Qwen3_5MoeForConditionalGeneration": handler_qwen3_5,
    "KimiK3ForConditionalGeneration": handler_kimi_k3,
    "Glm5NextForConditionalGeneration": handler_glm5_next,
    "KimiK25ForConditionalGeneration": handler_moe,
    # Decided here, not in the reference deriver (docs/decisions.md, issue 15):
    "Qwen3VLForConditionalGeneration": handler_dense,
    "Qwen3VLMoeForConditionalGeneration": handler_moe,
    "Qwen3_5ForConditionalGeneration": handler_qwen3_5,
    "MiMoForCausalLM": handler_dense,
    "DeepseekV32ForCausalLM": handler_moe,
    "MiniMaxM3ForCausalLM": handler_minimax_m3,
    "MiMoV2FlashForCausalLM": handler_mimo_v2,
    "Step3p7FlashForCausalLM": handler_step3p7,
    "DeciLMForCausalLM": handler_deci,
}

# Architectures seen in real configs that this deriver refuses, and why (docs/decisions.md).
REFUSED: dict[str, str] = {
    "DeepseekV41ForCausalLM": "DeepSeek-V4.1 shares KV and index caches across layers "
    "(kv_source_layer_ids, index_source_layer_ids) and adds engram embeddings and a DSpark "
    "draft; a ModelGraph has no primitive for a layer that reads another layer's cache",
    "Gemma4ForConditionalGeneration": "Gemma 4's global layers tie K to V (attention_k_eq_v) "
    "at their own head_dim and KV-head count (global_head_dim, num_global_key_value_heads), "
    "and enable_moe_block runs a dense MLP beside the experts; not derived yet",
    "MuseGlimmerForConditionalGeneration": "MuseGlimmer scales attention and output by "
    "per-model factors (qk_scale_factor, output_multiplier, post_norm_eps) whose vLLM "
    "implementation was not available to confirm the layer structure; not derived yet",
}

SPEC_METHODS = {
    "GlmMoeDsaForCausalLM": "deepseek_mtp",
    "KimiK3ForConditionalGeneration": "kimi_k3_mtp",
    "NemotronHForCausalLM": "nemotron_h_mtp",
    "InklingForConditionalGeneration": "inkling_mtp",
    "DeepseekV2ForCausalLM": "deepseek_mtp",
    "DeepseekV3ForCausalLM": "deepseek_mtp",
    "DeepseekV32ForCausalLM": "deepseek_mtp",
    "DeepseekV4ForCausalLM": "deepseek_mtp",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_mtp",
    "Qwen3_5ForConditionalGeneration": "qwen3_5_mtp",
    "Glm5NextForConditionalGeneration": "glm5_next_mtp",
    "MiniMaxM3SparseForConditionalGeneration": "minimax_m3_mtp",
    "MiniMaxM3SparseForCausalLM": "minimax_m3_mtp",
    "MiniMaxM3ForCausalLM": "minimax_m3_mtp",
    "MiMoForCausalLM": "mimo_mtp",
    "MiMoV2FlashForCausalLM": "mimo_v2_mtp",
    "Step3p7FlashForCausalLM": "step3p5_mtp",
}
# Draft length from num_mtp_modules (not num_nextn_predict_layers) for these.
MTP_MODULE_ARCHS = frozenset({"MiniMaxM3SparseForConditionalGeneration",
                              "MiniMaxM3SparseForCausalLM", "MiniMaxM3ForCausalLM"})
# Architectures whose fp8 checkpoint keeps lm_head at the base width, per their exclusion list.
HEAD_UNQUANTIZED = {"Glm5NextForConditionalGeneration": {"lm_head": "lm_head"}}


def supported_architectures() -> list[str]:
    return sorted(HANDLERS)


def derive_config(config: bytes | str | dict[str, Any], name: str,
                 quant: bytes | str | dict[str, Any] | None = None,
                 source: str = "config.json") -> dict[str, Any]:
    """The ModelGraph (as an ordered dict) a HuggingFace config derives, as the reference
    deriver builds it. ``config`` is the file's bytes (hashed as given), text, or a parsed
    dict (hashed as its canonical JSON); ``quant`` an optional ``hf_quant_config.json``."""
    data = config.encode() if isinstance(config, str) else config
    if isinstance(data, dict):
        raw, digest = data, hashlib.sha256(json.dumps(data).encode()).hexdigest()
    else:
        digest = hashlib.sha256(data).hexdigest()
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise DeriveError(f"{source}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise DeriveError(f"{source}: a config is a JSON object, got {type(raw).__name__}")
    if quant is not None:
        q = json.loads(quant) if isinstance(quant, bytes | str) else quant
        raw = merge_hf_quant(raw, q, f"{name}: --quant")
    c = Config(raw, name)
    arches = raw.get("architectures") or c.cfg.get("architectures") or []
    if not arches:
        raise DeriveError(f"{name}: config declares no architectures")
    arch = arches[0]
    if arch in REFUSED:
        raise DeriveError(f"{name}: architecture {arch!r} is refused: {REFUSED[arch]}")
    handler = HANDLERS.get(arch)
    if handler is None:
        raise DeriveError(f"{name}: no handler for architecture {arch!r}; supported: "
                          f"{', '.join(supported_architectures())}")
    kinds, stack = handler(c)
    hidden = int(c.require("hidden_size"))
    vocab = int(c.require("vocab_size"))
    graph: dict[str, Any] = {
        "kind": "ModelGraph",
        "name": name,
        "derived_from": {"format": "hf_config_json", "path": "config.json", "sha256": digest,
                         "deriver_version": DERIVER_VERSION},
        "global": {"hidden_size": hidden, "vocab_size": vocab,
                   "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
                   "weight_dtype": weight_dtype(c)},
        "layer_kinds": kinds,
        "stack": stack,
    }
    if c.multimodal:
        graph["modality"] = "text_decoder_of_multimodal"
    lm_head = gemm("lm_head", vocab, hidden)
    head_width = fp8_unquantized_roles(c, HEAD_UNQUANTIZED.get(arch, {})).get("lm_head")
    if head_width:
        lm_head["weight_dtype"] = head_width
    graph["head"] = [norm("final_norm"), lm_head]
    spec = c.pick("num_spec_tokens")
    if arch in MTP_MODULE_ARCHS:
        spec = c.key("num_mtp_modules")
    if spec and int(spec) > 0:
        defined = [k["id"] for k in kinds]
        vector = c.get("mtp_layers_block_type")
        if DRAFT_KIND in defined:
            pattern = [DRAFT_KIND]
        elif vector:
            pattern = [n if n in defined else defined[-1] for n in vector]
        else:
            pattern = [defined[-1]]
        method = SPEC_METHODS.get(arch)
        if method is None:
            raise DeriveError(f"{name}: {arch} declares draft layers but no speculative "
                              f"method is recorded for it")
        graph["speculator"] = {"method": method, "num_spec_tokens": int(spec),
                               "stack": {"pattern": pattern, "repeat": 1}}
    return graph
