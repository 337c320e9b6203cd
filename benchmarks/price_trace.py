"""Benchmark: bulk pricing parquet -> parquet, every issue-13 bulk target as a ratio in one run.

    python benchmarks/price_trace.py                     # 1M batches, all ratios (a few minutes)
    python benchmarks/price_trace.py --big               # also the 10M-batch ratios and RSS
    python benchmarks/price_trace.py --rss-sizes 1000000,10000000,30000000  # sorted RSS by size
    python benchmarks/price_trace.py --big --compare ../old-checkout  # the big runs old vs now
    python benchmarks/price_trace.py --big --big-batches 100000000 --requests-per-batch 4 \
        --shuffle buckets --big-repeat 1 --dir DIR  # 100M batches on ~15 GB of disk
    python benchmarks/price_trace.py --_child file-passes TRACE OUT SCENARIO  # one run, a
        # spill's two passes timed apart (wall and CPU each)

It generates a synthetic trace (32 requests per batch on average, ~5% prefill rows, sorted by
``batch_id``) and from it the same rows in other orders (batches reversed, request-major,
fully shuffled, one batch misplaced late in the file). Every measurement runs in a fresh child
process, so the peak RSS printed (``resource.getrusage``) is that of the measured work alone;
times are the best of ``--repeat`` runs, interleaved so that load on this shared machine hits
every variant alike. Figures printed:

* end-to-end ``price_file`` / (a plain pyarrow read of the trace's columns + a write of the
  priced table) on the same files, in the same run;
* CPU time / wall time of ``price_file`` (how many cores it keeps busy);
* each row order / the sorted trace;
* in-memory ``k.price`` / ``price_file`` on the same trace, and the in-memory peak RSS over the
  input table's size;
* with ``--big``: request-major and shuffled ÷ sorted at ``--big-batches`` (10M) batches,
  beyond the default ``memory_budget`` (mode ``spill``, issue 31), each with its peak RSS;
* with ``--rss-sizes``: peak RSS of the sorted trace at each size, and the largest ÷ the
  smallest (issue 31: flat within 10% from 1M to 30M).

Every child tunes glibc's malloc first (``kernel.io.malloc.tune``), as the command line does (a
library call does it only when asked), so before and after run under the same settings.

``BEFORE`` holds the same figures measured on the code before the issue-13 rewrite and
``AFTER_IO`` those after the pyarrow.dataset rewrite (request-major and shuffled traces then
went through DuckDB's sort), so one run prints before, io, now and the target side by side.
The request-major trace is now summed per batch as it streams (``summed`` mode), the shuffled
one scattered to pieces of whole batches in memory (``sorted`` mode); at 10M batches, beyond
``memory_budget``, the request-major trace, whose batch ids advance through the file, is
grouped in a moving window of pieces, each priced once the parquet statistics show it
complete (``window`` mode, decision SP1), and the shuffled one partitioned to disk by batch-id
range and grouped one spill group at a time (``spill`` mode; before issue 31 both went through
DuckDB's sort, ``external``). The mode of each run is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
ORDERS = ("sorted", "reversed", "request-major", "shuffled", "late")
TRACE_COLUMNS = ["batch_id", "scheduled", "computed", "prompt_len"]

# Measured on main before the rewrite (commit 9fe4957, 1 Dec 2026 ~01:00 UTC, best of 3) with
# this script: (wall-time ratio, CPU-time ratio). The 2 cores were shared with seven other
# jobs (1-minute load 8), so wall times ran at about half a core; the CPU-time ratios are the
# steadier ones. The 10M sorted RSS is the figure the README gave for that code.
BEFORE: dict[str, tuple[float | None, float | None]] = {
    "e2e / pyarrow read+write": (0.53, 0.45),
    "CPU / wall (sorted)": (0.49, None),
    "reversed / sorted": (2.39, 2.80),
    "request-major / sorted": (4.00, 4.48),
    "shuffled / sorted": (10.55, 10.52),
    "late / sorted": (1.63, 2.97),
    "k.price / price_file": (2.67, 3.03),
    "k.price peak RSS / input table": (4.41, None),
    "peak RSS 10M sorted (GiB)": (0.49, None),
}

# The same figures after the pyarrow.dataset rewrite (helper io, 1 Dec 2026 ~02:40 UTC, best
# of 3, load 5.5), when request-major and shuffled traces went through DuckDB's sort of every
# row: (wall-time ratio, CPU-time ratio).
AFTER_IO: dict[str, tuple[float | None, float | None]] = {
    "e2e / pyarrow read+write": (0.78, 0.74),
    "CPU / wall (sorted)": (1.00, None),
    "reversed / sorted": (0.68, 0.60),
    "request-major / sorted": (5.21, 4.24),
    "shuffled / sorted": (7.04, 4.48),
    "late / sorted": (1.34, 0.82),
    "k.price / price_file": (0.47, 0.47),
    "k.price peak RSS / input table": (1.82, None),
    "peak RSS 10M sorted (GiB)": (0.65, None),
    "peak RSS 10M shuffled (GiB)": (1.43, None),
}

TARGETS = {
    "e2e / pyarrow read+write": ("<=", 1.6),
    "CPU / wall (sorted)": (">=", 1.7),
    "reversed / sorted": ("<=", 1.5),
    "request-major / sorted": ("<=", 1.5),
    "shuffled / sorted": ("<=", 1.5),
    "late / sorted": ("<=", 1.5),
    "k.price / price_file": ("<=", 1.2),
    "k.price peak RSS / input table": ("<=", 3.0),
    "peak RSS 10M sorted (GiB)": ("<=", 1.0),
    "peak RSS 10M shuffled (GiB)": ("<=", 2.0),
    "peak RSS 10M request-major (GiB)": ("<=", 2.0),
    "request-major / sorted (10M)": ("<=", 1.5),
    "shuffled / sorted (10M)": ("<=", 1.5),
    "sorted peak RSS, largest / smallest": ("<=", 1.1),
}
BIG_ORDERS = ("sorted", "request-major", "shuffled")


def _peak_rss_bytes() -> int:
    # VmHWM: this process image's peak (ru_maxrss would carry the parent's across exec)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss if sys.platform == "darwin" else rss * 1024


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


# -- children (one measurement each) -------------------------------------------------------

def _tune_malloc() -> None:
    """What the command line does (:func:`kernel.io.malloc.tune`), the same in every child and
    first, before numpy starts its threads."""
    from kernel.io.malloc import tune

    tune()


def child(kind: str, trace: str, out: str, scenario: str) -> dict[str, float]:
    _tune_malloc()
    if kind == "pyarrow":
        import pyarrow as pa
        import pyarrow.parquet as pq

        priced = pq.read_table(out)  # the priced table to write (not timed)
        c0, t0 = _cpu(), time.perf_counter()
        tbl = pq.read_table(trace, columns=TRACE_COLUMNS)
        # the same encoding price_file uses: lz4, dictionaries for text columns only
        text = [f.name for f in priced.schema if not pa.types.is_integer(f.type)]
        pq.write_table(priced, out + ".pa.parquet", compression="lz4", use_dictionary=text,
                       row_group_size=1 << 18)
        dt = time.perf_counter() - t0
        del tbl
        return {"seconds": dt, "cpu": _cpu() - c0, "peak_rss": _peak_rss_bytes()}
    import kernel

    k = kernel.open(scenario)
    if kind in ("file", "file-passes"):
        from kernel.bulk import price_file

        passes = _timing_passes() if kind == "file-passes" else None
        c0, t0 = _cpu(), time.perf_counter()
        c = price_file(k, trace, out, progress=False)
        dt = time.perf_counter() - t0
        got = {"seconds": dt, "cpu": _cpu() - c0, "peak_rss": _peak_rss_bytes(),
               "batches": c.batches_priced, "rows": c.rows_in,
               "mode": c.mode}  # type: ignore[dict-item]  # (printed, never summed)
        if passes:  # (a spill run: pass 1 ends when the spill files are complete)
            got["pass1_seconds"], got["pass1_cpu"] = passes[0] - t0, passes[1] - c0
            got["pass2_seconds"], got["pass2_cpu"] = t0 + dt - passes[0], got["cpu"] - passes[1] + c0
        return got
    if kind == "memory":
        import polars as pl

        df = pl.read_parquet(trace, columns=TRACE_COLUMNS)
        size = df.estimated_size()
        c0, t0 = _cpu(), time.perf_counter()
        priced = k.price(df)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "cpu": _cpu() - c0, "peak_rss": _peak_rss_bytes(),
                "table_bytes": size, "batches": priced.height}
    raise SystemExit(f"unknown child {kind}")


def _timing_passes() -> list[float]:
    """Where a spill run's pass 1 ends (wall clock, process CPU), filled in when its spill files
    are complete (``SpillFiles.finish``): the ``file-passes`` child (docs/traces.md, SW5)."""
    from kernel.bulk import spill

    mark: list[float] = []
    finish = spill.SpillFiles.finish

    def timed(self: spill.SpillFiles) -> None:
        finish(self)
        mark[:] = [time.perf_counter(), _cpu()]

    spill.SpillFiles.finish = timed  # type: ignore[method-assign]
    return mark


def run_child(kind: str, trace: Path, out: Path, scenario: str,
              code: Path | None = None) -> dict[str, float]:
    """One measurement in a fresh process; ``code``: with this script and ``kernel`` from
    another checkout (``--compare``)."""
    script = Path(__file__) if code is None else code / "benchmarks" / "price_trace.py"
    env = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    res = subprocess.run([sys.executable, str(script), "--_child", kind, str(trace), str(out),
                          scenario], capture_output=True, text=True, env=env,
                         cwd=None if code is None else code)
    if res.returncode:
        raise SystemExit(f"child {kind} {trace.name} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# -- traces --------------------------------------------------------------------------------

def make_traces(work: Path, batches: int, orders: tuple[str, ...], rpb: float = 32.0,
                shuffle: str = "duckdb") -> dict[str, Path]:
    """The sorted trace of ``batches`` batches of ``rpb`` requests on average, and the same rows
    in each of ``orders``, generated once into ``work`` (kept). A trace of other than 32
    requests a batch carries ``-rRPB`` in its name; ``shuffle="buckets"`` writes the shuffled
    order by :func:`shuffle_file` rather than DuckDB's sort (a file name ``-bucket``)."""
    import duckdb
    import pyarrow.parquet as pq

    from kernel.io.synth import write_synth

    tag = f"{batches}" if rpb == 32.0 else f"{batches}-r{rpb:g}"
    names = {o: f"{o}-bucket" if o == "shuffled" and shuffle == "buckets" else o
             for o in orders}
    paths = {o: work / f"trace-{tag}-{names[o]}.parquet" for o in orders}
    base = work / f"trace-{tag}-sorted.parquet"
    if not base.exists():
        _check_space(work, batches * rpb * 4, "the sorted trace")
        t0 = time.perf_counter()
        st = write_synth(base, batches, seed=0, request_ids=True, requests_per_batch=rpb)
        print(f"generated {st.batches:,} batches / {st.rows:,} request rows "
              f"({st.requests_per_batch:.1f}/batch, {st.prefill_share:.1%} prefill rows) in "
              f"{time.perf_counter() - t0:.1f}s ({base.stat().st_size / 2**20:.0f} MiB)",
              flush=True)
    order_by = {
        "reversed": "batch_id DESC, rn",  # batches in reverse, requests in order
        "request-major": "request_id, batch_id",  # the log written request by request
        "shuffled": "hash(rn * 7919 + 13)",  # every row anywhere
        # one early batch's rows moved near the end of the file
        "late": f"CASE WHEN batch_id = {batches // 10} THEN {batches} * 0.95 "
                "ELSE batch_id END, rn",
    }
    con = duckdb.connect()
    con.execute(f"SET temp_directory = '{work / 'duckdb.tmp'}'")
    con.execute("SET memory_limit = '4GB'")
    con.execute("SET preserve_insertion_order = true")
    rows = pq.ParquetFile(base).metadata.num_rows
    for o in orders:
        if o == "sorted" or paths[o].exists():
            continue
        t0 = time.perf_counter()
        if o == "shuffled" and shuffle == "buckets":
            _check_space(work, rows * 28 * 2, "the bucket shuffle (buckets + output)")
            shuffle_file(base, paths[o], work)
        else:
            _check_space(work, rows * 40, f"DuckDB's sort for the {o} trace")
            con.execute(f"""COPY (SELECT * EXCLUDE (rn) FROM (
                    SELECT *, row_number() OVER () AS rn FROM read_parquet('{base}'))
                    ORDER BY {order_by[o]}) TO '{paths[o]}'
                    (FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE 1048576)""")
        print(f"wrote the {o} trace in {time.perf_counter() - t0:.1f}s "
              f"({paths[o].stat().st_size / 2**30:.2f} GiB)", flush=True)
    return paths


