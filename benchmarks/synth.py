"""Benchmark: how fast `kernel.io.synth` generates a trace (rows/s), best of several repeats.

    python benchmarks/synth.py [--batches 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.io.synth import synth_batches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    best = float("inf")
    rows = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows = sum(rb.num_rows for rb in synth_batches(args.batches, seed=0))
        best = min(best, time.perf_counter() - t0)
    print(f"synth: {args.batches:,} batches, {rows:,} rows in {best:.2f} s (best of "
          f"{args.repeats}): {rows / best / 1e6:.2f} M rows/s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
