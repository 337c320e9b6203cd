"""Capacity sweep wall time by executor: the same sweep (scenarios × rates) inline, on local
processes and on a local Dask cluster, each repeated; prints seconds, the ratio to inline in
the same round, and whether the tables are equal bit for bit.

    python benchmarks/replay_capacity.py --repeats 3
    python benchmarks/replay_capacity.py --load rate=4,duration=600 --executors inline,local:2
"""

from __future__ import annotations

import argparse
import os
import time

from kernel.replay import parse_load
from kernel.replay.capacity import sweep_rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", default="rate=4,duration=60,prompt=lognormal:1024:0.5,"
                                      "output=uniform:16:256")
    ap.add_argument("--scenarios", default="llama-3.1-8b-h100-tp1,qwen3-30b-a3b-h100-tp2")
    ap.add_argument("--rates", default="1,2,4,8,16,32")
    ap.add_argument("--executors", default="inline,local:2,dask-local:2")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    spec = parse_load(args.load)
    scenarios = args.scenarios.split(",")
    rates = [float(r) for r in args.rates.split(",")]
    print(f"{len(scenarios)} scenarios x {len(rates)} rates of {args.load}; "
          f"{os.cpu_count()} cores")
    base = None
    for rep in range(args.repeats):
        first = None
        for ex in args.executors.split(","):
            t = time.perf_counter()
            res = sweep_rates(scenarios, spec, rates, slo={"ttft": 0.2, "itl": 0.03}, cluster=ex)
            dt = time.perf_counter() - t
            first = first or dt
            base = base if base is not None else res.curve
            n = sum(res.curve.column("requests").to_pylist())
            print(f"round {rep}: {ex:<14} {dt:7.2f} s  ({dt / first:.2f}x the first)  "
                  f"{n:,} requests replayed  equal to the first table: {res.curve.equals(base)}",
                  flush=True)


if __name__ == "__main__":
    main()
