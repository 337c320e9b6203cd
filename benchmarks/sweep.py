"""Sweep benchmark: one trace priced under many scenarios, worker processes vs one process.

    python benchmarks/sweep.py [--batches 1000000] [--scenarios 10] [--workers 2]
                               [--partitions 8] [--dask]

All in one run, on the same files: one fresh interpreter pricing the whole trace under each
scenario in turn (it builds each kernel), then ``price_dataset`` on ``local:N`` worker
processes (pool start-up included), then (``--dask``) on a local Dask cluster of N workers
(started before timing). Prints wall times, speed-ups, task costs and how many kernels each
built. ``docs/scaling.md`` explains how the figures extrapolate to more cores and machines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from kernel.build import open as open_kernel
from kernel.distributed import make_client, price_dataset
from kernel.synth import write_synth
from pipeline.resources import data_dir

PREFERRED = [
    "deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1", "llama-3.1-70b-h200-tp4",
    "mixtral-8x7b-h100-tp2", "qwen3-30b-a3b-h100-tp2", "minimax-m25-h200-tp8",
    "gpt-oss-120b-h200-fp4-vllm-tp8", "glm5-h200-tp8", "deepseek-v3-b300-fp8-sglang-tp8",
    "kimi-k2.5-b200-fp4-vllm-tp4", "deepseek-v3-h200-tp8-pcp2", "glm5-h200-tp8-dcp4",
]


def pick_scenarios(n: int) -> list[str]:
    known = {p.stem for p in (data_dir() / "scenarios").glob("*.yaml")}
    chosen = []
    for name in PREFERRED:
        if name in known:
            try:
                open_kernel(name)
            except Exception:  # a refused deployment cannot be swept
                continue
            chosen.append(name)
        if len(chosen) == n:
            break
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=1_000_000)
    parser.add_argument("--scenarios", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dask", action="store_true", help="also time a local Dask cluster")
    args = parser.parse_args()
    names = pick_scenarios(args.scenarios)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        whole = root / "trace.parquet"
        write_synth(whole, args.batches, seed=1)
        table = pq.read_table(whole)
        src = root / "parts"
        src.mkdir()
        step = -(-table.num_rows // args.partitions)
        for i in range(args.partitions):
            pq.write_table(table.slice(i * step, step), src / f"part-{i:03d}.parquet")
        del table
        print(f"trace: {args.batches:,} batches in {args.partitions} partitions; "
              f"{len(names)} scenarios; {os.cpu_count()} cores")

        # The single-process run starts a fresh interpreter, as each worker does, so both sides
        # pay for imports and kernel construction; it reports its build and pricing seconds.
        script = (
            "import sys, time; from kernel.build import open as o; "
            "from kernel.bulk import price_file\n"
            "b = p = 0.0\n"
            "for n in sys.argv[3:]:\n"
            "    t = time.perf_counter(); k = o(n); b += time.perf_counter() - t\n"
            "    t = time.perf_counter()\n"
            "    price_file(k, sys.argv[1], f'{sys.argv[2]}/single-{n}.parquet', progress=False)\n"
            "    p += time.perf_counter() - t\n"
            "print(b, p)")
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", script, str(whole), str(root), *names],
                              check=True, capture_output=True, text=True)
        single = time.perf_counter() - t0
        build_s, price_s = map(float, done.stdout.split()[-2:])
        print(f"one process (fresh interpreter): {single:,.1f} s, {len(names)} kernels built "
              f"({build_s:.1f} s building, {price_s:.1f} s pricing: "
              f"{price_s / len(names):.2f} s per scenario)")

        t0 = time.perf_counter()
        result = price_dataset(src, root / "procs", names, f"local:{args.workers}")
        procs = time.perf_counter() - t0
        tasks = len(result.tasks)
        print(f"{result.executor}: {procs:,.1f} s, {result.kernels_built} kernels built, "
              f"{tasks} partition × scenario results ({procs * args.workers / tasks:.2f} "
              f"worker-s each)")
        print(f"speed-up over one process: {single / procs:.2f}x on {args.workers} workers")

        if args.dask:
            client = make_client(f"dask-local:{args.workers}")
            try:
                t0 = time.perf_counter()
                result = price_dataset(src, root / "dask", names, client)
                dask = time.perf_counter() - t0
            finally:
                client.close()
            print(f"{result.executor} (started before timing): {dask:,.1f} s, "
                  f"{result.kernels_built} kernels built; speed-up {single / dask:.2f}x")


if __name__ == "__main__":
    main()
