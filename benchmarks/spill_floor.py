"""Benchmark: the least a partition to disk adds to pricing a shuffled trace (issue 31).

    python benchmarks/spill_floor.py --dir DIR          # the 10M traces (made if missing)
    python benchmarks/spill_floor.py --dir DIR --batches 1000000 --repeat 3

Pricing a shuffled trace beyond memory must read a larger file (a shuffled parquet trace
compresses ~5x worse) and move every row twice: to its batch-id range's spill group (pass 1),
and, read back, next to the other rows of its batch (pass 2). This prices that floor in CPU
time against ``price_file`` of the sorted trace, each figure from a fresh child process (best
of ``--repeat``, interleaved):

* ``price``: ``price_file`` of the sorted trace and of the shuffled one (mode ``spill``);
* ``read``: the trace's four columns read row group by row group (pyarrow, as ``price_file``
  reads them), sorted and shuffled: the larger read is the difference;
* ``moves``: the kernel's own scatter and grouped gather (compiled counting sorts,
  :mod:`kernel.bulk.row_loops`), timed alone on one thread (``time.thread_time``, best of
  three a chunk or a piece): every chunk scattered to its pieces as the spill narrows it
  (the ids' low 16 bits, the row numbers, ``scheduled``, ``computed``), and the first spill
  group's pieces, each gathered from its ~300 slices and grouped by batch, scaled to the
  trace by its rows. No I/O, no validation, no pricing;
* the floor: ``(sorted CPU + moves + the larger read) / sorted CPU``, the shuffled ÷ sorted
  CPU ratio a spill would reach were everything else it does free. On two cores kept equally
  busy, the wall-time ratio is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from price_trace import (  # noqa: E402
    DEFAULT_SCENARIO,
    TRACE_COLUMNS,
    _cpu,
    _peak_rss_bytes,
    _tune_malloc,
    make_traces,
)


def _read(trace: str) -> dict[str, float]:
    import pyarrow.parquet as pq

    c0, t0 = _cpu(), time.perf_counter()
    f = pq.ParquetFile(trace)
    rows = 0
    for g in range(f.num_row_groups):
        t = f.read_row_group(g, columns=TRACE_COLUMNS)
        cols = [t.column(c).to_numpy() for c in TRACE_COLUMNS]
        rows += len(cols[0])
    return {"seconds": time.perf_counter() - t0, "cpu": _cpu() - c0, "rows": rows,
            "peak_rss": _peak_rss_bytes()}


def _moves(trace: str) -> dict[str, float]:
    """The two row moves of a spill alone, each timed as one thread's CPU time (best of three
    a chunk or piece), so the figure is a floor: no I/O, no orchestration, no pricing. Pass 1
    is :func:`kernel.bulk.partition.scatter` of every chunk as mode ``spill`` narrows it; pass
    2 is :func:`kernel.bulk.joined.gather_grouped` of each piece of the first spill group
    (all ~300 slices of each, end to end as a group is read back), scaled to the trace by
    its rows."""
    import numpy as np
    import pyarrow.parquet as pq

    from kernel.bulk.joined import Joined, gather_grouped
    from kernel.bulk.partition import scatter
    from kernel.bulk.spill import group_bounds, spill_plan
    from kernel.io.trace import Rows
    from kernel.model import jit

    assert jit.enabled(), "the spill's compiled loops are what this measures: install numba"
    f = pq.ParquetFile(trace)
    meta = f.metadata
    ranges = [(int(meta.row_group(g).column(0).statistics.min),
               int(meta.row_group(g).column(0).statistics.max), meta.row_group(g).num_rows)
              for g in range(meta.num_row_groups)]
    part = spill_plan(ranges, 1 << 30)
    assert part is not None and part.local, "a plan of local pieces (16-bit ids) expected"
    last = int(group_bounds(part, meta.num_rows, 1 << 30)[1])  # (the first group's pieces)

    def best(fn: Callable[[], Any]) -> tuple[float, Any]:
        times, out = [], None
        for _ in range(3):
            t0 = time.thread_time()
            out = fn()
            times.append(time.thread_time() - t0)
        return min(times), out

    pass1, first = 0.0, 0
    kept: list[Rows] = []  # the first group's slice of each chunk
    offsets: list[np.ndarray] = []  # and where its pieces start in it
    for g in range(meta.num_row_groups):
        t = f.read_row_group(g, columns=TRACE_COLUMNS[:3])
        ids, sched, comp = (t.column(x).to_numpy() for x in TRACE_COLUMNS[:3])
        n = ids.size
        rows = Rows(np.arange(first, first + n), ids, sched, comp,
                    np.broadcast_to(np.False_, (n,)))
        dt, sc = best(partial(scatter, rows, part, fresh=True, narrow=True))
        pass1 += dt
        first += n
        kept.append(sc.rows.slice(0, int(sc.offsets[last])))
        offsets.append(sc.offsets[:last + 1])
    base = np.cumsum([0] + [len(r) for r in kept[:-1]])
    joined = Rows.concat(kept)
    joined.bad = np.broadcast_to(np.False_, (len(joined),))  # (no bad row: as read back)
    group = Joined(joined, np.array(offsets, np.int64) + base[:, None], 0, part)
    pass2_group = sum(best(partial(gather_grouped, group, k))[0] for k in range(last))
    grouped = len(group.rows)
    pass2 = pass2_group * first / max(grouped, 1)
    return {"seconds": pass1 + pass2, "cpu": pass1 + pass2, "pass1_cpu": pass1,
            "pass2_cpu": pass2, "rows": first, "grouped_rows": grouped,
            "peak_rss": _peak_rss_bytes()}


def child(kind: str, trace: str, work: str) -> dict[str, float]:
    _tune_malloc()
    if kind == "read":
        return _read(trace)
    if kind == "moves":
        return _moves(trace)
    if kind == "price":
        import kernel
        from kernel.bulk import price_file

        k = kernel.open(DEFAULT_SCENARIO)
        c0, t0 = _cpu(), time.perf_counter()
        c = price_file(k, trace, str(Path(work) / "floor-priced.parquet"), progress=False)
        return {"seconds": time.perf_counter() - t0, "cpu": _cpu() - c0,
                "rows": c.rows_in, "batches": c.batches_priced, "peak_rss": _peak_rss_bytes()}
    raise SystemExit(f"unknown child {kind}")


def run_child(kind: str, trace: Path, work: Path) -> dict[str, float]:
    res = subprocess.run([sys.executable, __file__, "--_child", kind, str(trace), str(work)],
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"child {kind} {trace.name} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=10_000_000)
    ap.add_argument("--dir", default=None, help="where traces go (kept; default: a tmp dir)")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    ap.add_argument("--json", default=None, help="also write the runs to this file")
    ap.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(*args._child)))
        return 0
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="blis-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    traces = make_traces(work, args.batches, ("sorted", "shuffled"), shuffle="buckets")
    runs = [("price sorted", "price", "sorted"), ("read sorted", "read", "sorted"),
            ("read shuffled", "read", "shuffled"), ("moves shuffled", "moves", "shuffled"),
            ("price shuffled", "price", "shuffled")]
    best: dict[str, dict[str, float]] = {}
    for _ in range(max(args.repeat, 1)):
        for label, kind, order in runs:
            r = run_child(kind, traces[order], work)
            if label not in best or r["seconds"] < best[label]["seconds"]:
                best[label] = r
    ps, rs, rh = best["price sorted"], best["read sorted"], best["read shuffled"]
    mv, sh = best["moves shuffled"], best["price shuffled"]
    print(f"{ps['batches']:,.0f} batches, {ps['rows']:,.0f} rows, {os.cpu_count()} cores, "
          f"1-min load {os.getloadavg()[0]:.1f}, best of {args.repeat}")
    for label in ("price sorted", "read sorted", "read shuffled", "price shuffled"):
        r = best[label]
        print(f"  {label:<15} {r['seconds']:7.2f}s wall {r['cpu']:7.2f}s CPU  "
              f"peak RSS {r['peak_rss'] / 2**30:.2f} GiB")
    rows = mv["rows"]
    print(f"  moves, the loops' CPU alone: pass 1 {mv['pass1_cpu']:.2f}s "
          f"({mv['pass1_cpu'] / rows * 1e9:.1f} ns a row), pass 2 {mv['pass2_cpu']:.2f}s "
          f"({mv['pass2_cpu'] / rows * 1e9:.1f} ns a row; measured on "
          f"{mv['grouped_rows']:,.0f} rows)")
    extra = mv["cpu"] + rh["cpu"] - rs["cpu"]
    print(f"  CPU floor of shuffled ÷ sorted: (sorted {ps['cpu']:.2f} + moves {mv['cpu']:.2f} + "
          f"larger read {rh['cpu'] - rs['cpu']:.2f}) / sorted = {(ps['cpu'] + extra) / ps['cpu']:.2f}"
          f"; price_file's: CPU {sh['cpu'] / ps['cpu']:.2f}, wall "
          f"{sh['seconds'] / ps['seconds']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(best, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
