"""StepTime benchmark: µs per scalar call, before and after, in one run.

    python benchmarks/step_time.py [--repeat 15] [--aisim PYTHON]

Times are the thread's CPU time (``time.thread_time``), best of ``--repeat`` runs of ~20 ms:
on a machine shared with other work, wall time measures the neighbours as much as the code.

The headline is the DeepSeek-V3 32-request decode at context 4096 (issue 13, target 1):

* ``today`` is the figure recorded below, measured with this script's method on main at
  3d63a3b (before the scalar fast path and the self-checking Request);
* ``shared path`` is measured in this run: ``finish(compose(summarise(...)))``, the arithmetic
  every call ran before and the bulk path still runs; ``legacy Batch`` is main's Batch check
  (a Python loop over every field of every request), copied below;
* ``now`` is ``Kernel.step_time`` (and ``Batch`` + ``Kernel.step_time``) as shipped.

``--aisim PYTHON`` (or ``AISIM_PYTHON``) names the python of a separate venv with NVIDIA
AISimulate installed (``pip install aisimulate==0.13.0.dev202610270000000085``; never a
dependency of this project). Its per-call forward-pass estimate for the same case (DeepSeek-V3,
H200 SXM, tp 8 / ep 8, 32 decode requests of 4096 KV tokens) is timed in a subprocess the same
way, and the ratio printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import kernel
from kernel import step
from kernel.types import Batch, Request

# Recorded on main at 3d63a3b with this script's timer (thread CPU time, best of 15), 2 cores.
TODAY_US = {
    "step_time x32": 12.86,
    "Batch + step_time x32": 19.90,
    "step_time x1": 10.99,
    "step_time x256": 26.30,
}
TARGET = {"step_time x32": 0.25, "Batch + step_time x32": 0.35}

SCENARIOS = {
    "dense": "llama-3.1-8b-h100-tp1",
    "moe+mla": "deepseek-v3-h200-fp8-sglang-tp8",
    "hybrid": "nemotron3-ultra-h100-agg",
}
HEADLINE = "deepseek-v3-h200-fp8-sglang-tp8"

BATCHES = {
    "decode x1": [(1, 4095)],
    "decode x32": [(1, 4095)] * 32,
    "decode x256": [(1, 4095)] * 256,
    "mixed 31+1": [(1, 4095)] * 31 + [(512, 0)],
}


class _LegacyRequest(NamedTuple):
    scheduled: int
    computed: int
    prompt_len: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class _LegacyBatch:
    """main's Batch at 3d63a3b: every field of every request checked in a Python loop."""

    requests: tuple[Any, ...] = ()
    decode_threshold: int = 1
    sm_budget: int = 0

    def __init__(self, requests: Any = (), decode_threshold: int = 1, sm_budget: int = 0):
        reqs = tuple(r if isinstance(r, _LegacyRequest) else _LegacyRequest(*r)
                     for r in requests)
        for i, r in enumerate(reqs):
            for name in ("scheduled", "computed", "prompt_len", "cached_tokens"):
                v = getattr(r, name)
                if type(v) is not int or v < 0:
                    raise ValueError(f"requests[{i}].{name} must be a non-negative integer, "
                                     f"got {v!r}")
        if type(decode_threshold) is not int:
            raise ValueError(f"decode_threshold must be an integer, got {decode_threshold!r}")
        if type(sm_budget) is not int or sm_budget < 0:
            raise ValueError(f"sm_budget must be a non-negative integer, got {sm_budget!r}")
        object.__setattr__(self, "requests", reqs)
        object.__setattr__(self, "decode_threshold", decode_threshold)
        object.__setattr__(self, "sm_budget", sm_budget)