MIN_FREE = 8 << 30  # the disk is shared: never leave less than this free


def _check_space(work: Path, need: float, what: str) -> None:
    """Refuse to start writing ``what`` (about ``need`` bytes) if it would leave less than
    :data:`MIN_FREE` free on ``work``'s disk."""
    import shutil

    free = shutil.disk_usage(work).free
    if free - need < MIN_FREE:
        raise SystemExit(f"{what} needs about {need / 2**30:.1f} GiB in {work}, "
                         f"{free / 2**30:.1f} GiB are free and {MIN_FREE / 2**30:.0f} must stay "
                         "free: not generated")


def shuffle_file(src: Path, dst: Path, work: Path, seed: int = 1,
                 bucket_rows: int = 4 << 20) -> None:
    """Every row of ``src`` in a uniformly random order, in two linear passes (a DuckDB sort
    of a few hundred million rows takes a quarter of an hour on 2 cores): each row goes to
    one of ``rows / bucket_rows`` bucket files at random (Arrow IPC), then each bucket is
    permuted in memory and appended to ``dst`` (lz4, 1 Mi-row row groups). A random bucket
    then a random permutation within it is a uniform permutation of the whole."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = pq.ParquetFile(src)
    n_buckets = max(1, -(-f.metadata.num_rows // bucket_rows))
    rng = np.random.default_rng(seed)
    tmp = work / f".shuffle-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    try:
        sinks = [pa.OSFile(str(tmp / f"{b:05d}.arrow"), "wb") for b in range(n_buckets)]
        writers = [pa.ipc.new_stream(s, f.schema_arrow) for s in sinks]
        for rb in f.iter_batches(batch_size=1 << 20):
            key = rng.integers(0, n_buckets, rb.num_rows, dtype=np.uint16)
            order = np.argsort(key, kind="stable")
            cuts = np.searchsorted(key[order], np.arange(n_buckets + 1, dtype=np.int64))
            taken = rb.take(pa.array(order))
            for b in range(n_buckets):
                if cuts[b + 1] > cuts[b]:
                    writers[b].write_batch(taken.slice(cuts[b], cuts[b + 1] - cuts[b]))
        for w, s in zip(writers, sinks, strict=True):
            w.close()
            s.close()
        with pq.ParquetWriter(str(dst) + ".tmp", f.schema_arrow, compression="lz4") as pw:
            for b in range(n_buckets):
                path = tmp / f"{b:05d}.arrow"
                with pa.memory_map(str(path)) as m:
                    t = pa.ipc.open_stream(m).read_all()
                path.unlink()
                pw.write_table(t.take(pa.array(rng.permutation(t.num_rows))),
                               row_group_size=1 << 20)
                del t
        os.replace(str(dst) + ".tmp", dst)
    finally:
        for p in tmp.glob("*"):
            p.unlink()
        tmp.rmdir()


# -- main ----------------------------------------------------------------------------------

def figures(best: dict[str, dict[str, float]], orders: tuple[str, ...]
            ) -> tuple[dict[str, float], dict[str, float]]:
    """The issue's ratios from the best runs: (wall-time figures, CPU-time figures)."""
    s = best["sorted"]
    wall: dict[str, float] = {
        "e2e / pyarrow read+write": s["seconds"] / best["pyarrow"]["seconds"],
        "CPU / wall (sorted)": s["cpu"] / s["seconds"],
    }
    cpu: dict[str, float] = {"e2e / pyarrow read+write": s["cpu"] / best["pyarrow"]["cpu"]}
    for o in orders[1:]:
        wall[f"{o} / sorted"] = best[o]["seconds"] / s["seconds"]
        cpu[f"{o} / sorted"] = best[o]["cpu"] / s["cpu"]
    wall["k.price / price_file"] = best["memory"]["seconds"] / s["seconds"]
    cpu["k.price / price_file"] = best["memory"]["cpu"] / s["cpu"]
    wall["k.price peak RSS / input table"] = (best["memory"]["peak_rss"]
                                              / best["memory"]["table_bytes"])
    return wall, cpu


