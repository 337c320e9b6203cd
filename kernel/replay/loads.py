"""Load specs: a workload described instead of recorded, generated into a RequestSet.

A :class:`LoadSpec` is either

* **open loop**: arrivals at a rate, as stages of ``(rate, duration)`` run one after the other;
  the process is ``poisson`` (exponential gaps), ``gamma`` (gaps with coefficient of variation
  ``cv``), ``constant`` (gaps of exactly 1/rate) or ``normalized_exponential`` (inference-perf's
  "constant" load: ``int(rate * duration)`` exponential gaps scaled to end exactly at the
  stage's end); or
* **closed loop**: ``users`` sessions, each a chain of ``requests_per_user`` requests where a
  request is sent ``think`` ms after the previous one of its user finishes (expressed by
  ``session_id`` + ``think_ns``, as the replay contract says; the engine resolves the arrivals).

Lengths use the synth grammar (:class:`kernel.io.synth.Lengths`: ``fixed:N``, ``uniform:LO:HI``,
``lognormal:MEAN:SIGMA``, ``exponential:MEAN``). With ``shared_prefix`` every prompt is one of
``groups x prompts_per_group`` distinct prompts: a group's system prompt of ``system_tokens``
tokens followed by that prompt's question; block hashes of ``hash_block_tokens`` tokens say
which blocks are shared (the system prompt's whole blocks within a group, every block between
two sends of the same prompt).

The same spec and seed give the same RequestSet, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kernel.io.synth import Lengths

from .hashes import chain, list_array, mix, take_lists
from .requests import Columns, RejectLog, RequestSet, assemble
from .yamlfile import load_yaml

__all__ = ["ARRIVALS", "LoadSpec", "SharedPrefix", "Stage", "generate", "parse_load"]

ARRIVALS = ("poisson", "gamma", "constant", "normalized_exponential")
MAX_GENERATED = 50_000_000  # requests one spec may generate (memory guard)
_NS = 1_000_000_000


@dataclass(frozen=True)
class Stage:
    """``rate`` requests per second for ``duration_s`` seconds."""

    rate: float
    duration_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"stage rate must be a finite number > 0, not {self.rate}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"stage duration must be a finite number of seconds > 0, not "
                             f"{self.duration_s}")


@dataclass(frozen=True)
class SharedPrefix:
    """``groups`` system prompts of ``system_tokens`` tokens, each followed by one of
    ``prompts_per_group`` questions whose lengths are drawn once from ``question``."""

    groups: int
    prompts_per_group: int
    system_tokens: int
    question: Lengths
    order: str = "cycle"  # "cycle": request i sends prompt i mod G*P of a shuffled list

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group"):
            if getattr(self, name) < 1:
                raise ValueError(f"shared_prefix.{name} must be >= 1, not "
                                 f"{getattr(self, name)}")
        if self.system_tokens < 0:
            raise ValueError(f"shared_prefix.system_tokens must be >= 0, not "
                             f"{self.system_tokens}")
        if self.order not in ("cycle", "random"):
            raise ValueError(f"shared_prefix.order must be 'cycle' or 'random', not "
                             f"{self.order!r}")


@dataclass(frozen=True)
class LoadSpec:
    """A workload to generate (module docstring). Open loop unless ``users`` is set."""

    stages: tuple[Stage, ...] = ()
    arrival: str = "poisson"
    cv: float = 1.0
    prompt: Lengths = field(default_factory=lambda: Lengths.parse("fixed:512"))
    output: Lengths = field(default_factory=lambda: Lengths.parse("fixed:128"))
    shared_prefix: SharedPrefix | None = None
    users: int | None = None
    requests_per_user: int = 1
    think: Lengths | None = None  # ms between a user's requests (closed loop)
    ramp_s: float = 0.0  # closed loop: user u starts at u * ramp_s / users
    stage_gap_s: float = 0.0  # idle time between stages
    max_requests: int | None = None
    hash_block_tokens: int = 16
    source: str = ""  # where the spec came from, for the RequestSet's source

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, not "
                             f"{self.arrival!r}")
        if not (math.isfinite(self.cv) and self.cv > 0):
            raise ValueError(f"cv must be > 0, not {self.cv}")
        if self.users is None and not self.stages:
            raise ValueError("an open-loop load needs a rate and duration, or stages")
        if self.users is not None and self.users < 1:
            raise ValueError(f"users must be >= 1, not {self.users}")
        if self.requests_per_user < 1:
            raise ValueError(f"requests_per_user must be >= 1, not {self.requests_per_user}")
        if self.hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, not {self.hash_block_tokens}")
        if self.max_requests is not None and self.max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, not {self.max_requests}")
        if self.users is not None and (self.stages or self.max_requests is not None):
            raise ValueError("a closed loop (users) has no stages, rate or max_requests: it "
                             "sends users x requests_per_user requests")
        if self.stage_gap_s < 0 or self.ramp_s < 0:
            raise ValueError("stage_gap_s and ramp_s must be >= 0")

    def scaled(self, factor: float) -> LoadSpec:
        """The same load with every stage's rate multiplied by ``factor`` (durations kept):
        the knob of a latency-throughput sweep."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"a rate factor must be a finite number > 0, not {factor}")
        if self.closed_loop:
            raise ValueError("a closed loop has no rate to scale: change users or think")
        stages = tuple(Stage(s.rate * factor, s.duration_s) for s in self.stages)
        label = f"{self.describe()} x{factor:g} rate"
        return replace(self, stages=stages, source=label)

    @property
    def closed_loop(self) -> bool:
        return self.users is not None

    def describe(self) -> str:
        if self.source:
            return self.source
        if self.closed_loop:
            what = f"closed loop: {self.users} users x {self.requests_per_user} requests"
        else:
            what = f"{self.arrival} arrivals, stages " + ", ".join(
                f"{s.rate:g}/s x {s.duration_s:g} s" for s in self.stages)
        return f"load spec ({what})"


