"""Shared fixtures for the graph-derivation tests: the HuggingFace configs (copied from
shared/reference/hf-configs, see data/SOURCES.md) and a scenario template."""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "data" / "hf-configs"


def config_path(stem: str) -> Path:
    return CONFIGS / f"{stem}_config.json"


def quant_path(stem: str) -> Path | None:
    q = CONFIGS / f"{stem}_hf_quant_config.json"
    return q if q.is_file() else None


def all_config_stems() -> list[str]:
    return sorted(p.name[: -len("_config.json")] for p in CONFIGS.glob("*_config.json")
                  if not p.name.endswith("_hf_quant_config.json"))


SCENARIO = """kind: Scenario
name: {name}
model: {model}
coefficients: [cost-model-primitives, cost-model-collectives, cost-model-host-overheads, \
cost-model-attention, cost-model-recurrent, cost-model-memory]
engine_version: "0.29.0"
cluster:
  hardware: {chip}
  nodes: 1
  gpus_per_node: 8
---
kind: Deployment
name: {name}
pools:
  - role: colocated
    nodes: 1
    parallel:
      tp: {tp}
      pp: 1
      dp: 1
      enable_expert_parallel: false
    engine:
      block_size: {block}
      max_num_batched_tokens: 8192
      max_num_seqs: 256
      max_model_len: 32768
"""


def write_scenario(root: Path, model: str, chip: str, tp: int, block: int = 16) -> Path:
    path = root / f"s-{model}.yaml"
    path.write_text(SCENARIO.format(name=f"s-{model}", model=model, chip=chip, tp=tp,
                                    block=block))
    return path
