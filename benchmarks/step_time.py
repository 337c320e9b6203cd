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

Simulator loops (issue 31): ``--calls`` (100,000) calls over a trace of 10,000 distinct steps
from a seeded decode scheduler (batch sizes 1-64, contexts growing step by step, requests
joining and leaving), once all-decode and once with a 2,048-token prefill chunk in 10% of the
steps. Each call builds its input from that step's columns (numpy int64 arrays) and prices it:
``Kernel.step_time_arrays`` (columns checked and summed per call), ``Batch`` of request tuples
+ ``step_time`` (the path before issue 31), a :class:`kernel.StepBatch` kept in place
(``advance``, joins and leaves included in the time), and, with ``--aisim``, AISimulate's
estimate with its input dict built in the loop from the step's aggregates (counted before the
timing: AISimulate reads aggregates only, so its side of the loop does less). A mixed batch
(one 2,048-token chunk + 63 decodes) is timed against the decode fast path (32 and 64 decodes).

``--baseline DIR`` times the same loops and mixed batch on another checkout of this project
(for example ``git worktree add ../base main`` before a change), in a subprocess of this
script with ``DIR`` on the path, by public API only: old and new, with their ratios to the
same AISimulate figures, in one run.
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

import numpy as np

import kernel
from kernel import Batch, Request, StepBatch

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


AISIM_LOOP = r"""
import json, sys, time
from aisimulate_core.sdk.rust_engine_step import (ForwardPassPerfModelConfig,
                                                  RustForwardPassPerfModel)
cfg = ForwardPassPerfModelConfig(model="deepseek-ai/DeepSeek-V3", system="h200_sxm",
                                 backend="sglang", worker_type="decode", tp=8, moe_tp_size=1,
                                 moe_ep_size=8)
model = RustForwardPassPerfModel.best_available(cfg)
job = json.load(open(sys.argv[1]))
est = model.estimate_forward_pass_time_ms
out = {}
for name, steps in job["traces"].items():
    calls, m = job["calls"], len(steps)
    for npre, spre, skvpre, ndec, skvdec in steps:  # warm up on every step once, untimed
        est({"scheduled_requests": {"num_prefill_requests": npre,
             "sum_prefill_tokens": spre, "sum_prefill_kv_tokens": skvpre,
             "num_decode_requests": ndec, "sum_decode_kv_tokens": skvdec}})
    best = float("inf")
    for _ in range(job["repeat"]):
        t0 = time.thread_time()
        for i in range(calls):
            npre, spre, skvpre, ndec, skvdec = steps[i % m]
            est({"scheduled_requests": {"num_prefill_requests": npre,
                 "sum_prefill_tokens": spre, "sum_prefill_kv_tokens": skvpre,
                 "num_decode_requests": ndec, "sum_decode_kv_tokens": skvdec}})
        best = min(best, (time.thread_time() - t0) / calls * 1e6)
    out[name] = best
print(json.dumps(out))
"""


def aisim_loops(python: str, traces: dict[str, list[tuple[int, ...]]], calls: int,
                repeat: int) -> dict[str, float] | None:
    """AISimulate's µs per call over each trace's aggregates (its input built in the loop)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traces": traces, "calls": calls, "repeat": repeat}, f)
    try:
        done = subprocess.run([python, "-c", AISIM_LOOP, f.name], capture_output=True,
                              text=True, timeout=1800, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        print(f"AISimulate loops: not run ({err.strip().splitlines()[-1] if err.strip() else exc})")
        return None
    finally:
        os.unlink(f.name)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def scheduler_trace(n_steps: int, prefill_share: float, seed: int
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n_steps`` consecutive steps of a seeded decode scheduler: up to 64 running requests
    with contexts of 100-8,000 tokens, each step one token more; a request leaves with
    probability 1/300 per step and one joins with probability 1/5; in ``prefill_share`` of
    the steps a 2,048-token chunk of a new prompt is scheduled first."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(100, 8000, size=32).astype(np.int64)
    out = []
    for _ in range(n_steps):
        if len(ctx) and rng.random() < len(ctx) / 300:
            ctx = np.delete(ctx, rng.integers(len(ctx)))
        if len(ctx) < 64 and (rng.random() < 0.2 or not len(ctx)):
            ctx = np.append(ctx, rng.integers(100, 8000))
        s = np.ones(len(ctx), dtype=np.int64)
        c = ctx.copy()
        if rng.random() < prefill_share:
            s = np.concatenate(([2048], s)).astype(np.int64)
            c = np.concatenate(([int(rng.integers(0, 3)) * 2048], c)).astype(np.int64)
        out.append((s, c))
        ctx = ctx + 1
    return out


def aggregates(steps: list[tuple[np.ndarray, np.ndarray]], thr: int) -> list[tuple[int, ...]]:
    """AISimulate's input per step: prefill count, tokens and KV tokens; decode count and KV."""
    out = []
    for s, c in steps:
        pre = s > thr
        out.append((int(pre.sum()), int(s[pre].sum()), int((s + c)[pre].sum()),
                    int((~pre).sum()), int((s + c)[~pre].sum())))
    return out


