"""A Scenario + Deployment from a vLLM engine config (``blis-kernel scenario from-vllm-config``,
decision CH9), so that calibrating a measured run needs no hand-written YAML.

The config is JSON or YAML: vLLM's engine arguments, flat (``tensor_parallel_size``,
``max_num_seqs``, …, with ``-`` or ``_``; ``tensor_parallelism`` / ``tp`` also read) or in
vLLM's config sections (``model_config``, ``parallel_config``, ``cache_config``,
``scheduler_config``, ``compilation_config``, ``speculative_config``), and the engine version
as ``vllm_version`` / ``engine_version`` / ``version``. A key it does not know is listed, not
guessed at; a setting the config does not state is left to the kernel's engine defaults (which
follow vLLM's), and listed.

**Which rules price it.** The rules packs (``pipeline.rules``) describe vLLM's V1 engine.
A version with its own pack uses it. Any other vLLM version from 0.11.0 on (V1 only: vLLM
removed the V0 engine before 0.11.0, vllm-project/vllm#25033) is priced with the newest
published pack, and the result says so: the packs' facts (custom all-reduce widths,
sequence-parallel MoE, DCP backends, accepted values) are stable across those releases for
the deployments the kernel prices. An older version, or another engine, is refused: no pack
describes it. ``rules_version`` picks a pack explicitly.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.resources import data_dir
from pipeline.rules import PACKS

__all__ = ["ConfigError", "FromConfig", "from_vllm_config", "rules_for"]

MIN_V1_ONLY = (0, 11, 0)
COEFFICIENT_SETS = ["cost-model-primitives", "cost-model-collectives",
                    "cost-model-host-overheads", "cost-model-attention",
                    "cost-model-recurrent", "cost-model-memory"]
SECTIONS = ("model_config", "parallel_config", "cache_config", "scheduler_config",
            "compilation_config", "speculative_config", "kv_transfer_config",
            "device_config", "load_config", "observability_config")


class ConfigError(ValueError):
    """The engine config cannot be turned into a scenario (names the file and the key)."""


@dataclass
class FromConfig:
    name: str
    text: str  # the Scenario + Deployment YAML
    engine: str
    measured_version: str | None
    rules_version: str
    notes: list[str] = field(default_factory=list)  # what was assumed or left to defaults


def _version_tuple(v: str) -> tuple[int, int, int] | None:
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", v.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def rules_for(version: str | None, engine: str = "vllm", chosen: str | None = None
              ) -> tuple[str, str]:
    """(rules pack version, the sentence saying why) for a measured engine and version."""

    newest = max(PACKS, key=lambda v: _version_tuple(v) or (0, 0, 0))
    if chosen is not None:
        if chosen not in PACKS:
            raise ConfigError(f"--rules-version {chosen!r}: no such rules pack; published: "
                              f"{sorted(PACKS)}")
        return chosen, f"the {chosen} rules pack, as asked"
    if engine != "vllm":
        raise ConfigError(f"engine {engine!r}: the rules packs describe vLLM only "
                          f"({sorted(PACKS)}); no pack can honestly price it")
    if version is None:
        return newest, (f"the config states no vLLM version: the newest rules pack, "
                        f"{newest}, is used (pass --engine-version to record it)")
    if version in PACKS:
        return version, f"vLLM {version} has its own rules pack"
    t = _version_tuple(version)
    if t is None:
        raise ConfigError(f"vLLM version {version!r} is not a version number (e.g. 0.15.1)")
    if t < MIN_V1_ONLY:
        raise ConfigError(f"vLLM {version} predates 0.11.0 and may run the V0 engine, which no "
                          f"rules pack describes (packs: {sorted(PACKS)}); pass "
                          "--rules-version to price it with one anyway")
    return newest, (f"vLLM {version} has no rules pack of its own: the {newest} pack's rules "
                    "are used (V1 engine; its facts hold across 0.11 and later releases)")


def _flat(cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = str(k).replace("-", "_")
        if key in SECTIONS and isinstance(v, dict):
            for k2, v2 in v.items():
                k2 = str(k2).replace("-", "_")
                if key == "speculative_config":
                    k2 = "speculative_" + k2 if not k2.startswith(("num_spec", "method")) \
                        else ("speculative_method" if k2 == "method" else k2)
                out.setdefault(k2, v2)
        else:
            out[key] = v
    return out


# config key -> (section, deployment key) ; section "parallel" or "engine"
_PARALLEL = {"tensor_parallel_size": "tp", "tensor_parallelism": "tp", "tp": "tp",
             "pipeline_parallel_size": "pp", "data_parallel_size": "dp",
             "data_parallel_size_local": "dp_local", "decode_context_parallel_size": "dcp",
             "prefill_context_parallel_size": "pcp",
             "enable_expert_parallel": "enable_expert_parallel"}
_ENGINE = {"block_size": "block_size", "max_num_batched_tokens": "max_num_batched_tokens",
           "max_num_seqs": "max_num_seqs", "max_model_len": "max_model_len",
           "gpu_memory_utilization": "gpu_memory_utilization",
           "scheduling_policy": "scheduling_policy", "async_scheduling": "async_scheduling",
           "cudagraph_mode": "cudagraph_mode",
           "max_cudagraph_capture_size": "max_cudagraph_capture_size",
           "cudagraph_capture_sizes": "cudagraph_capture_sizes",
           "quantization": "quantization", "kv_cache_dtype": "cache_dtype",
           "cache_dtype": "cache_dtype", "enable_prefix_caching": "enable_prefix_caching",
           "disable_cascade_attn": "disable_cascade_attn",
           "disable_custom_all_reduce": "disable_custom_all_reduce",
           "all2all_backend": "all2all_backend", "dcp_comm_backend": "dcp_comm_backend",
           "mamba_cache_dtype": "mamba_cache_dtype",
           "mamba_ssm_cache_dtype": "mamba_ssm_cache_dtype"}
_IGNORED = {"model", "served_model_name", "tokenizer", "dtype", "seed", "trust_remote_code",
            "vllm_version", "engine_version", "version", "engine", "app", "host", "port",
            "enforce_eager", "compilation_config", "num_speculative_tokens",
            "speculative_method", "speculative_model", "revision", "download_dir",
            "disable_log_requests", "disable_log_stats", "enable_chunked_prefill", "level",
            "mode"}
_INT = {"tp", "pp", "dp", "dp_local", "dcp", "pcp", "block_size", "max_num_batched_tokens",
        "max_num_seqs", "max_model_len", "max_cudagraph_capture_size"}
_BOOL = {"enable_expert_parallel", "async_scheduling", "enable_prefix_caching",
         "disable_cascade_attn", "disable_custom_all_reduce"}


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the engine config: {exc.strerror}") from None
    try:
        doc = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: an engine config is a mapping of settings, got "
                          f"{type(doc).__name__}")
    return doc


def _model_name(hf: str, catalog: Path) -> str | None:
    """The catalog model for an HF id or a catalog name: its name, its ``source.repo``, or
    the id's last part, case-insensitively."""
    want = hf.strip().lower()
    tail = want.rsplit("/", 1)[-1]
    for d in sorted(catalog.glob("*/model.yaml")):
        try:
            doc = yaml.safe_load(d.read_text()) or {}
        except yaml.YAMLError:
            continue
        name = str(doc.get("name", d.parent.name))
        repo = str((doc.get("source") or {}).get("repo", "")).lower()
        if want in (name.lower(), repo) or tail == name.lower():
            return name
    return None


