"""The same figures measured in two checkouts, alternately, in one run: did a refactor move
speed? (issue 30 item 1: the layer move, "within noise").

    python benchmarks/checkouts.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 5]

Each round runs a child process per checkout (``PYTHONPATH`` = the checkout) that times, in
CPU time (the thread's for the scalar calls, the process's for bulk), best of its own repeats: one scalar ``Kernel.step_time`` (DeepSeek-V3, 32
decode requests at context 4,096), a 20,000-call ``StepBatch`` decode loop, and a
200,000-batch synthetic trace priced in bulk (``price``, rows per second). The figure per
checkout is the best over rounds; the ratio new / old is printed with the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, time
import numpy as np
import kernel
try:
    from kernel.io.synth import synth
except ImportError:
    from kernel.synth import synth

def best(fn, repeat, clock=time.thread_time):
    out = []
    for _ in range(repeat):
        t = clock(); fn(); out.append(clock() - t)
    return min(out)

k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
batch = kernel.Batch([kernel.Request(1, 4095)] * 32)
n = 2000
step_us = best(lambda: [k.step_time(batch) for _ in range(n)], 7) / n * 1e6
def loop():
    sb = kernel.StepBatch()
    sb.extend(np.ones(32, np.int64), np.full(32, 4095, np.int64))
    for _ in range(20_000):
        sb.step_time(k)
        sb.advance()
loop_us = best(loop, 3) / 20_000 * 1e6
trace = synth(200_000, seed=3)
rows = trace.num_rows
bulk_s = best(lambda: k.price(trace), 3, time.process_time)  # (every thread)
print(json.dumps({"step_us": step_us, "loop_us": loop_us, "bulk_rows_per_s": rows / bulk_s}))
"""


def figures(checkout: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=checkout, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for _ in range(a.rounds):
        for name, path in (("old", a.old), ("new", a.new)):
            for key, v in figures(path).items():
                keep = max if key.endswith("per_s") else min
                best[name][key] = keep(best[name].get(key, v), v)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, best of {a.rounds} rounds")
    for key in best["old"]:
        o, n = best["old"][key], best["new"][key]
        print(f"{key:18s} old {o:14,.2f}  new {n:14,.2f}  new/old {n / o:.3f}")


if __name__ == "__main__":
    main()