def loop_us(fn: Callable[[int], object], calls: int, repeat: int) -> float:
    """Best µs per call of ``calls`` calls of ``fn(i)`` (thread CPU time), after one untimed
    pass over the first 10,000."""
    for i in range(min(calls, 10_000)):
        fn(i)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for i in range(calls):
            fn(i)
        best = min(best, (time.thread_time() - t0) / calls * 1e6)
    return best


def in_place_loop(k: kernel.Kernel, thr: int, prefill_share: float, calls: int
                  ) -> Callable[[int], object]:
    """One simulator step on a :class:`StepBatch` kept in place: price, advance, a request
    leaves with probability 1/300 per request, one joins with probability 1/5; in
    ``prefill_share`` of the steps a new prompt's 2,048-token chunk is scheduled, and
    becomes a decode after its step."""
    sb = StepBatch(decode_threshold=thr)
    rng = np.random.default_rng(3)
    sb.extend(np.ones(32, dtype=np.int64), rng.integers(100, 8000, size=32))
    u = rng.random((calls, 3)).tolist()
    starts = rng.integers(100, 8000, size=calls).tolist()

    def step_once(i: int) -> None:
        leave, join, chunk = u[i % calls]
        pos = sb.add(2048, 0) if chunk < prefill_share else -1
        sb.step_time(k)
        sb.advance()
        if pos >= 0:
            sb.set_scheduled(pos, 1)
        n = len(sb)
        if leave < n / 300 and n > 1:
            sb.remove(i % n)
        if (join < 0.2 and n < 64) or pos >= 0 and n > 64:
            sb.remove(0) if pos >= 0 and n > 64 else sb.add(1, starts[i % calls])

    return step_once


def simulator_loops(k: kernel.Kernel, calls: int, repeat: int, shared: bool = True
                    ) -> dict[str, dict[str, float]]:
    """The issue-31 loops (µs per call) and the mixed-batch comparison (µs), by public API
    only, so that ``--baseline`` can run them against another tree."""
    thr = 8
    traces = {"decode": scheduler_trace(10_000, 0.0, 1),
              "10% prefill": scheduler_trace(10_000, 0.1, 2)}
    arrays = k.step_time_arrays
    res: dict[str, dict[str, float]] = {}
    for name, steps in traces.items():
        m = len(steps)
        tuples = [list(zip(s.tolist(), c.tolist(), strict=True)) for s, c in steps]

        def columns(i: int, st: list[tuple[np.ndarray, np.ndarray]] = steps, m: int = m
                    ) -> object:
            s, c = st[i % m]  # one lookup per call, as AISimulate's loop unpacks its step
            return arrays(s, c, decode_threshold=thr)

        res[name] = {
            "step_time_arrays": loop_us(columns, calls, repeat),
            "Batch + step_time": loop_us(
                lambda i, tu=tuples, m=m: k.step_time(Batch(tu[i % m], decode_threshold=thr)),
                calls, repeat),
        }
    for name, share in (("decode", 0.0), ("10% prefill", 0.1)):
        res[name]["StepBatch in place"] = loop_us(in_place_loop(k, thr, share, calls), calls,
                                                  repeat)

    mixed = [(2048, 0)] + [(1, 4095 + i) for i in range(63)]
    cols = {
        "mixed 1+63": (np.array([q[0] for q in mixed]), np.array([q[1] for q in mixed])),
        "decode x64": (np.ones(64, dtype=np.int64), np.arange(4095, 4159, dtype=np.int64)),
        "decode x32": (np.ones(32, dtype=np.int64), np.arange(4095, 4127, dtype=np.int64)),
    }
    sbs = {}
    for n, (sc, cc) in cols.items():
        sbs[n] = StepBatch(decode_threshold=thr)
        sbs[n].extend(sc, cc)
    bm = Batch(mixed, decode_threshold=thr)
    b64 = Batch([(1, 4095 + i) for i in range(64)], decode_threshold=thr)
    b32 = Batch([(1, 4095 + i) for i in range(32)], decode_threshold=thr)
    fns: dict[str, Callable[[], object]] = {
        **{f"arrays {n}": (lambda sc=sc: arrays(sc[0], sc[1], decode_threshold=thr))
           for n, sc in cols.items()},
        **{f"StepBatch {n}": (lambda b=b: b.step_time(k)) for n, b in sbs.items()},
        "step_time mixed 1+63": lambda: k.step_time(bm),
        "step_time decode x64": lambda: k.step_time(b64),
        "step_time decode x32": lambda: k.step_time(b32),
    }
    if shared:
        from kernel.model import step

        fns["shared mixed 1+63"] = lambda: step.finish(step.compose(
            k.resolved_pool, step.summarise(k.resolved_pool, bm)), {})
    res["mixed"] = per_call_us(fns, repeat)
    return res


