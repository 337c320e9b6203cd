"""The serving replay's bookkeeping per step, by the step's shape (decision MX1).

Wraps the engine's step methods in this process (a measuring harness, never used by the
library) and times each step, pricing subtracted: the steady one-piece step (EF5), else the
general path by what its schedule did (was the core steady before; did phase B admit, find
the head blocked, or not run; were all rows scheduled whole). The wrappers add a few
microseconds a step, so compare shapes within one run. One warm-up replay first (numba's
compilation, first-use caches), untimed.

    python benchmarks/replay_shapes.py --scenario llama-3.1-8b-h100-tp1 \\
        --trace ../shared/reference/request-traces/mooncake-fast25/conversation_trace.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import replay as bench  # noqa: E402 (this folder's benchmark: its run() and warm-up)

import kernel.replay.api as api  # noqa: E402
from kernel.replay import engine, read_requests  # type: ignore[attr-defined]  # noqa: E402


def measure(scenario: str, path: str) -> tuple[dict[str, list[float]], dict[str, float]]:
    rs = read_requests(path)
    bench.run(scenario, rs.table.num_rows, 50, True, source=rs)  # warm-up
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # seconds, steps, pricing
    cur: dict[str, Any] = {}
    sim = engine.Simulation
    step, steady, phase_b, schedule = sim._step, sim._step_steady, sim._phase_b, sim._schedule
    price = api.price_step

    def w_steady(self: Any, *a: Any) -> bool:
        cur["steady"] = took = steady(self, *a)
        return took

    def w_phase_b(self: Any, *a: Any) -> Any:
        out = phase_b(self, *a)
        cur["b"] = "admits" if out[0].size else "blocked"
        return out

    def w_schedule(self: Any, c: Any, *a: Any) -> Any:
        cur.setdefault("before", "steady before" if c.steady and not c.dirty else "not steady")
        plan = schedule(self, c, *a)
        if plan[0].size:
            cur["whole"] = bool((plan[5] == plan[6]).all())
        return plan

    def w_step(self: Any, *a: Any) -> None:
        cur.clear()
        cur["price"] = 0.0
        t = time.perf_counter()
        step(self, *a)
        spent = time.perf_counter() - t
        if cur.get("steady"):
            shape = "steady path (EF5)"
        else:
            whole = "all whole" if cur.get("whole") else "a partial row"
            shape = f"{cur.get('before')}, {cur.get('b', 'no phase B')}, {whole}"
        row = acc[shape]
        row[0] += spent
        row[1] += 1
        row[2] += cur["price"]

    def w_price(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return price(*a, **kw)
        finally:
            cur["price"] += time.perf_counter() - t

    # (owner, name, original, wrapper)
    patches = ((sim, "_step", step, w_step), (sim, "_step_steady", steady, w_steady),
               (sim, "_phase_b", phase_b, w_phase_b), (sim, "_schedule", schedule, w_schedule),
               (api, "price_step", price, w_price))
    for owner, name, _orig, wrapper in patches:
        setattr(owner, name, wrapper)
    try:
        f = bench.run(scenario, rs.table.num_rows, 50, True, source=rs)
    finally:
        for owner, name, orig, _wrapper in patches:
            setattr(owner, name, orig)
    return acc, f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama-3.1-8b-h100-tp1")
    ap.add_argument("--trace", action="append", required=True, help="a request trace file")
    a = ap.parse_args()
    print(f"cores: {os.cpu_count()}")
    for path in a.trace:
        acc, f = measure(a.scenario, path)
        print(f"{a.scenario} {os.path.basename(path)}: {f['steps']:,} steps, cpu {f['cpu_s']:.2f}s, "
              f"pricing {f['pricing_s']:.2f}s (wrapped)")
        for shape, (spent, n, priced) in sorted(acc.items(), key=lambda kv: kv[1][2] - kv[1][0]):
            book = spent - priced
            print(f"  {int(n):7,d}  {shape:45s} bookkeeping {book:5.2f}s "
                  f"{book / n * 1e6:6.1f} us/step")


if __name__ == "__main__":
    main()
