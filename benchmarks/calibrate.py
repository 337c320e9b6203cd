"""Benchmark: calibrating a 1,000,000-step measured trace (issues 11 and 32).

    python benchmarks/calibrate.py                  # 1M steps, best of 3
    python benchmarks/calibrate.py --batches 200000 --repeat 1
    python benchmarks/calibrate.py --before ../other-checkout   # also time another checkout's code

``--before DIR`` runs the same child on the code in DIR (e.g. the main branch before issue
32), alternating with this tree's, so the two are compared as a ratio within one run.

It synthesises a continuous-batching trace (``kernel.io.synth``, 8 requests per step on
average, ~5% prefill rows) on ``llama-3.1-70b-h200-tp4``, prices it once to make a measured
column from a known calibration (per-phase multipliers and constants, times 2% log-normal
noise), and writes it to parquet. Then, in a fresh child process each time (so the peak RSS
printed, ``resource.getrusage``, is that of the calibration alone), it runs
``kernel.calibration.calibrate`` end to end: read the trace, price every step, fit the three
phase classes, 5-fold cross-validation (six fits), build the document. It prints the wall
time, the time of the fit alone, the peak RSS and the held-out MAPE.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIO = "llama-3.1-70b-h200-tp4"


def make_trace(path: Path, batches: int) -> None:
    import numpy as np
    import polars as pl

    import kernel
    from kernel.io.synth import synth
    from kernel.model.calibration_law import TERMS, Law, PhaseCorrection, calibrated_ns

    table = synth(batches, requests_per_batch=8.0, prefill_share=0.05, seed=1)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    k = kernel.open(SCENARIO)
    priced = k.price(frame)
    law = Law(PhaseCorrection((1.2, 0.9, 1.5, 1.0, 1.0), 3e5),
              PhaseCorrection((0.8, 1.1, 1.7, 1.0, 1.0), 8e5),
              PhaseCorrection((1.1, 1.0, 1.3, 1.0, 1.0), 5e5))
    y = calibrated_ns(law, [priced[f"{t}_ns"].to_numpy() for t in TERMS],
                      priced["prefill_requests"].to_numpy(),
                      priced["decode_requests"].to_numpy()).astype(np.float64)
    y *= np.random.default_rng(2).lognormal(0.0, 0.02, y.size)
    m = pl.DataFrame({"batch_id": priced["batch_id"], "measured_us": y / 1e3})
    frame.join(m, on="batch_id", how="left").write_parquet(path)


def run(path: str) -> None:
    """The measured part, in a child process: prints one JSON line."""
    import kernel.calibration.fit as fit_mod
    from kernel.calibration import calibrate

    fit_seconds = [0.0]
    inner = fit_mod.fit

    def timed_fit(*a: object, **kw: object) -> object:
        t = time.perf_counter()
        out = inner(*a, **kw)  # type: ignore[arg-type]
        fit_seconds[0] += time.perf_counter() - t
        return out

    import kernel.calibration.make as make_mod

    make_mod.fit = timed_fit  # type: ignore[assignment]
    t0 = time.perf_counter()
    cal = calibrate(SCENARIO, path, "measured_us", unit="us", folds=5)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    doc = cal.document
    print(json.dumps({"wall": wall, "fit": fit_seconds[0], "rss": rss,
                      "steps": doc["window"]["steps"], "held_out": doc["held_out"]["mape"],
                      "training": doc["training"]["mape"], "start": doc.get("start", "-")}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", default=None, help="Another checkout to time alongside.")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        if args.root:
            sys.path.insert(0, args.root)
        run(args.run)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measured.parquet"
        t = time.perf_counter()
        make_trace(path, args.batches)
        print(f"synthesised and measured {args.batches:,} steps in "
              f"{time.perf_counter() - t:.1f}s -> {path.stat().st_size / 2**20:.0f} MiB parquet")
        roots = {"this tree": str(ROOT)}
        if args.before:
            roots = {"before": str(Path(args.before).resolve()), **roots}
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            for label, root in roots.items():
                out = subprocess.run([sys.executable, __file__, "--run", str(path), "--root",
                                      root], check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                if label not in best or r["wall"] < best[label]["wall"]:
                    best[label] = r
        import os

        for label, b in best.items():
            print(f"{label}: calibrate {b['steps']:,} steps ({SCENARIO}, 5 folds): "
                  f"{b['wall']:.2f}s wall (best of {args.repeat}), of which the fit and "
                  f"cross-validation {b['fit']:.2f}s; peak RSS {b['rss'] / 2**30:.2f} GiB; "
                  f"start {b['start']}; training MAPE {b['training']:.2%}, held-out MAPE "
                  f"{b['held_out']:.2%}")
        if "before" in best:
            a, b = best["before"], best["this tree"]
            print(f"this tree / before: wall {b['wall'] / a['wall']:.2f}x, fit "
                  f"{b['fit'] / a['fit']:.2f}x ({os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
