"""inference-sim/training's 16 vLLM runs as more experiments (decision ST11).

Each run directory (``default_args/<stamp>-<model>-tp<N>-<workload>``) has the server's
``exp-config.yaml``, the resolved inference-perf ``results/config.yaml`` and inference-perf's
lifecycle reports (``results/stage_<n>_lifecycle_metrics.json`` and
``summary_lifecycle_metrics.json``, seconds). ``extract_training`` turns them into
``training.csv`` (the columns of ``experiments.csv``) and ``training_measured.csv`` (the columns
of ``measured.csv``), with the seven metrics computed from the reports as the study computes
its measured values (:mod:`kernel.replay.simtoreal.metrics`). A run whose measured values
are a study experiment's is that experiment and is left out (seven are: experiments 2–11); a
run with failed requests (the three overloaded ``reasoning`` runs, also left out by the
repository's own ``split.py``, and CodeLlama's) is left out and counted.

Ids are 101, 102, … in directory order; ``folder`` keeps the directory name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from kernel.replay.simtoreal.metrics import itl_mean
from kernel.replay.simtoreal.study import METRICS, StudyError, load_measured, study_dir

__all__ = ["FIRST_ID", "extract_training", "run_metrics"]

FIRST_ID = 101
_WORKLOADS = ("general", "codegen", "roleplay", "reasoning")


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(f"{path}: cannot be read as JSON ({exc})") from None


def _yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StudyError(f"{path}: cannot be read as YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise StudyError(f"{path}: expected a mapping")
    return doc


def run_metrics(report: dict[str, Any], where: str) -> dict[str, float]:
    """The seven metrics (ms) of one inference-perf lifecycle report."""
    try:
        ok = report["successes"]
        lat = ok["latency"]
        e2e, ttft = lat["request_latency"], lat["time_to_first_token"]
        out = {f"e2e_{k}": e2e[q] * 1000 for k, q in (("mean", "mean"), ("p90", "p90"),
                                                      ("p99", "p99"))}
        out.update({f"ttft_{k}": ttft[q] * 1000 for k, q in (("mean", "mean"), ("p90", "p90"),
                                                             ("p99", "p99"))})
        out["itl_mean"] = itl_mean(e2e["mean"] * 1000, ttft["mean"] * 1000,
                                   ok["output_len"]["mean"])
    except (KeyError, TypeError) as exc:
        raise StudyError(f"{where}: not an inference-perf lifecycle report (missing {exc})"
                         ) from None
    return out


def _workload(name: str) -> str:
    for w in _WORKLOADS:
        if name.endswith(f"-{w}"):
            return w
    raise StudyError(f"{name}: the directory name ends in no known workload {_WORKLOADS}")


def extract_training(training: str | Path, out: str | Path | None = None
                     ) -> dict[str, Any]:
    """Write ``training.csv`` and ``training_measured.csv`` from inference-sim/training's
    ``default_args`` under ``training``; returns the paths and what was left out and why."""
    root = Path(training) / "default_args"
    if not root.is_dir():
        raise StudyError(f"{root}: no such directory (inference-sim/training's default_args)")
    target = Path(out) if out is not None else study_dir()
    study = load_measured(target if (target / "measured.csv").is_file() else None)
    whole = {(r["exp_id"], r["metric"]): r["actual_ms"]
             for r in study.filter(pl.col("stage_index") == -1).iter_rows(named=True)}
    study_ids = sorted({k[0] for k in whole})
    exps, measured, left_out = [], [], {}
    for i, run in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        cfg = _yaml(run / "exp-config.yaml")
        summary = _json(run / "results" / "summary_lifecycle_metrics.json")
        failed = int((summary.get("failures") or {}).get("count") or 0)
        if failed:
            left_out[run.name] = f"{failed} failed requests (overloaded)"
            continue
        metrics = {-1: run_metrics(summary, str(run))}
        same = [e for e in study_ids
                if all(whole.get((e, m)) == metrics[-1][m] for m in ("e2e_mean", "ttft_mean"))]
        if same:
            left_out[run.name] = f"study experiment {same[0]}"
            continue
        for stage_file in sorted((run / "results").glob("stage_*_lifecycle_metrics.json")):
            stage = int(stage_file.name.split("_")[1])
            metrics[stage] = run_metrics(_json(stage_file), str(stage_file))
        exp_id = FIRST_ID + i
        exps.append({"exp_id": exp_id, "folder": run.name, "hf_model": cfg["model"],
                     "workload": _workload(run.name), "hardware": "H100",
                     "tp": int(cfg["tensor_parallelism"]), "dp": 1,
                     "max_num_batched_tokens": int(cfg["max_num_batched_tokens"]),
                     # not in exp-config.yaml: vLLM's default, as in the study's runs
                     "gpu_memory_utilization": 0.9,
                     # the study's design document: 8 GiB CPU offload on every such run
                     "cpu_offload": True, "precision": "FP16"})
        for stage, values in sorted(metrics.items()):
            measured += [{"exp_id": exp_id, "stage_index": stage, "metric": m,
                          "actual_ms": values[m]} for m in METRICS]
    target.mkdir(parents=True, exist_ok=True)
    paths = {"training": target / "training.csv",
             "training_measured": target / "training_measured.csv"}
    pl.DataFrame(exps).write_csv(paths["training"], float_precision=None)
    pl.DataFrame(measured).sort("exp_id", "stage_index", "metric").write_csv(
        paths["training_measured"], float_precision=None)
    return {"paths": paths, "left_out": left_out}