# ------------------------------------------------------------------------------------ parsing

_KEYS = ("arrival", "cv", "rate", "duration", "stages", "prompt", "output", "shared_prefix",
         "users", "requests_per_user", "think", "ramp", "stage_gap", "max_requests",
         "hash_block_tokens")
_SHARED_KEYS = ("groups", "prompts_per_group", "system_tokens", "question", "order")
_COMPACT_SHARED = {"groups": "groups", "prompts_per_group": "prompts_per_group",
                   "system": "system_tokens", "question": "question", "order": "order"}


def parse_load(spec: LoadSpec | Mapping[str, Any] | str | Path) -> LoadSpec:
    """A :class:`LoadSpec` from a mapping, a YAML file, or a compact string.

    Compact: comma-separated ``key=value``, e.g.
    ``arrival=gamma,cv=2,rate=8,duration=60,prompt=lognormal:1024:1,output=fixed:128``;
    stages as ``stages=5x600+10x600`` (rate x seconds); shared prefix as
    ``groups=10,prompts_per_group=10,system=100,question=fixed:466``; closed loop as
    ``users=32,requests_per_user=20,think=exponential:500``.
    """
    if isinstance(spec, LoadSpec):
        return spec
    if isinstance(spec, Path) or (isinstance(spec, str) and "=" not in spec):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"load spec {spec!r}: neither key=value pairs nor a YAML file")
        doc = load_yaml(path)
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: a load spec is a mapping of {', '.join(_KEYS)}")
        return _from_mapping(doc, str(path))
    if isinstance(spec, str):
        return _from_mapping(_compact(spec), spec)
    if isinstance(spec, Mapping):
        return _from_mapping(spec, "")
    raise TypeError(f"cannot read a load spec from a {type(spec).__name__}")


def _compact(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"load spec {text!r}: {part!r} is not key=value")
        if key in _COMPACT_SHARED:
            shared[_COMPACT_SHARED[key]] = value
        elif key == "stages":
            out[key] = [_compact_stage(s, text) for s in value.split("+")]
        else:
            out[key] = value
    if shared:
        out["shared_prefix"] = shared
    return out


