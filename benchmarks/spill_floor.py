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
* ``moves``: the kernel's own compiled counting sorts (:mod:`kernel.bulk.row_loops`), timed
  alone on one thread (``time.thread_time``, best of three a chunk or a piece): every chunk
  scattered to its pieces (the ids' low 16 bits, the row numbers, ``scheduled``,
  ``computed``), and the first spill group's pieces, each gathered from its ~300 slices and
  grouped by batch (three columns and the ids), scaled to the trace by its rows. No I/O, no
  allocation but the loops' outputs, no validation, no pricing;
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


def _moves(trace: str, work: str) -> dict[str, float]:
    """The two row moves of a spill alone, each timed as the compiled loops' own CPU time on
    one thread (best of three a chunk or piece), so the figure is a floor: no I/O, no
    orchestration, no pricing. Pass 1 on every chunk of the trace; pass 2 on the pieces of
    the first spill group (all ~300 slices of each, as mode ``spill`` reads them), scaled to
    the trace by its rows."""
    import numpy as np
    import pyarrow.parquet as pq

    from kernel.bulk import row_loops as rl
    from kernel.bulk.spill import group_bounds, spill_plan
    from kernel.io.trace import narrow_type
    from kernel.model import jit

    loops = {name: jit.compiled(getattr(rl, name)) for name in rl.__all__}
    f = pq.ParquetFile(trace)
    meta = f.metadata
    ranges = [(int(meta.row_group(g).column(0).statistics.min),
               int(meta.row_group(g).column(0).statistics.max), meta.row_group(g).num_rows)
              for g in range(meta.num_row_groups)]
    part = spill_plan(ranges, 1 << 30)
    assert part is not None and part.local, "a plan of local pieces (16-bit ids) expected"
    bounds = group_bounds(part, meta.num_rows, 1 << 30)
    last = int(bounds[1])  # (the first group's pieces: 0 .. last - 1)

    def best(fn: Callable[[], Any]) -> tuple[float, Any]:
        times, out = [], None
        for _ in range(3):
            t0 = time.thread_time()
            out = fn()
            times.append(time.thread_time() - t0)
        return min(times), out

    def scatter(first: int, ids: np.ndarray, s: np.ndarray, c: np.ndarray
                ) -> tuple[np.ndarray, list[np.ndarray]]:
        n = ids.size
        low = np.empty(n, np.uint16)
        keys, offsets = loops["piece_keys"](ids, part.lo, part.shift, part.piece_of_cell,
                                            part.n, low)
        order = np.empty(n, np.int32)
        loops["stable_order"](keys, offsets, order)
        out = []
        for v, t in ((low, np.uint16), (None, np.int32), (s, narrow_type(s)),
                     (c, narrow_type(c))):
            o = np.empty(n, t)
            if v is None:
                loops["shifted_into"](order, first, o)
            else:
                loops["take_into"](order, v, o)
            out.append(o)
        return offsets, out

    pass1, first = 0.0, 0
    kept: list[tuple[np.ndarray, list[np.ndarray]]] = []  # the first group's slices
    for g in range(meta.num_row_groups):
        t = f.read_row_group(g, columns=TRACE_COLUMNS)
        ids, s, c = (t.column(x).to_numpy() for x in TRACE_COLUMNS[:3])
        dt, (offsets, out) = best(partial(scatter, first, ids, s, c))
        pass1 += dt
        first += ids.size
        end = int(offsets[last])
        kept.append((offsets[:last + 1].copy(), [o[:end].copy() for o in out]))
    names = range(4)
    cols = [np.concatenate([out[i] for _, out in kept]) for i in names]
    base = np.cumsum([0] + [int(o[-1]) for o, _ in kept[:-1]])
    seg = np.array([o for o, _ in kept], np.int64) + base[:, None]

    def group_piece(k: int) -> int:
        starts, ends = np.ascontiguousarray(seg[:, k]), np.ascontiguousarray(seg[:, k + 1])
        n = int((ends - starts).sum())
        span = part.piece_span(k)
        counts = np.zeros(span, np.int64)
        dest = np.empty(n, np.int32)
        loops["batch_keys"](cols[0], starts, ends, part.piece_lo(k), True, counts, dest)
        for i in (1, 2, 3):
            loops["place_into"](cols[i], starts, ends, dest, np.empty(n, np.int64))
        bid, inv = np.empty(n, np.int64), np.empty(n, np.int64)
        return int(loops["grouped_ids"](counts, part.piece_lo(k), bid, inv,
                                        np.empty(min(n, span), np.int64)))

    pass2_group = 0.0
    for k in range(last):
        dt, _ = best(partial(group_piece, k))
        pass2_group += dt
    grouped = int(cols[0].size)
    pass2 = pass2_group * first / max(grouped, 1)
    return {"seconds": pass1 + pass2, "cpu": pass1 + pass2, "pass1_cpu": pass1,
            "pass2_cpu": pass2, "rows": first, "grouped_rows": grouped,
            "peak_rss": _peak_rss_bytes()}


def child(kind: str, trace: str, work: str) -> dict[str, float]:
    _tune_malloc()
    if kind == "read":
        return _read(trace)
    if kind == "moves":
        return _moves(trace, work)
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
