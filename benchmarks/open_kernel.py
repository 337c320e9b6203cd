"""Building a kernel: kernel.open of DeepSeek-V3, cold and warm, and a saved pool loaded back.

    python benchmarks/open_kernel.py [--repeat 5] [--baseline DIR]

* cold, imports included: a fresh interpreter imports ``kernel`` and opens the scenario (what
  a command line or a sweep worker pays);
* cold: the first open in a fresh interpreter, imports excluded;
* documents only: reading and decoding the scenario's YAML documents (``open_inputs``), the
  decoder warm;
* warm, after another scenario: the process has opened Llama-3.1-8B (decoder and DuckDB warm,
  shared catalog/registry files read), then opens DeepSeek-V3 (its own documents read now);
* warm, nothing cached: every document re-read and re-decoded, resolution recomputed;
* load_kernel: the same pool from a file written by ``Kernel.save`` (no YAML, no SQL).

Every figure is measured in fresh interpreters, best of ``--repeat``: wall seconds and process
CPU seconds (all threads). ``--baseline DIR`` measures an older tree (for example ``git archive
3d63a3b | tar -x -C DIR``) in the same run, alternating with this one, and prints the ratios;
without it the ``before`` column is the figure recorded below. On a busy machine compare CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
OTHER = "llama-3.1-8b-h100-tp1"
# main at 3d63a3b, this script, best of 3 runs of --repeat 3, 2 cores, load average 5-9:
# (wall, process CPU) seconds. Wall is dominated by the load; compare CPU.
BEFORE_S = {"documents only (open_inputs)": (0.49, 0.24), "cold": (0.50, 0.34),
            "warm, after another scenario": (0.59, 0.29), "warm, nothing cached": (1.07, 0.53)}

COLD_IMPORTS = f"""
import time, json
t, c = time.perf_counter(), time.process_time()
import kernel
kernel.open({SCENARIO!r})
print(json.dumps({{"cold, imports included": (time.perf_counter() - t, time.process_time() - c)}}))
"""

COLD = f"""
import time, json, kernel, kernel.pool.build, kernel.facade.kernel, pipeline.validate, duckdb
t, c = time.perf_counter(), time.process_time(); kernel.open({SCENARIO!r})
print(json.dumps({{"cold": (time.perf_counter() - t, time.process_time() - c)}}))
"""

WARM = f"""
import json, sys, tempfile, time
from pathlib import Path
import kernel
from pipeline.load import open_inputs

def clear():  # whichever caches this tree has
    from kernel import build
    from pipeline import db, load
    getattr(build, "_RESOLVED", {{}}).clear()
    getattr(getattr(load, "_load_document_cached", None), "cache_clear", lambda: None)()
    getattr(db, "_NORMALISED", {{}}).clear()

def timed(f):
    t, c = time.perf_counter(), time.process_time()
    value = f()
    return value, (time.perf_counter() - t, time.process_time() - c)

out = {{}}
kernel.open({OTHER!r})
clear()
out["documents only (open_inputs)"] = timed(lambda: open_inputs({SCENARIO!r}))[1]
clear()
kernel.open({OTHER!r})
k, out["warm, after another scenario"] = timed(lambda: kernel.open({SCENARIO!r}))
clear()
out["warm, nothing cached"] = timed(lambda: kernel.open({SCENARIO!r}))[1]
if hasattr(kernel, "load_kernel") or "load_kernel" in getattr(kernel, "__all__", ()):
    with tempfile.TemporaryDirectory() as tmp:
        path = k.save(Path(tmp) / "ds3.pool")
        kernel.load_kernel(path)
        out["load_kernel (saved pool)"] = timed(lambda: kernel.load_kernel(path))[1]
        out["saved pool KiB"] = (path.stat().st_size / 1024, 0.0)
print(json.dumps(out))
"""

ORDER = ["cold, imports included", "cold", "documents only (open_inputs)",
         "warm, after another scenario", "warm, nothing cached", "load_kernel (saved pool)"]


def measure(tree: Path) -> dict[str, tuple[float, float]]:
    """One fresh interpreter per script, run in ``tree``: every figure once."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    figures: dict[str, tuple[float, float]] = {}
    for script in (COLD_IMPORTS, COLD, WARM):
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tree, check=True,
                              capture_output=True, text=True)
        figures.update({k: tuple(v) for k, v in json.loads(done.stdout.splitlines()[-1]).items()})
    return figures


def best(runs: list[dict[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    keys = {k for r in runs for k in r}
    return {k: (min(r[k][0] for r in runs if k in r), min(r[k][1] for r in runs if k in r))
            for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="an older tree measured in the same run")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    now_runs, base_runs = [], []
    for _ in range(args.repeat):
        now_runs.append(measure(root))
        if args.baseline:
            base_runs.append(measure(args.baseline.resolve()))
    now = best(now_runs)
    before = best(base_runs) if args.baseline else BEFORE_S
    label = "this run" if args.baseline else "recorded"
    print(f"kernel.open({SCENARIO!r}), seconds, best of {args.repeat}, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f}); CPU = process CPU time, all threads; "
          f"before: {label}")
    print(f"  {'':<30} {'wall before':>11} {'wall now':>9} {'CPU before':>11} {'CPU now':>8} "
          f"{'CPU ratio':>9}")
    for name in ORDER:
        if name not in now:
            continue
        wall, cpu = now[name]
        bw, bc = before.get(name, (0.0, 0.0))
        ratio = f"{cpu / bc:9.2f}" if bc else ""
        shown_bw = f"{bw:11.3f}" if bw else f"{'':>11}"
        shown_bc = f"{bc:11.3f}" if bc else f"{'':>11}"
        print(f"  {name:<30} {shown_bw} {wall:9.3f} {shown_bc} {cpu:8.3f} {ratio}")
    size = now.get("saved pool KiB", (0.0, 0.0))[0]
    print(f"  saved pool file: {size:.0f} KiB; target: warm open <= 0.3 s")


if __name__ == "__main__":
    main()
