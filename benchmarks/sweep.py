"""Sweep benchmark: one trace priced under many scenarios, local cluster vs one process.

    python benchmarks/sweep.py [--batches 1000000] [--scenarios 10] [--workers 2]

Prints the wall time of each and the speed-up.
"""

from __future__ import annotations

import argparse
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
              f"{len(names)} scenarios")

        # The single-process run starts a fresh interpreter, as each worker does, so both sides
        # pay for imports and kernel construction.
        script = (
            "import sys; from kernel.build import open as o; from kernel.bulk import price_file\n"
            "for n in sys.argv[3:]:\n"
            "    price_file(o(n), sys.argv[1], f'{sys.argv[2]}/single-{n}.parquet', progress=False)")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", script, str(whole), str(root), *names], check=True)
        single = time.perf_counter() - t0
        print(f"single process (fresh interpreter, {len(names)} kernels built): {single:,.1f} s")

        client = make_client(f"local:{args.workers}")
        try:
            t0 = time.perf_counter()
            price_dataset(src, root / "sweep", names, client)
            cluster = time.perf_counter() - t0
        finally:
            client.close()
        print(f"local cluster ({args.workers} worker processes, started before timing): "
              f"{cluster:,.1f} s")
        print(f"speed-up: {single / cluster:.2f}x")


if __name__ == "__main__":
    main()