def big_label(batches: int) -> str:
    """How the big traces' figures are named: ``10M`` (the issue's targets name that size)."""
    return f"{batches / 1e6:g}M"


def big_figures(best: dict[str, dict[str, float]], fig: dict[str, float],
                cpu: dict[str, float], label: str = "10M") -> None:
    """The ``--big`` and ``--rss-sizes`` figures, added to ``fig`` (wall) and ``cpu``;
    ``label``: the big traces' size (:func:`big_label`)."""
    for o in BIG_ORDERS:
        if f"big-{o}" in best:
            fig[f"peak RSS {label} {o} (GiB)"] = best[f"big-{o}"]["peak_rss"] / 2**30
    s = best.get("big-sorted")
    for o in BIG_ORDERS[1:]:
        if s is not None and f"big-{o}" in best:
            fig[f"{o} / sorted ({label})"] = best[f"big-{o}"]["seconds"] / s["seconds"]
            cpu[f"{o} / sorted ({label})"] = best[f"big-{o}"]["cpu"] / s["cpu"]
    rss = sorted((int(k[4:]), v["peak_rss"]) for k, v in best.items() if k.startswith("rss-"))
    if len(rss) > 1:
        fig["sorted peak RSS, largest / smallest"] = rss[-1][1] / rss[0][1]


