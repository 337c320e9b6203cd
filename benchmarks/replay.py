"""Replay speed: steps/s, requests/s, pricing vs bookkeeping, peak memory, growth with N.

    python benchmarks/replay.py [--scenario S ...] [--requests 10000,100000] [--users 64]

The load is closed loop: ``--users`` sessions, each a chain of requests with no think time,
so about that many requests are running at every step (the issue's "about 64 running").
Prompt 100-2000 tokens, output 10-300 (uniform, seeded). Times are this process's CPU time
(the machine may be shared). Pricing time is the CPU time inside the
replay's one pricing function (kernel/replay/pricing.py); bookkeeping is the rest of the
replay (scheduler, KV, router, the requests table and summary). The steps table is built when
first read (``ReplayResult.steps``): its time is printed apart, and the ratio with it too. Prints one line per run; figures are ratios within
one run, so compare them, not absolute times, across machines.

Warm-up: before each timed replay, the scenario's kernel prices a few steps through the same
pricing function, untimed (:func:`warm_up`): with compiled loops (numba), the first priced
step of a process imports numba and compiles the column aggregates (about a second), which
would otherwise land in the first replay's pricing time (decision EF1); and it replays three
requests, untimed (:func:`warm_engine`), so that loading the compiled engine from numba's
on-disk cache (or compiling it, after a change) is not the first replay's bookkeeping: that
first replay's CPU time is printed apart (decision CE1). With ``BLIS_JIT=0`` the Python engine
runs (kernel/replay/engine.py), for comparison.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import pyarrow as pa


def closed_loop(n: int, users: int, seed: int = 0, output: tuple[int, int] = (10, 300)
                ) -> pa.Table:
    rng = np.random.default_rng(seed)
    session = np.arange(n) % users
    first = np.arange(n) < users
    arrival = np.where(first, rng.integers(0, 10**8, n), -1)
    return pa.table({
        "request_id": pa.array(np.arange(n).astype(str)),
        "arrival_ns": pa.array(arrival, pa.int64(), mask=~first),
        "prompt_tokens": pa.array(rng.integers(100, 2001, n), pa.int64()),
        "output_tokens": pa.array(rng.integers(output[0], output[1] + 1, n), pa.int64()),
        "session_id": pa.array(session.astype(str)),
        "think_ns": pa.array(np.zeros(n, np.int64), pa.int64(), mask=first),
        "stage": pa.array(np.zeros(n, np.int32)),
    })


def warm_up(k: object) -> None:
    """Price a few small steps through the replay's pricing function, untimed: a decode-only
    step, a step with one prefill row and one with two (each takes its own compiled pass), so
    that numba's import and compilation are paid here, not inside the timed replay."""
    from kernel.replay.pricing import price_step

    def a(*v: int) -> np.ndarray:
        return np.array(v, np.int64)

    for sc, cp, pl in ((a(1, 1), a(10, 20), a(10, 20)), (a(1, 300), a(10, 0), a(10, 300)),
                       (a(1, 300, 200), a(10, 0, 0), a(10, 300, 200))):
        price_step(k, sc, cp, pl)  # type: ignore[arg-type]


def warm_engine(k: object) -> float:
    """Replay three requests untimed, so the compiled engine (numba's on-disk cache, or its
    compilation after a change) is loaded before the timed replay; returns that replay's CPU
    seconds (the load itself the first time in a process: decision CE1)."""
    import kernel.replay.api as api

    t0 = time.process_time()
    api.replay(k, closed_loop(3, 1, output=(2, 3)), api.ReplayOptions(dp=1))
    return time.process_time() - t0


