"""The experiment catalogue: for each sim-to-real experiment, the scenario that prices it and
the inference-perf workload that loads it.

``experiments.csv`` (the study's deployments) is joined with ``catalogue.yaml`` (catalog model
per Hugging Face model, chip per hardware label, the engine limits every run states, the
workload file per workload name). Scenarios are one per distinct deployment (model, chip, TP,
DP, max_num_batched_tokens, gpu_memory_utilization) and are written as data under
``data/measurements/simtoreal/scenarios/`` by ``write_scenarios``; a test keeps the committed
files equal to what this module renders (decision ST3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kernel.replay.simtoreal.study import StudyError, load_experiments, study_dir

__all__ = ["CatalogueError", "Experiment", "Stage", "experiments", "load_catalogue", "scenario_path",
           "scenario_name", "scenario_text", "write_scenarios"]

# the cost-model coefficient sets every embedded scenario names
COEFFICIENTS = ("cost-model-primitives, cost-model-collectives, cost-model-host-overheads, "
                "cost-model-attention, cost-model-recurrent, cost-model-memory")
ENGINE_VERSION = "0.29.0"  # the only rules pack published (pipeline/rules.py)
_ENGINE_KEYS = {"max_num_seqs": int, "max_model_len": int, "block_size": int,
                "enable_prefix_caching": bool, "async_scheduling": bool}


class CatalogueError(StudyError):
    """The catalogue cannot price an experiment, or a catalogue file is malformed."""


@dataclass(frozen=True)
class Stage:
    """One inference-perf load stage: ``rate`` requests per second for ``duration`` s."""
    rate: float
    duration: float


@dataclass(frozen=True)
class Experiment:
    """One sim-to-real experiment and how it is priced."""
    exp_id: int
    folder: str
    hf_model: str
    model: str                 # catalog model name
    hardware: str              # the study's label
    chip: str                  # catalog chip
    tp: int
    dp: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    cpu_offload: bool
    precision: str
    workload: str
    workload_config: dict[str, Any]   # the inference-perf config (workloads/<name>.yaml)
    engine: dict[str, Any]            # max_num_seqs, max_model_len, block_size, ...

    @property
    def scenario(self) -> str:
        return scenario_name(self)

    @property
    def stages(self) -> tuple[Stage, ...]:
        return tuple(Stage(float(s["rate"]), float(s["duration"]))
                     for s in self.workload_config["load"]["stages"])


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise CatalogueError(f"{path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CatalogueError(f"{path}: not valid YAML ({exc})") from None


def _mapping(doc: Any, path: Path, key: str) -> dict[str, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, dict) or not value:
        raise CatalogueError(f"{path}: `{key}` must be a non-empty mapping")
    return value


def _check_workload(cfg: Any, path: Path) -> dict[str, Any]:
    """The parts of an inference-perf config the replay uses must be there and sane."""
    if not isinstance(cfg, dict):
        raise CatalogueError(f"{path}: an inference-perf config must be a mapping")
    sp = (cfg.get("data") or {}).get("shared_prefix")
    if (cfg.get("data") or {}).get("type") != "shared_prefix" or not isinstance(sp, dict):
        raise CatalogueError(f"{path}: data.type must be shared_prefix with a "
                             f"data.shared_prefix mapping")
    for key in ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len",
                "output_len"):
        if not isinstance(sp.get(key), int) or sp[key] < 0 or (
                key != "system_prompt_len" and sp[key] == 0):
            raise CatalogueError(f"{path}: data.shared_prefix.{key} must be a positive integer "
                                 f"(system_prompt_len may be 0), got {sp.get(key)!r}")
    stages = (cfg.get("load") or {}).get("stages")
    if not isinstance(stages, list) or not stages:
        raise CatalogueError(f"{path}: load.stages must be a non-empty list")
    for i, st in enumerate(stages):
        if not isinstance(st, dict) or not all(
                isinstance(st.get(k), int | float) and st[k] > 0 for k in ("rate", "duration")):
            raise CatalogueError(f"{path}: load.stages[{i}] needs a positive rate and duration, "
                                 f"got {st!r}")
    return cfg


def load_catalogue(root: str | Path | None = None) -> dict[str, Any]:
    """``catalogue.yaml`` with each workload file read and checked."""
    base = Path(root) if root is not None else study_dir()
    path = base / "catalogue.yaml"
    doc = _read_yaml(path)
    models, hardware = _mapping(doc, path, "models"), _mapping(doc, path, "hardware")
    engine, workloads = _mapping(doc, path, "engine"), _mapping(doc, path, "workloads")
    for key, kind in _ENGINE_KEYS.items():
        if not isinstance(engine.get(key), kind):
            raise CatalogueError(f"{path}: engine.{key} must be a {kind.__name__}, got "
                                 f"{engine.get(key)!r}")
    extra = sorted(set(engine) - set(_ENGINE_KEYS))
    if extra:
        raise CatalogueError(f"{path}: unknown engine keys {extra}; allowed: "
                             f"{sorted(_ENGINE_KEYS)}")
    configs = {name: _check_workload(_read_yaml(base / rel), base / rel)
               for name, rel in workloads.items()}
    return {"models": models, "hardware": hardware, "engine": engine, "workloads": configs}


def experiments(root: str | Path | None = None, which: str = "study") -> list[Experiment]:
    """Every experiment of the set ``which`` (``study``: ``experiments.csv``; ``training``:
    ``training.csv``; ``all``), resolved through ``catalogue.yaml``. An experiment the
    catalogue cannot price is an error naming what is missing."""
    cat = load_catalogue(root)
    out = []
    for row in load_experiments(root, which).iter_rows(named=True):
        where = f"experiment {row['exp_id']} ({row['folder']})"
        for key, table in (("hf_model", "models"), ("hardware", "hardware"),
                           ("workload", "workloads")):
            if row[key] not in cat[table]:
                raise CatalogueError(f"catalogue.yaml: no `{table}` entry for {row[key]!r}, "
                                     f"needed by {where}; known: {sorted(cat[table])}")
        if row["precision"] != "FP16":
            raise CatalogueError(f"{where}: precision {row['precision']!r} is not priced; the "
                                 f"catalog graphs are the bf16 checkpoints (FP16 only)")
        out.append(Experiment(
            exp_id=row["exp_id"], folder=row["folder"], hf_model=row["hf_model"],
            model=cat["models"][row["hf_model"]], hardware=row["hardware"],
            chip=cat["hardware"][row["hardware"]], tp=row["tp"], dp=row["dp"],
            max_num_batched_tokens=row["max_num_batched_tokens"],
            gpu_memory_utilization=row["gpu_memory_utilization"],
            cpu_offload=row["cpu_offload"], precision=row["precision"],
            workload=row["workload"], workload_config=cat["workloads"][row["workload"]],
            engine=dict(cat["engine"])))
    return out


def scenario_name(exp: Experiment) -> str:
    """One scenario per distinct deployment; the name states every field that varies."""
    gmu = round(exp.gpu_memory_utilization * 100)
    dp = f"-dp{exp.dp}" if exp.dp != 1 else ""
    return (f"simtoreal-{exp.model}-{exp.chip}-tp{exp.tp}{dp}-mbt{exp.max_num_batched_tokens}"
            f"-gmu{gmu}")


def scenario_text(exp: Experiment) -> str:
    """The Scenario and Deployment documents pricing ``exp`` (the embedded scenarios' layout).
    cudagraph_mode is left unstated: vLLM's default, FULL_AND_PIECEWISE, in both v0.15.1 and
    v0.31.0."""
    name, eng = scenario_name(exp), exp.engine
    gpus = exp.tp * exp.dp
    return f"""kind: Scenario
name: {name}
model: {exp.model}
coefficients: [{COEFFICIENTS}]
engine_version: "{ENGINE_VERSION}"
cluster:
  hardware: {exp.chip}
  nodes: 1
  gpus_per_node: {max(8, gpus)}
---
kind: Deployment
name: {name}
pools:
  - role: colocated
    nodes: 1
    parallel:
      tp: {exp.tp}
      pp: 1
      dp: {exp.dp}
      enable_expert_parallel: false
    engine:
      cache_dtype: auto
      block_size: {eng['block_size']}
      max_num_batched_tokens: {exp.max_num_batched_tokens}
      max_num_seqs: {eng['max_num_seqs']}
      max_model_len: {eng['max_model_len']}
      gpu_memory_utilization: {exp.gpu_memory_utilization}
      enable_prefix_caching: {str(eng['enable_prefix_caching']).lower()}
      async_scheduling: {str(eng['async_scheduling']).lower()}
"""


def write_scenarios(out: str | Path | None = None,
                    exps: list[Experiment] | None = None) -> dict[str, Path]:
    """Write each distinct scenario to ``out`` (default: the embedded
    ``data/measurements/simtoreal/scenarios``); returns {scenario name: path}."""
    target = Path(out) if out is not None else study_dir() / "scenarios"
    target.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for exp in exps if exps is not None else experiments(which="all"):
        path = target / f"{exp.scenario}.yaml"
        if exp.scenario not in written:
            path.write_text(scenario_text(exp))
            written[exp.scenario] = path
    return written


def scenario_path(exp: Experiment, root: str | Path | None = None) -> Path:
    """The committed scenario file of ``exp``."""
    base = Path(root) if root is not None else study_dir()
    return base / "scenarios" / f"{exp.scenario}.yaml"