def _fmt(name: str, v: float | None) -> str:
    return "-" if v is None else (f"{v:.2f}" if "GiB" in name or "/" in name else f"{v:.3g}")


def run_all(args: argparse.Namespace, orders: tuple[str, ...],
            best: dict[str, dict[str, float]]) -> None:
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="blis-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    traces = make_traces(work, args.batches, orders)
    out = work / "priced.parquet"

    def keep(key: str, r: dict[str, float]) -> None:
        if key not in best or r["seconds"] < best[key]["seconds"]:
            best[key] = r

    for _ in range(max(args.repeat, 1)):
        for o in orders:
            keep(o, run_child("file", traces[o], out, args.scenario))
            if o == "sorted":
                keep("pyarrow", run_child("pyarrow", traces[o], out, args.scenario))
                keep("memory", run_child("memory", traces[o], out, args.scenario))

    if args.big:
        big = make_traces(work, args.big_batches, BIG_ORDERS, args.requests_per_batch,
                          args.shuffle)
        for _ in range(max(args.big_repeat, 1)):  # (interleaved, as above)
            for o in BIG_ORDERS:
                keep(f"big-{o}", run_child("file", big[o], work / "priced-big.parquet",
                                           args.scenario))
                if args.compare:  # the other checkout, right after on the same trace
                    keep(f"old-big-{o}", run_child("file", big[o], work / "priced-big.parquet",
                                                   args.scenario, Path(args.compare)))
    for n in args.rss_sizes:
        t = make_traces(work, n, ("sorted",))["sorted"]
        best[f"rss-{n}"] = run_child("file", t, work / "priced-rss.parquet", args.scenario)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--big", action="store_true", help="also the 10M-batch RSS checks")
    ap.add_argument("--big-batches", type=int, default=10_000_000)
    ap.add_argument("--big-repeat", type=int, default=1, help="best of this many big runs")
    ap.add_argument("--requests-per-batch", type=float, default=32.0,
                    help="requests a batch on average in the big traces (fewer rows a batch: "
                         "100M batches of 4 fit a disk that 100M of 32 would not)")
    ap.add_argument("--shuffle", choices=("duckdb", "buckets"), default="duckdb",
                    help="how the big shuffled trace is written: DuckDB's ORDER BY hash, or "
                         "a two-pass random bucket shuffle (minutes instead of an hour at "
                         "100M batches)")
    ap.add_argument("--rss-sizes", type=lambda v: [int(x) for x in v.split(",") if x],
                    default=[], help="sorted traces of these batch counts: peak RSS each")
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--scenario", default=DEFAULT_SCENARIO)
    ap.add_argument("--dir", default=None, help="where traces go (kept; default: a tmp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--before-json", default=None,
                    help="print figures of an earlier --json run as BEFORE")
    ap.add_argument("--report", default=None,
                    help="print the figures of an earlier --json run instead of running")
    ap.add_argument("--compare", default=None, metavar="CHECKOUT",
                    help="with --big: each big run also with the code of this other checkout "
                         "(e.g. a `git worktree` of main), interleaved, printed as 'old'")
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(*args._child)))
        return 0
    orders = tuple(o for o in args.orders.split(",") if o)
    if "sorted" not in orders:
        orders = ("sorted", *orders)
    best: dict[str, dict[str, float]] = {}
    if args.report:
        best = json.loads(Path(args.report).read_text())["runs"]
    else:
        run_all(args, orders, best)
    fig, cpu_fig = figures(best, orders)
    label = big_label(args.big_batches)
    big_figures(best, fig, cpu_fig, label)
    s = best["sorted"]
    if args.before_json:
        old = json.loads(Path(args.before_json).read_text())["runs"]
        w, c = figures(old, orders)
        big_figures(old, w, c, label)
        BEFORE.clear()
        BEFORE.update({k: (v, c.get(k)) for k, v in w.items()})
    print(f"\nscenario {args.scenario}, {s['batches']:,.0f} batches, {s['rows']:,.0f} request "
          f"rows, {os.cpu_count()} cores, 1-min load {os.getloadavg()[0]:.1f}, "
          f"best of {args.repeat}")
    print(f"  sorted price_file {s['seconds']:.2f}s ({s['batches'] / s['seconds']:,.0f} steps/s,"
          f" peak RSS {s['peak_rss'] / 2**30:.2f} GiB); pyarrow read+write "
          f"{best['pyarrow']['seconds']:.2f}s; k.price {best['memory']['seconds']:.2f}s "
          f"(peak RSS {best['memory']['peak_rss'] / 2**30:.2f} GiB)")
    for o in orders[1:]:
        print(f"  {o:<14} {best[o]['seconds']:.2f}s wall, {best[o]['cpu']:.2f}s CPU, "
              f"peak RSS {best[o]['peak_rss'] / 2**30:.2f} GiB ({best[o].get('mode', '?')})")
    print(f"\n  {'figure':<34} {'before':>7} {'io':>6} {'now':>6}   target      "
          f"{'CPU-time ratio: before':>22} {'io':>6} {'now':>6}")
    for name, v in fig.items():
        op, t = TARGETS[name.replace(f" {label}", " 10M").replace(f"({label})", "(10M)")]
        ok = (v <= t) if op == "<=" else (v >= t)
        before = BEFORE.get(name, (None, None))
        io = AFTER_IO.get(name, (None, None))
        print(f"  {name:<34} {_fmt(name, before[0]):>7} {_fmt(name, io[0]):>6} "
              f"{_fmt(name, v):>6}   {op} {t:<4} {'ok' if ok else 'MISSED':<6} "
              f"{_fmt(name, before[1]):>16} {_fmt(name, io[1]):>6} "
              f"{_fmt(name, cpu_fig.get(name)):>6}")
    print("  (wall-time ratios are the targets; CPU-time ratios show the same work with the "
          "other jobs on this shared machine taken out)")
    if any(f"big-{o}" in best for o in BIG_ORDERS):
        b = best.get("big-sorted") or next(best[f"big-{o}"] for o in BIG_ORDERS
                                           if f"big-{o}" in best)
        print(f"  big traces: {args.big_batches:,} batches, "
              f"{args.requests_per_batch:g} requests a batch asked ({b['rows'] / b['batches']:.1f} "
              f"rows a batch), shuffled by {args.shuffle}, best of {args.big_repeat}")
    for o in BIG_ORDERS:
        if f"big-{o}" in best:
            b = best[f"big-{o}"]
            print(f"  big {o:<14} {b['batches']:,.0f} batches: {b['seconds']:.2f}s wall, "
                  f"{b['cpu']:.2f}s CPU, peak RSS {b['peak_rss'] / 2**30:.2f} GiB "
                  f"({b.get('mode', '?')})")
    so, sn = best.get("old-big-sorted"), best.get("big-sorted")
    for o in BIG_ORDERS[1:]:
        if so is not None and sn is not None and f"old-big-{o}" in best:
            b, n_ = best[f"old-big-{o}"], best[f"big-{o}"]
            print(f"  {o} ÷ sorted, old → now: wall {b['seconds'] / so['seconds']:.2f} → "
                  f"{n_['seconds'] / sn['seconds']:.2f}, CPU {b['cpu'] / so['cpu']:.2f} → "
                  f"{n_['cpu'] / sn['cpu']:.2f}, peak RSS {b['peak_rss'] / 2**30:.2f} → "
                  f"{n_['peak_rss'] / 2**30:.2f} GiB ({b.get('mode', '?')} → "
                  f"{n_.get('mode', '?')})")
    for n in args.rss_sizes:
        b = best[f"rss-{n}"]
        print(f"  sorted {n:>12,} batches: {b['seconds']:.2f}s wall, peak RSS "
              f"{b['peak_rss'] / 2**30:.3f} GiB ({b.get('mode', '?')})")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": fig, "cpu_figures": cpu_fig,
                                               "runs": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
