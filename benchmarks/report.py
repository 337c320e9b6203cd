"""Benchmark: the HTML report of a long priced trace — build time, file size, Chromium render.

    python benchmarks/report.py [--steps 10000000] [--requests 8] [--repeats 3]

Synthesises a trace of ``--steps`` steps (``--requests`` requests in flight), prices it with
the utilisation columns (streaming, parquet → parquet), then builds the full report (every
section, with the scenario and the request-level trace) and renders it in headless Chromium
(a full-page screenshot, which lays out and paints every chart). It prints the report's size,
the time to build it, and the render time, best of ``--repeats``; and the same for a trace a
hundred times shorter, so the ratio shows that neither grows with the trace.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"


def render_seconds(page: Path, tmp: Path, repeats: int) -> float | None:
    """Best wall time of a headless Chromium full-page screenshot of ``page``."""
    exe = shutil.which("chromium")
    if exe is None:
        return None
    best = float("inf")
    for i in range(repeats):
        shot = tmp / f"shot{i}.png"
        t0 = time.perf_counter()
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update",
                        f"--user-data-dir={tmp / 'profile'}", f"--screenshot={shot}",
                        "--window-size=1280,12000", page.resolve().as_uri()],
                       capture_output=True, check=True, timeout=300)
        best = min(best, time.perf_counter() - t0)
    return best


def one(steps: int, requests: float, tmp: Path, repeats: int) -> dict[str, float]:
    import kernel
    from kernel.bulk import price_file
    from kernel.bulk.summary import summarise
    from kernel.io.synth import write_synth
    from kernel.model.utilisation import column_producer
    from kernel.report import html

    k = kernel.open(SCENARIO)
    trace = tmp / f"trace{steps}.parquet"
    priced_path = tmp / f"priced{steps}.parquet"
    t0 = time.perf_counter()
    write_synth(trace, steps, seed=0, requests_per_batch=requests)
    t1 = time.perf_counter()
    price_file(k, trace, priced_path, progress=False, decode_threshold=1,
               producers=[column_producer()])
    t2 = time.perf_counter()
    build = float("inf")
    page = tmp / f"report{steps}.html"
    for _ in range(repeats):
        t3 = time.perf_counter()
        priced = pl.read_parquet(priced_path)
        text = html.trace_report(priced, k, summary=summarise(priced, k), trace=trace)
        html.write(text, page)
        build = min(build, time.perf_counter() - t3)
    render = render_seconds(page, tmp, repeats)
    return {"steps": steps, "synth_s": t1 - t0, "price_s": t2 - t1, "build_s": build,
            "bytes": page.stat().st_size, "render_s": render if render is not None else -1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000_000)
    ap.add_argument("--requests", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        small = one(max(args.steps // 100, 1000), args.requests, tmp, args.repeats)
        big = one(args.steps, args.requests, tmp, args.repeats)
    for r in (small, big):
        render = f"{r['render_s']:.2f} s" if r["render_s"] >= 0 else "n/a (no chromium)"
        print(f"{int(r['steps']):>12,} steps: report {r['bytes'] / 1e6:.2f} MB, built in "
              f"{r['build_s']:.2f} s, Chromium render {render} (best of {args.repeats}); "
              f"synth {r['synth_s']:.1f} s, price {r['price_s']:.1f} s")
    print(f"ratios {int(big['steps']):,} / {int(small['steps']):,} steps: size "
          f"{big['bytes'] / small['bytes']:.2f}x, build {big['build_s'] / small['build_s']:.2f}x"
          + (f", render {big['render_s'] / small['render_s']:.2f}x"
             if small["render_s"] > 0 else "")
          + f" on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