def _compact_stage(text: str, whole: str) -> dict[str, str]:
    rate, sep, duration = text.partition("x")
    if not sep:
        raise ValueError(f"load spec {whole!r}: stage {text!r} is not RATExSECONDS (e.g. 5x600)")
    return {"rate": rate, "duration": duration}


def _num(value: Any, key: str, where: str, kind: type = float) -> Any:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"load spec{where}: {key} must be a number, not {value!r}") from None
    if kind is int:
        if not x.is_integer():
            raise ValueError(f"load spec{where}: {key} must be an integer, not {value!r}")
        return int(x)
    return x


def _lengths(value: Any, key: str, where: str, lo: int = 1) -> Lengths:
    text = f"fixed:{int(value)}" if isinstance(value, (int, float)) and \
        not isinstance(value, bool) else str(value)
    try:
        return Lengths.parse(text, lo=lo)
    except ValueError as e:
        raise ValueError(f"load spec{where}: {key}: {e}") from None


def _from_mapping(doc: Mapping[str, Any], source: str) -> LoadSpec:
    where = f" {source!r}" if source else ""
    unknown = sorted(set(doc) - set(_KEYS))
    if unknown:
        raise ValueError(f"load spec{where}: unknown key(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(_KEYS)}")
    stages: list[Stage] = []
    if "stages" in doc:
        if "rate" in doc or "duration" in doc:
            raise ValueError(f"load spec{where}: give stages or rate+duration, not both")
        raw = doc["stages"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"load spec{where}: stages is a non-empty list of "
                             "{rate, duration}")
        for i, s in enumerate(raw):
            if not isinstance(s, Mapping) or set(s) != {"rate", "duration"}:
                raise ValueError(f"load spec{where}: stages[{i}] must have exactly rate and "
                                 f"duration, not {s!r}")
            stages.append(_stage(s["rate"], s["duration"], f"stages[{i}]", where))
    elif "rate" in doc or "duration" in doc:
        if "rate" not in doc or "duration" not in doc:
            raise ValueError(f"load spec{where}: rate and duration go together")
        stages.append(_stage(doc["rate"], doc["duration"], "rate/duration", where))
    kwargs: dict[str, Any] = {"stages": tuple(stages), "source": source}
    if "arrival" in doc:
        kwargs["arrival"] = str(doc["arrival"])
    if "cv" in doc:
        kwargs["cv"] = _num(doc["cv"], "cv", where)
    for key in ("prompt", "output"):
        if key in doc:
            kwargs[key] = _lengths(doc[key], key, where)
    if "think" in doc:
        kwargs["think"] = _lengths(doc["think"], "think", where, lo=0)
    for key in ("users", "requests_per_user", "max_requests", "hash_block_tokens"):
        if key in doc:
            kwargs[key] = _num(doc[key], key, where, int)
    if "ramp" in doc:
        kwargs["ramp_s"] = _num(doc["ramp"], "ramp", where)
    if "stage_gap" in doc:
        kwargs["stage_gap_s"] = _num(doc["stage_gap"], "stage_gap", where)
    if "shared_prefix" in doc:
        if "prompt" in doc:
            raise ValueError(f"load spec{where}: with shared_prefix a prompt is system_tokens + "
                             "a question; give question lengths, not prompt")
        kwargs["shared_prefix"] = _shared(doc["shared_prefix"], where)
    try:
        return LoadSpec(**kwargs)
    except ValueError as e:
        raise ValueError(f"load spec{where}: {e}") from None


def _stage(rate: Any, duration: Any, key: str, where: str) -> Stage:
    try:
        return Stage(_num(rate, f"{key}.rate", where), _num(duration, f"{key}.duration", where))
    except ValueError as e:
        raise ValueError(f"load spec{where}: {key}: {e}") from None