def print_loops(res: dict[str, dict[str, float]], ai: dict[str, float] | None, calls: int,
                repeat: int, old: dict[str, dict[str, float]] | None = None) -> None:
    """The loops' table (µs per call, ÷ AISimulate; with ``old``: the baseline's too, and
    new ÷ old), then the mixed batch against the decode fast path."""
    print(f"\nSimulator loops: {calls:,} calls over 10,000 distinct steps (1-64 requests, "
          f"DeepSeek-V3), µs per call, best of {repeat}")
    head = f"  {'trace':<13} {'loop':<22}"
    if old:
        head += f" {'old µs':>8} {'÷ AISim':>8}"
    print(head + f" {'µs/call':>8} {'÷ AISimulate':>13} {'target':>7}"
          + (f" {'new÷old':>8}" if old else ""))
    for name in ("decode", "10% prefill"):
        for label, us in res[name].items():
            line = f"  {name:<13} {label:<22}"
            if old:
                was = old[name][label]
                line += f" {was:8.2f} " + (f"{was / ai[name]:8.2f}" if ai else f"{'-':>8}")
            ratio = f"{us / ai[name]:13.2f}" if ai else f"{'-':>13}"
            target = "≤ 0.5" if label != "Batch + step_time" else ""
            line += f" {us:8.2f} {ratio} {target:>7}"
            if old:
                line += f" {us / old[name][label]:8.2f}"
            print(line)
        if ai:
            print(f"  {name:<13} {'AISimulate (dict+est)':<22}"
                  + (f" {'':8} {'':8}" if old else "") + f" {ai[name]:8.2f}")

    print("\nMixed batch (one 2,048-token chunk + 63 decodes) vs the decode fast path, µs")
    print(f"  {'input':<12} {'mixed':>7} {'dec x64':>8} {'dec x32':>8} {'÷ x64':>6} {'÷ x32':>6} "
          f"{'target':>7}" + (f" {'old ÷ x64':>10} {'old ÷ x32':>10}" if old else ""))
    for label, key in (("columns", "arrays"), ("StepBatch", "StepBatch"),
                       ("Batch", "step_time")):
        t = res["mixed"]
        mx, d64, d32 = (t[f"{key} mixed 1+63"], t[f"{key} decode x64"],
                        t[f"{key} decode x32"])
        line = (f"  {label:<12} {mx:7.2f} {d64:8.2f} {d32:8.2f} {mx / d64:6.2f} {mx / d32:6.2f} "
                f"{'≤ 2':>7}")
        if old:
            o = old["mixed"]
            omx = o[f"{key} mixed 1+63"]
            line += (f" {omx / o[f'{key} decode x64']:10.2f}"
                     f" {omx / o[f'{key} decode x32']:10.2f}")
        print(line)
    if "shared mixed 1+63" in res["mixed"]:
        print(f"  shared path (compose) for the mixed batch: "
              f"{res['mixed']['shared mixed 1+63']:.2f} µs")


def baseline_loops(tree: str, calls: int, repeat: int) -> dict[str, dict[str, float]] | None:
    """:func:`simulator_loops` of another checkout of this project (``--baseline DIR``: the
    code before a change), run by this script in a subprocess with ``DIR`` on the path."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--emit-json",
                               "--calls", str(calls), "--repeat", str(repeat * 3)],
                              capture_output=True, text=True, timeout=3600, check=True,
                              env=env, cwd=tree)
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        print(f"baseline: not run ({err.strip().splitlines()[-1] if err.strip() else exc})")
        return None
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


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
    ap.add_argument("--calls", type=int, default=100_000,
                    help="calls per simulator loop (issue 31)")
    ap.add_argument("--loops-only", action="store_true",
                    help="only the simulator loops and the mixed-batch comparison")
    ap.add_argument("--baseline", metavar="DIR",
                    help="another checkout of this project (e.g. main before a change): its "
                         "simulator loops are timed too, in a subprocess, for old vs new")
    ap.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    k = kernel.open(HEADLINE)
    loop_repeat = max(1, args.repeat // 3)
    if args.emit_json:  # (a --baseline subprocess)
        print(json.dumps(simulator_loops(k, args.calls, loop_repeat, shared=False)))
        return
    print(f"{os.cpu_count()} cores; µs per call = best thread CPU time of {args.repeat} runs; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    old = baseline_loops(args.baseline, args.calls, loop_repeat) if args.baseline else None
    res = simulator_loops(k, args.calls, loop_repeat)
    ai = None
    if args.aisim:
        traces = {"decode": scheduler_trace(10_000, 0.0, 1),
                  "10% prefill": scheduler_trace(10_000, 0.1, 2)}
        ai = aisim_loops(args.aisim, {n: aggregates(st, 8) for n, st in traces.items()},
                         args.calls, loop_repeat)
    print_loops(res, ai, args.calls, loop_repeat, old)
    print(f"  (load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    if args.loops_only:
        return
    from kernel.model import step

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