def per_call_us(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best µs per call of each function, the runs of all of them interleaved."""
    number = {}
    for name, fn in fns.items():
        fn()
        once = timeit.timeit(fn, number=3, timer=time.thread_time) / 3
        number[name] = max(1, int(0.02 / max(once, 1e-9)))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t = timeit.timeit(fn, number=number[name], timer=time.thread_time) / number[name]
            best[name] = min(best[name], t * 1e6)
    return best


AISIM_SNIPPET = r"""
import json, sys, time, timeit
from aisimulate_core.sdk.rust_engine_step import (ForwardPassPerfModelConfig,
                                                  RustForwardPassPerfModel)
cfg = ForwardPassPerfModelConfig(model="deepseek-ai/DeepSeek-V3", system="h200_sxm",
                                 backend="sglang", worker_type="decode", tp=8, moe_tp_size=1,
                                 moe_ep_size=8)
model = RustForwardPassPerfModel.best_available(cfg)
repeat = int(sys.argv[1])
def fpm(n, kv):
    return {"scheduled_requests": {"num_prefill_requests": 0, "sum_prefill_tokens": 0,
            "sum_prefill_kv_tokens": 0, "num_decode_requests": n, "sum_decode_kv_tokens": kv}}
built = fpm(32, 32 * 4096)
def best(fn):
    fn()
    n = max(1, int(0.02 / max(timeit.timeit(fn, number=3, timer=time.thread_time) / 3, 1e-9)))
    return min(timeit.timeit(fn, number=n, timer=time.thread_time) / n
               for _ in range(repeat)) * 1e6
out = {"estimate": best(lambda: model.estimate_forward_pass_time_ms(built)),
       "build + estimate": best(lambda: model.estimate_forward_pass_time_ms(fpm(32, 32 * 4096))),
       "ms": model.estimate_forward_pass_time_ms(built)}
print(json.dumps(out))
"""


def aisim(python: str, repeat: int) -> dict[str, float] | None:
    try:
        done = subprocess.run([python, "-c", AISIM_SNIPPET, str(repeat)], capture_output=True,
                              text=True, timeout=600, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        print(f"AISimulate: not run ({err.strip().splitlines()[-1] if err.strip() else exc})")
        return None
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--aisim", default=os.environ.get("AISIM_PYTHON"),
                    help="python of a venv with aisimulate installed (or AISIM_PYTHON)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; µs per call = best thread CPU time of {args.repeat} runs\n")

    k = kernel.open(HEADLINE)
    r = k.resolved_pool
    reqs32 = BATCHES["decode x32"]
    b32 = Batch([Request(1, 4095)] * 32, decode_threshold=8)
    times = per_call_us({
        "shared x32": lambda: step.finish(step.compose(r, step.summarise(r, b32)), {}),
        "step_time x32": lambda: k.step_time(b32),
        "legacy Batch + shared x32": lambda: step.finish(step.compose(r, step.summarise(
            r, _LegacyBatch([_LegacyRequest(1, 4095)] * 32, decode_threshold=8))), {}),  # type: ignore[arg-type]
        "Batch + step_time x32": lambda: k.step_time(
            Batch([Request(1, 4095)] * 32, decode_threshold=8)),
        "Batch of 32 tuples + step_time": lambda: k.step_time(Batch(reqs32, decode_threshold=8)),
        "legacy Batch of 32 tuples + shared": lambda: step.finish(step.compose(r, step.summarise(
            r, _LegacyBatch(reqs32, decode_threshold=8))), {}),  # type: ignore[arg-type]
    }, args.repeat)
    print(f"DeepSeek-V3 ({HEADLINE}), 32-request decode at context 4096:")
    print(f"  {'':<34} {'today':>8} {'this run':>9} {'now':>8} {'now/today':>10} "
          f"{'now/run':>8} {'target':>7}")
    for label, base in (("step_time x32", "shared x32"),
                        ("Batch + step_time x32", "legacy Batch + shared x32")):
        now, run, today = times[label], times[base], TODAY_US[label]
        print(f"  {label:<34} {today:8.2f} {run:9.2f} {now:8.2f} {now / today:10.3f} "
              f"{now / run:8.3f} {'≤ ' + str(TARGET[label]):>7}")
    tup, legacy = (times["Batch of 32 tuples + step_time"],
                   times["legacy Batch of 32 tuples + shared"])
    print(f"  {'Batch of 32 (s, c) tuples + step':<34} {'':8} {legacy:9.2f} {tup:8.2f} {'':10} "
          f"{tup / legacy:8.3f}")

    if args.aisim:
        ai = aisim(args.aisim, args.repeat)
        if ai is not None:
            print(f"\nAISimulate 0.13 (same case, its estimate {ai['ms']:.2f} ms): "
                  f"{ai['estimate']:.2f} µs per estimate, {ai['build + estimate']:.2f} µs "
                  f"building its input dict too")
            print(f"  step_time / AISimulate estimate: {times['step_time x32'] / ai['estimate']:.2f}"
                  f"; Batch + step_time / AISimulate build + estimate: "
                  f"{times['Batch + step_time x32'] / ai['build + estimate']:.2f}")
    else:
        print("\nAISimulate: not run (pass --aisim PYTHON or set AISIM_PYTHON)")

    print(f"\n{'pool':<48} {'batch':<12} {'shared µs':>10} {'step_time µs':>13} {'ratio':>6}")
    for kind, name in SCENARIOS.items():
        kk = k if name == HEADLINE else kernel.open(name)
        rr = kk.resolved_pool
        for bname, rows in BATCHES.items():
            b = Batch([Request(*x) for x in rows], decode_threshold=8)
            t = per_call_us({
                "shared": lambda rr=rr, b=b: step.finish(step.compose(rr, step.summarise(rr, b)),
                                                         {}),
                "now": lambda kk=kk, b=b: kk.step_time(b)}, args.repeat)
            print(f"{kind + ' (' + name + ')':<48} {bname:<12} {t['shared']:10.2f} "
                  f"{t['now']:13.2f} {t['now'] / t['shared']:6.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