def _shared(doc: Any, where: str) -> SharedPrefix:
    if not isinstance(doc, Mapping):
        raise ValueError(f"load spec{where}: shared_prefix is a mapping of "
                         f"{', '.join(_SHARED_KEYS)}")
    unknown = sorted(set(doc) - set(_SHARED_KEYS))
    missing = [k for k in _SHARED_KEYS[:4] if k not in doc]
    if unknown or missing:
        raise ValueError(f"load spec{where}: shared_prefix needs {', '.join(_SHARED_KEYS[:4])} "
                         f"(optional order); unknown {unknown}, missing {missing}")
    try:
        return SharedPrefix(_num(doc["groups"], "groups", where, int),
                            _num(doc["prompts_per_group"], "prompts_per_group", where, int),
                            _num(doc["system_tokens"], "system_tokens", where, int),
                            _lengths(doc["question"], "question", where, lo=0),
                            str(doc.get("order", "cycle")))
    except ValueError as e:
        raise ValueError(f"load spec{where}: {e}") from None


# --------------------------------------------------------------------------------- generation

def generate(spec: LoadSpec | Mapping[str, Any] | str | Path, *, seed: int = 0,
             max_model_len: int | None = None, on_reject: str = "collect") -> RequestSet:
    """Generate the requests of ``spec`` (a :class:`LoadSpec` or anything :func:`parse_load`
    reads). ``max_model_len`` rejects longer prompts, as :func:`read_requests` does."""
    spec = parse_load(spec)
    rng = np.random.default_rng(seed)
    if spec.closed_loop:
        cols = _closed_loop(spec, rng)
    else:
        cols = _open_loop(spec, rng)
    n = cols.row.size
    hashes = None
    if spec.shared_prefix is not None:
        cols.prompt, cols.output, hashes = _shared_prompts(spec, cols.stage, rng, n)
    else:
        cols.prompt = spec.prompt.sample(rng, n)
        cols.output = spec.output.sample(rng, n)
    cols.prefix_hashes = hashes
    return assemble(cols, RejectLog(), rows_in=n, source=spec.describe(),
                    hash_block_tokens=spec.hash_block_tokens if hashes is not None else None,
                    max_model_len=max_model_len, on_reject=on_reject)


def _open_loop(spec: LoadSpec, rng: np.random.Generator) -> Columns:
    times: list[np.ndarray] = []
    stages: list[np.ndarray] = []
    start = 0.0
    for k, st in enumerate(spec.stages):
        t = start + _arrivals(spec.arrival, st.rate, st.duration_s, spec.cv, rng)
        times.append(t)
        stages.append(np.full(t.size, k, dtype=np.int32))
        start += st.duration_s + spec.stage_gap_s
    t = np.concatenate(times) if times else np.zeros(0)
    stage = np.concatenate(stages) if stages else np.zeros(0, np.int32)
    if spec.max_requests is not None:
        t, stage = t[: spec.max_requests], stage[: spec.max_requests]
    n = t.size
    arrival = np.floor(t * _NS).astype(np.int64)  # durations in ns are truncated
    return Columns(np.arange(n, dtype=np.int64), arrival, np.ones(n, dtype=bool),
                   np.zeros(n, np.int64), np.zeros(n, np.int64), stage=stage)


