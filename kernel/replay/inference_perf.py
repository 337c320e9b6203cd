"""inference-perf configs as load specs: the workloads of the sim-to-real runs.

inference-perf (github.com/kubernetes-sigs/inference-perf) drives a server in load stages; each
stage sends ``int(rate * duration)`` requests. Its ``constant`` load draws that many exponential
gaps and scales them to end exactly at the stage's end (``loadgen/load_timer.py``,
ConstantLoadTimer): our ``normalized_exponential`` arrivals. Its ``poisson`` load draws a
Poisson count per second: a Poisson process, our ``poisson``. Stages run one after another,
``load.interval`` + 1 s apart (the drain of a stage's last requests is not modelled, RQ8).

``data.type: shared_prefix`` pre-generates ``num_groups`` random system prompts of
``system_prompt_len`` tokens, each with ``num_prompts_per_group`` random questions of
``question_len`` tokens, shuffles the ``num_groups * num_prompts_per_group`` prompts once and
sends request ``i`` of a stage the prompt ``i mod`` their count
(``datagen/shared_prefix_datagen.py``); ``output_len`` is the requested ``max_tokens``, all of
which are generated when ``server.ignore_eos`` is true (the sim-to-real runs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernel.io.synth import Lengths

from .loads import LoadSpec, SharedPrefix, Stage
from .yamlfile import load_yaml

__all__ = ["inference_perf_spec"]

_SHARED_KEYS = {"num_groups", "num_prompts_per_group", "system_prompt_len", "question_len",
                "output_len"}
# Keys of later inference-perf versions: spreads of lengths and multi-turn chat. A zero/false
# value means the fixed behaviour above; anything else is refused rather than approximated.
_SPREAD_KEYS = {"question_len_std", "output_len_std", "question_len_min", "question_len_max",
                "output_len_min", "output_len_max", "enable_multi_turn_chat"}
_LEAD_S = 1.0  # load_generator.py run_stage: request times start 1 s after a stage starts
# inference-sim's compact profile keys, which inference-perf itself does not read.
_BLIS_PROFILE_KEYS = {"num_unique_system_prompts", "num_users_per_system_prompt"}


def inference_perf_spec(config: str | Path | Mapping[str, Any], *,
                        hash_block_tokens: int = 16) -> LoadSpec:
    """The :class:`LoadSpec` of an inference-perf config (a mapping, a YAML/JSON file, or an
    experiment directory holding ``results/config.yaml``, the config inference-perf ran)."""
    doc, where = _load(config)
    load = doc.get("load")
    if not isinstance(load, Mapping):
        raise ValueError(f"{where}: no load section")
    kind = str(load.get("type", "constant"))
    arrival = {"constant": "normalized_exponential", "poisson": "poisson"}.get(kind)
    if arrival is None:
        raise ValueError(f"{where}: load.type {kind!r} is not an open-loop rate; supported: "
                         "constant, poisson")
    if load.get("sweep"):
        raise ValueError(f"{where}: load.sweep picks its stages at run time from the server; "
                         "give the stages it ran as load.stages")
    raw = load.get("stages")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: load.stages must be a non-empty list of {{rate, duration}}")
    stages = []
    for i, s in enumerate(raw):
        if not isinstance(s, Mapping) or "rate" not in s or "duration" not in s:
            raise ValueError(f"{where}: load.stages[{i}] needs rate and duration, not {s!r}")
        try:
            stages.append(Stage(float(s["rate"]), float(s["duration"])))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: load.stages[{i}]: {e}") from None
    # Between stages inference-perf waits for the stage's requests to finish (not modelled),
    # sleeps load.interval, and schedules the next stage's requests from 1 s after its start.
    gap = float(load.get("interval") or 0.0) + _LEAD_S if len(stages) > 1 else 0.0
    data = doc.get("data")
    if not isinstance(data, Mapping) or data.get("type") != "shared_prefix":
        dtype = data.get("type") if isinstance(data, Mapping) else None
        raise ValueError(f"{where}: data.type {dtype!r}: only shared_prefix is translated (the "
                         "sim-to-real workloads); its prompts are random tokens of set lengths")
    sp = data.get("shared_prefix")
    if not isinstance(sp, Mapping):
        raise ValueError(f"{where}: data.shared_prefix is missing")
    shared = _shared(sp, where)
    server = doc.get("server")
    if isinstance(server, Mapping) and server.get("ignore_eos") is False:
        raise ValueError(f"{where}: server.ignore_eos is false: the outputs stop at the model's "
                         "EOS, so output_len is only a maximum and the lengths are unknown")
    output = Lengths.parse(f"fixed:{int(sp['output_len'])}")
    return LoadSpec(stages=tuple(stages), arrival=arrival, output=output, shared_prefix=shared,
                    stage_gap_s=gap, hash_block_tokens=hash_block_tokens,
                    source=f"inference-perf config {where}")


def _load(config: str | Path | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(config, Mapping):
        return config, "(mapping)"
    path = Path(config)
    if path.is_dir():
        resolved = path / "results" / "config.yaml"
        if not resolved.exists():
            raise ValueError(f"{path}: an experiment directory needs results/config.yaml (the "
                             "config inference-perf resolved and ran)")
        path = resolved
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"{path}: not a readable JSON inference-perf config: {e}") from None
    else:
        doc = load_yaml(path)  # JSON is YAML too (profile.yaml is one JSON line)
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: an inference-perf config is a mapping")
    return doc, str(path)


def _shared(sp: Mapping[str, Any], where: str) -> SharedPrefix:
    blis = sorted(_BLIS_PROFILE_KEYS & set(sp))
    if blis and not {"num_groups", "num_prompts_per_group"} & set(sp):
        raise ValueError(
            f"{where}: shared_prefix has {', '.join(blis)}: inference-sim's profile keys, which "
            "inference-perf does not read (the runs' results/config.yaml shows the defaults "
            "num_groups: 10, num_prompts_per_group: 10 it used); pass results/config.yaml or "
            "the experiment directory")
    missing = sorted(_SHARED_KEYS - set(sp))
    if missing:
        raise ValueError(f"{where}: data.shared_prefix needs {', '.join(missing)}")
    for key in sorted(_SPREAD_KEYS & set(sp)):
        if sp[key] not in (None, 0, False):
            raise ValueError(f"{where}: data.shared_prefix.{key} = {sp[key]!r} is not "
                             "translated (only fixed lengths, single turn)")
    extra = sorted(set(sp) - _SHARED_KEYS - _SPREAD_KEYS - _BLIS_PROFILE_KEYS)
    if extra:
        raise ValueError(f"{where}: data.shared_prefix has unknown key(s) {', '.join(extra)}")
    try:
        ints = {k: int(sp[k]) for k in _SHARED_KEYS}
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: data.shared_prefix: {e}") from None
    if ints["output_len"] < 1:
        raise ValueError(f"{where}: data.shared_prefix.output_len must be >= 1")
    return SharedPrefix(ints["num_groups"], ints["num_prompts_per_group"],
                        ints["system_prompt_len"],
                        Lengths.parse(f"fixed:{ints['question_len']}", lo=0))