def run(scenario: str, n: int, users: int, keep_steps: bool = True,
        output: tuple[int, int] = (10, 300), source: object = None) -> dict[str, float]:
    import kernel
    import kernel.replay.api as api

    k = kernel.open(scenario)
    warm_up(k)
    warmed = warm_engine(k)
    spent = [0.0]
    orig = api.price_step

    def timed(*a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.process_time()
        try:
            return orig(*a, **kw)
        finally:
            spent[0] += time.process_time() - t0

    api.price_step = timed
    table = source if source is not None else closed_loop(n, users, output=output)
    t0, c0 = time.perf_counter(), time.process_time()
    res = api.replay(k, table, api.ReplayOptions(dp=1, keep_steps=keep_steps))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    api.price_step = orig
    c1 = time.process_time()
    res.steps.num_rows  # noqa: B018 (built on first read)
    table_s = time.process_time() - c1
    steps = res.summary["engine_steps"]
    return {"wall_s": wall, "cpu_s": cpu, "pricing_s": spent[0], "steps": steps,
            "steps_table_s": table_s, "warm_s": warmed,
            "running": res.summary["batch_requests_mean"],
            "hit_rate": res.summary["prefix_hit_rate"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def time_experiments(scenario: str, dirs: list[str]) -> None:
    """Wall time of a whole replay (load generation + replay + result tables) per
    experiment: the figure the sim-to-real study's runtime.csv gives each simulator."""
    import kernel
    from kernel.replay import generate, inference_perf_spec
    from kernel.replay.api import ReplayOptions, replay

    k = kernel.open(scenario)
    times = []
    print(f"cores: {os.cpu_count()}")
    for d in dirs:
        t0 = time.perf_counter()
        rs = generate(inference_perf_spec(d), seed=0)
        res = replay(k, rs, ReplayOptions(dp=1))
        times.append(time.perf_counter() - t0)
        print(f"{os.path.basename(d.rstrip('/'))}: {rs.table.num_rows:,} requests, "
              f"{res.summary['engine_steps']:,} steps, {times[-1]:.2f}s, prefix hit rate "
              f"{res.summary['prefix_hit_rate']:.3f}")
    print(f"median {float(np.median(times)):.2f}s per experiment over {len(times)} ({scenario})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", action="append",
                    default=None, help="repeatable (default: a dense and an MoE scenario)")
    ap.add_argument("--requests", default="10000,100000")
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--output", default="10:300", help="output tokens LO:HI (uniform)")
    ap.add_argument("--no-steps", action="store_true",
                    help="keep_steps=False: no steps table (large replays)")
    ap.add_argument("--trace", action="append", default=[],
                    help="also replay this request file (read_requests; repeatable)")
    ap.add_argument("--inference-perf", nargs="*", default=None, metavar="DIR",
                    help="time the replay of each inference-perf experiment directory's load "
                         "(inference_perf_spec + generate, seed 0) on the first scenario; "
                         "prints the median seconds per experiment (sim-to-real comparison)")
    a = ap.parse_args()
    if a.inference_perf is not None:
        time_experiments((a.scenario or ["llama-3.1-8b-h100-tp1"])[0], a.inference_perf)
        return
    lo, hi = (int(x) for x in a.output.split(":"))
    scenarios = a.scenario or ["llama-3.1-8b-h100-tp1", "qwen3-30b-a3b-h100-tp2"]
    from kernel.replay import jit_driver

    print(f"cores: {os.cpu_count()}; engine: "
          f"{'compiled' if jit_driver.available() else 'Python (numba off)'}")
    first = True  # (the process's first replay loads the compiled engine: printed apart)
    for s in scenarios:
        base = None
        for n in (int(x) for x in a.requests.split(",")):
            f = run(s, n, a.users, not a.no_steps, (lo, hi))
            book = f["cpu_s"] - f["pricing_s"]
            per = book / max(f["steps"], 1) * 1e6
            growth = "" if base is None else f" cpu/request vs first {f['cpu_s'] / n / base:.2f}x"
            base = base or f["cpu_s"] / n
            if first:
                print(f"(first replay of the process, untimed: {f['warm_s']:.2f}s of CPU, "
                      f"the compiled engine loaded from numba's cache or compiled)")
                first = False
            print(f"{s} n={n:,} steps={f['steps']:,} mean batch {f['running']:.1f} "
                  f"wall {f['wall_s']:.1f}s cpu {f['cpu_s']:.1f}s "
                  f"({f['steps'] / f['cpu_s']:,.0f} steps/s, {n / f['cpu_s']:,.0f} req/s of cpu) "
                  f"pricing {f['pricing_s']:.1f}s "
                  f"bookkeeping {book:.1f}s = {book / f['pricing_s']:.2f}x pricing "
                  f"({per:.0f} us/step); steps table on first read {f['steps_table_s']:.1f}s "
                  f"({(book + f['steps_table_s']) / f['pricing_s']:.2f}x with it) "
                  f"peak RSS {f['peak_rss_mib']:,.0f} MiB{growth}")
        for path in a.trace:
            from kernel.replay import read_requests  # type: ignore[attr-defined]

            rs = read_requests(path)
            f = run(s, rs.table.num_rows, a.users, not a.no_steps, source=rs)
            book = f["cpu_s"] - f["pricing_s"]
            print(f"{s} trace {path}: {rs.table.num_rows:,} requests, {f['steps']:,} steps, "
                  f"cpu {f['cpu_s']:.1f}s ({f['steps'] / f['cpu_s']:,.0f} steps/s, "
                  f"{rs.table.num_rows / f['cpu_s']:,.0f} req/s), bookkeeping "
                  f"{book / f['pricing_s']:.2f}x pricing, prefix hit rate "
                  f"{f['hit_rate']:.3f}")


if __name__ == "__main__":
    main()