def _arrivals(kind: str, rate: float, duration: float, cv: float,
              rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration) seconds (normalized_exponential: in (0, duration])."""
    mean = rate * duration
    if mean > MAX_GENERATED:
        raise ValueError(f"a stage of {rate:g}/s for {duration:g} s is ~{mean:,.0f} requests; "
                         f"at most {MAX_GENERATED:,} per spec")
    if kind == "constant":
        n = math.ceil(mean - 1e-9)
        return np.arange(n, dtype=np.float64) / rate
    if kind == "normalized_exponential":
        n = int(mean)
        t = np.cumsum(rng.exponential(1.0, n))
        return t / t[-1] * duration if n else np.zeros(0)  # the last lands on the end exactly
    out: list[np.ndarray] = []
    t0 = 0.0
    while True:
        k = int(mean + 6 * math.sqrt(mean * max(cv * cv, 1.0)) + 16)
        if kind == "poisson":
            gaps = rng.exponential(1.0 / rate, k)
        else:  # gamma gaps: shape 1/cv^2, mean 1/rate
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / (rate * shape), k)
        t = t0 + np.cumsum(gaps)
        out.append(t[t < duration])
        if t[-1] >= duration:
            break
        t0 = float(t[-1])
    # a renewal process started at time 0: the first arrival is one gap after 0
    return np.concatenate(out)


def _closed_loop(spec: LoadSpec, rng: np.random.Generator) -> Columns:
    users = int(spec.users or 0)
    per = spec.requests_per_user
    n = users * per
    if n > MAX_GENERATED:
        raise ValueError(f"{users} users x {per} requests is {n:,}; at most {MAX_GENERATED:,}")
    user = np.repeat(np.arange(users, dtype=np.int64), per)
    round_ = np.tile(np.arange(per, dtype=np.int64), users)
    first = round_ == 0
    start = np.floor(np.arange(users) * (spec.ramp_s / users) * _NS).astype(np.int64)
    arrival = np.where(first, start[user], 0)
    think_ms = spec.think.sample(rng, n) if spec.think is not None else np.zeros(n, np.int64)
    think = np.where(first, 0, think_ms * 1_000_000)
    session = pa.array([f"user-{u}" for u in user.tolist()], pa.string())
    return Columns(np.arange(n, dtype=np.int64), arrival, first.copy(), np.zeros(n, np.int64),
                   np.zeros(n, np.int64), session_id=session, think_ns=think,
                   think_ok=~first, stage=np.zeros(n, np.int32))


def _shared_prompts(spec: LoadSpec, stage: np.ndarray | None, rng: np.random.Generator,
                    n: int) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Prompt and output lengths and block hashes of requests drawn from the shared prompts.

    Each of the G*P prompts has its question length and output length drawn once, like
    inference-perf's pre-generated prompts. ``cycle`` sends them in one shuffled order, the
    request counter restarting at every stage (inference-perf numbers requests per stage).
    """
    sp = spec.shared_prefix
    assert sp is not None
    total = sp.groups * sp.prompts_per_group
    q_len = sp.question.sample(rng, total)
    o_len = spec.output.sample(rng, total)
    if sp.order == "cycle":
        perm = rng.permutation(total)
        stage = stage if stage is not None else np.zeros(n, np.int32)
        # index of each request within its stage (stages are contiguous, in order)
        starts = np.r_[0, np.flatnonzero(np.diff(stage)) + 1] if n else np.zeros(0, np.int64)
        within = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        which = perm[within % total]
    else:
        which = rng.integers(0, total, n)
    ids = np.arange(total)
    lengths = sp.system_tokens + q_len
    # hash each distinct prompt once, then give every request its prompt's list
    per_prompt = _prompt_hashes(ids, ids // sp.prompts_per_group, lengths, sp.system_tokens,
                                spec.hash_block_tokens)
    prompt = lengths[which]
    output = np.maximum(o_len[which], 1)
    return prompt.astype(np.int64), output.astype(np.int64), take_lists(per_prompt, which)


def _prompt_hashes(which: np.ndarray, group: np.ndarray, prompt: np.ndarray, system: int,
                   block: int) -> pa.Array:
    """Whole blocks inside the system prompt are the group's; later ones the prompt's own."""
    nblocks = prompt // block
    offsets = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int64)
    parent = np.repeat(np.arange(which.size), nblocks)
    pos = (np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][parent]).astype(np.uint64)
    in_system = (pos.astype(np.int64) + 1) * block <= system
    owner = np.where(in_system, group[parent].astype(np.uint64) * np.uint64(2),
                     which[parent].astype(np.uint64) * np.uint64(2) + np.uint64(1))
    with np.errstate(over="ignore"):
        ids = mix(mix(owner) ^ pos)
    return list_array(offsets, chain(offsets, ids))
