"""Field checks of a deployment against what the engine and the kernel can honestly run
(docs/decisions.md RL9): the settings vLLM v0.31.0 itself refuses at startup, and lengths the
kernel's integer arithmetic cannot hold. Field layer, so ``validate`` and ``open`` agree.

* Attention heads not divisible by tp: vLLM's ``ModelConfig.verify_with_parallel_config``
  (vllm/config/model.py) refuses "Total number of attention heads (H) must be divisible by
  tensor parallel size (T)".
* A stated ``max_num_batched_tokens: 0``: no step could schedule a token. (Unstated, the
  engine's default applies, as before; the key's presence is read from the line map.)
* ``block_size``: vLLM's ``CacheConfig.block_size`` must be > 0 (vllm/config/cache.py) and the
  CUDA attention backends take manager blocks in multiples of 16
  (``FlashAttentionBackend``: "Block size must be a multiple of 16", kernel block sizes
  ``MultipleOf(16)``; vllm/v1/attention/backends/flash_attn.py), so a stated block size is a
  positive multiple of 16.
* Lengths beyond int32 (``max_model_len``, ``max_num_batched_tokens``, ``max_num_seqs``,
  ``block_size``): the engine holds them in int32 tensors; so do our per-request columns.
* ``max_model_len`` beyond the model's context (``max_position_embeddings`` of the
  ``config.json`` beside the graph, where the catalog carries one): vLLM's
  ``_get_and_verify_max_len`` refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .documents import Deployment, Graph
from .errors import Problem
from .validate_common import Collector

INT32_MAX = 2**31 - 1
RULE = "engine-limit"  # a pool's own problem: opening another pool is not refused for it
BLOCK_MULTIPLE = 16
_INT32_KEYS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size")


def attention_heads(model: Graph) -> int:
    """The model's query heads (the largest over its attention nodes; 0 when it has none)."""
    return max((n.n_q for lk in model.layer_kinds for n in lk.nodes if n.op == "Attention"),
               default=0)


def model_context(model_file: str | None) -> int:
    """``max_position_embeddings`` of the config.json beside the graph (0: none known)."""
    if not model_file:
        return 0
    path = Path(model_file).with_name("config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(config, dict):
        return 0
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    value = config.get("max_position_embeddings") or (text or {}).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else 0


def validate_pricing_limits(deployment: Deployment, model: Graph | None, file: str,
                            lines: Mapping[str, int] | None = None,
                            model_file: str | None = None) -> list[Problem]:
    """Every pool setting the engine refuses or the kernel cannot hold (module docstring)."""
    c = Collector(file, lines)
    stated = lines or {}
    heads = attention_heads(model) if model is not None else 0
    context = model_context(model_file)
    for i, pool in enumerate(deployment.pools):
        e, p = pool.engine, pool.parallel
        at = c.at(f"pools[{i}]")
        for key in _INT32_KEYS:
            value = getattr(e, key)
            if value > INT32_MAX:
                at.error(f"engine.{key}", f"{value} is beyond int32 ({INT32_MAX}); the engine "
                         "holds it in 32-bit integers")
        if e.max_num_batched_tokens == 0 and \
                f"pools[{i}].engine.max_num_batched_tokens" in stated:
            at.add("engine.max_num_batched_tokens", "0 schedules no token in any step; "
                     "state a positive budget or leave the key out for the engine's default")
        if e.block_size > 0 and e.block_size % BLOCK_MULTIPLE:
            at.add("engine.block_size", f"{e.block_size} is not a multiple of "
                     f"{BLOCK_MULTIPLE}; vLLM's CUDA attention backends take block sizes in "
                     f"multiples of {BLOCK_MULTIPLE} (16, 32, 64, ...)")
        if heads and p.tp >= 1 and heads % p.tp:
            at.add("parallel.tp", f"the model's {heads} attention heads are not divisible by "
                     f"tp {p.tp}; vLLM refuses such a tensor-parallel width")
        if context and e.max_model_len > context:
            at.add("engine.max_model_len", f"{e.max_model_len} is beyond the model's context "
                     f"of {context} tokens (max_position_embeddings of its config.json); vLLM "
                     "refuses a longer max_model_len")
    return [replace(p, rule=RULE) for p in c.problems]


def other_pools(problems: list[Problem], pool: int) -> list[Problem]:
    """The problems this module found in pools other than ``pool`` (they refuse that pool
    only, as a refusal would)."""
    own = f"deployment.pools[{pool}]"
    return [p for p in problems if p.rule == RULE and p.path.startswith("deployment.pools[")
            and not (p.path == own or p.path.startswith(own + "."))]