def _convert(file: str, key: str, dest: str, v: Any) -> Any:
    if dest in _INT:
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 0:
            raise ConfigError(f"{file}: {key}: must be a non-negative integer, got {v!r}")
        return int(v)
    if dest in _BOOL:
        if not isinstance(v, bool):
            raise ConfigError(f"{file}: {key}: must be true or false, got {v!r}")
        return v
    if dest == "gpu_memory_utilization":
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < float(v) <= 1:
            raise ConfigError(f"{file}: {key}: must be a fraction in (0, 1], got {v!r}")
        return float(v)
    if dest == "cudagraph_capture_sizes":
        if not isinstance(v, list) or not all(isinstance(x, int) and x > 0 for x in v):
            raise ConfigError(f"{file}: {key}: must be a list of positive integers, got {v!r}")
        return list(v)
    if not isinstance(v, str):
        raise ConfigError(f"{file}: {key}: must be text, got {v!r}")
    return v


def from_vllm_config(path: str | Path, hardware: str, *, name: str | None = None,
                     model: str | None = None, engine_version: str | None = None,
                     rules_version: str | None = None, gpus_per_node: int = 8,
                     catalog: str | Path | None = None) -> FromConfig:
    """The Scenario + Deployment YAML for the engine config at ``path`` on ``hardware`` (a
    catalog chip). ``model`` overrides the config's model (a catalog name or HF id);
    ``engine_version`` states the vLLM version when the config does not."""

    p = Path(path)
    raw = _read(p)
    cfg = _flat(raw)
    f = str(p)
    notes: list[str] = []
    cat = Path(catalog) if catalog else data_dir() / "catalog"
    hw_dir = cat / "hardware"
    if hw_dir.is_dir() and not (hw_dir / f"{hardware}.yaml").exists():
        have = sorted(x.stem for x in hw_dir.glob("*.yaml"))
        raise ConfigError(f"--hardware {hardware!r} is not a catalog chip; known: {have}")
    want_model = model or cfg.get("model") or cfg.get("served_model_name")
    if not want_model or not isinstance(want_model, str):
        raise ConfigError(f"{f}: model: required (the config names no model; pass --model)")
    model_name = _model_name(want_model, cat / "models")
    if model_name is None:
        raise ConfigError(f"{f}: model: {want_model!r} is not a catalog model (by name or "
                          "Hugging Face repo); pass --model NAME, or add it with "
                          "`blis-kernel graph derive`")
    stated = next((str(cfg[k]) for k in ("vllm_version", "engine_version", "version")
                   if cfg.get(k) not in (None, "")), None)
    if stated and engine_version and stated.lstrip("v") != engine_version.lstrip("v"):
        raise ConfigError(f"{f}: the config states vLLM {stated}, --engine-version says "
                          f"{engine_version}")
    version = (stated or engine_version)
    version = version.lstrip("v") if version else None
    engine_name = str(cfg.get("engine", "vllm")).lower()
    rules, why = rules_for(version, engine_name, rules_version)
    notes.append(why)
    parallel: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    unknown = []
    for key, v in cfg.items():
        if v is None:
            continue
        if key in _PARALLEL:
            parallel[_PARALLEL[key]] = _convert(f, key, _PARALLEL[key], v)
        elif key in _ENGINE:
            engine[_ENGINE[key]] = _convert(f, key, _ENGINE[key], v)
        elif key not in _IGNORED:
            unknown.append(key)
    comp = raw.get("compilation_config")
    if isinstance(comp, dict) and "cudagraph_mode" in comp and "cudagraph_mode" not in engine:
        engine["cudagraph_mode"] = _convert(f, "compilation_config.cudagraph_mode",
                                            "cudagraph_mode", str(comp["cudagraph_mode"])
                                            .removeprefix("CUDAGraphMode."))
    if cfg.get("enforce_eager") is True:
        engine["cudagraph_mode"] = "NONE"
        notes.append("enforce_eager: cudagraph_mode NONE")
    n_spec = cfg.get("num_speculative_tokens") or cfg.get("speculative_num_speculative_tokens")
    method = cfg.get("speculative_method")
    if n_spec and method:
        engine["speculative"] = {"method": str(method), "num_spec_tokens": int(n_spec)}
    for k in ("tp", "pp", "dp"):
        parallel.setdefault(k, 1)
    parallel.setdefault("enable_expert_parallel", False)
    if unknown:
        notes.append(f"not read (no deployment field): {', '.join(sorted(unknown))}")
    unstated = [k for k in ("block_size", "max_num_batched_tokens", "max_num_seqs",
                            "max_model_len", "gpu_memory_utilization", "cudagraph_mode",
                            "cache_dtype") if k not in engine]
    if unstated:
        notes.append(f"not in the config, left to the engine defaults: {', '.join(unstated)}")
    world = parallel["tp"] * parallel["pp"] * parallel["dp"] * max(parallel.get("pcp", 1), 1)
    nodes = max(1, math.ceil(world / gpus_per_node))
    scen_name = name or re.sub(r"[^a-z0-9.]+", "-",
                               f"{model_name}-{hardware}-tp{parallel['tp']}"
                               + (f"-pp{parallel['pp']}" if parallel["pp"] > 1 else "")
                               + (f"-dp{parallel['dp']}" if parallel["dp"] > 1 else "")
                               + (f"-vllm{version}" if version else "")).strip("-")
    scenario = {"kind": "Scenario", "name": scen_name, "model": model_name,
                "coefficients": COEFFICIENT_SETS, "engine_version": rules,
                "cluster": {"hardware": hardware, "nodes": nodes,
                            "gpus_per_node": gpus_per_node}}
    deployment = {"kind": "Deployment", "name": scen_name,
                  "pools": [{"role": "colocated", "nodes": nodes, "parallel": parallel,
                             "engine": engine}]}
    head = [f"# Written by `blis-kernel scenario from-vllm-config` from {p.name}.",
            f"# Measured engine: vllm {version or '(version not stated)'}; rules: {why}.",
            f"# Calibrate with --engine vllm{':' + version if version else ''} unless the "
            "trace has engine/engine_version columns."]
    text = ("\n".join(head) + "\n"
            + yaml.safe_dump(scenario, sort_keys=False) + "---\n"
            + yaml.safe_dump(deployment, sort_keys=False))
    return FromConfig(scen_name, text, "vllm", version, rules, notes)
