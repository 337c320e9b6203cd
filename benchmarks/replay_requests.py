"""Benchmark: how fast a replay's requests are read and generated (requests/s), best of
several repeats.

    python benchmarks/replay_requests.py [--requests 1000000] [--repeats 3] [--shared PATH]

Reads the public Azure and Mooncake traces (from ``../shared/reference/request-traces`` or
``--shared``), then generates ``--requests`` open-loop requests with lognormal lengths and
as many inference-perf-style shared-prefix requests (10 x 10 prompts of 566 tokens, hashed
in 16-token blocks), and reads the first set back from parquet.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.replay import generate, read_requests, write_requests  # noqa: E402


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2]
                    / "shared" / "reference" / "request-traces")
    args = ap.parse_args()
    n, rep = args.requests, args.repeats
    print(f"{os.cpu_count()} cores; best of {rep}")
    for name in ("azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
                 "mooncake-fast25/conversation_trace.jsonl"):
        path = args.shared / name
        if not path.exists():
            print(f"{name}: absent under {args.shared} (give --shared)")
            continue
        t, rs = best_of(rep, lambda p=path: read_requests(p))
        print(f"read {name}: {rs.table.num_rows:,} requests in {t:.3f} s "
              f"({rs.table.num_rows / t / 1e3:,.0f} k requests/s)")
    rate = n / 1000
    t, rs = best_of(rep, lambda: generate(f"rate={rate},duration=1000,"
                                          "prompt=lognormal:1024:1,output=exponential:200"))
    print(f"generate open loop: {rs.table.num_rows:,} requests in {t:.2f} s "
          f"({rs.table.num_rows / t / 1e6:.2f} M requests/s)")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.parquet"
        write_requests(rs, path)
        t, back = best_of(rep, lambda: read_requests(path))
        print(f"read parquet: {back.table.num_rows:,} requests in {t:.2f} s "
              f"({back.table.num_rows / t / 1e6:.2f} M requests/s)")
    t, rs = best_of(rep, lambda: generate(
        f"arrival=normalized_exponential,rate={rate},duration=1000,groups=10,"
        "prompts_per_group=10,system=100,question=fixed:466,output=fixed:247"))
    entries = sum(len(h) for h in rs.table["prefix_hashes"].chunks[0].to_pylist()[:1]) \
        * rs.table.num_rows
    print(f"generate shared prefix: {rs.table.num_rows:,} requests ({entries:,} hash entries) "
          f"in {t:.2f} s ({rs.table.num_rows / t / 1e6:.2f} M requests/s)")


if __name__ == "__main__":
    main()
