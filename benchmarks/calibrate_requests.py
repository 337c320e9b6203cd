"""Request-log calibration on the sim-to-real study (issue 32 item 7, docs/accuracy.md).

    python benchmarks/calibrate_requests.py time --exp 16 --duration-scale 0.1
        # the time of one request-log calibration of one experiment (its stage aggregates)
    python benchmarks/calibrate_requests.py loo --duration-scale 0.1 -o out/rc-loo
        # leave-one-experiment-out within each (model, chip) group; prints the table

``loo`` writes ``folds.csv`` (one row per experiment and metric: fitted scale, predicted,
actual, MAPE, signed error) and prints the per-experiment table and the medians beside the
study's simulators over the same experiments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _exps(which: str | None) -> list:
    from kernel.replay.simtoreal.catalogue import experiments

    exps = experiments()
    if which:
        ids = {int(x) for x in which.split(",")}
        exps = [e for e in exps if e.exp_id in ids]
    return exps


def cmd_time(args: argparse.Namespace) -> None:
    from kernel.calibration.requests_fit import from_requests
    from kernel.calibration.requests_loo import experiment_run
    from kernel.replay.simtoreal.study import load_measured

    exp = _exps(str(args.exp))[0]
    measured = load_measured()
    best = None
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        run = experiment_run(exp, measured, duration_scale=args.duration_scale)
        cal = from_requests(run, parameters=tuple(args.parameters.split(",")),
                            start=args.start, refine=args.refine)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if best is None or wall < best[0]:
            best = (wall, cpu, cal)
    assert best is not None
    wall, cpu, cal = best
    fit = cal.document["fit"]
    print(f"cores: {os.cpu_count()}  experiment {exp.exp_id} ({exp.model}, {exp.chip}, TP "
          f"{exp.tp}, {exp.workload}), stages x{args.duration_scale}: "
          f"{len(run.requests):,} requests per replay")
    print(f"fitted {fit['parameters']}  loss {fit['loss']:.4g} (start "
          f"{fit['loss_at_start']:.4g})  evaluations {fit['evaluations']}  replays "
          f"{fit['replays']}")
    print(f"request-log calibration: {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({wall / max(fit['replays'], 1):.2f} s per replay); best of {args.repeats}")


def _table(folds_df: pl.DataFrame) -> str:
    from kernel.replay.simtoreal.study import load_simulators

    sims = load_simulators()
    ids = folds_df["exp_id"].unique().to_list()
    bl = sims.filter(pl.col("exp_id").is_in(ids) & (pl.col("stage_index") == -1))
    lines = ["| exp | group | trained on | fitted scale | TTFT (signed) | ITL (signed) | "
             "E2E (signed) | BLIS TTFT | BLIS ITL | BLIS E2E |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (eid,), g in folds_df.sort("exp_id").group_by("exp_id", maintain_order=True):
        m = {r["metric"]: r for r in g.iter_rows(named=True)}
        b = {r["metric"]: r["mape"] for r in bl.filter(
            (pl.col("exp_id") == eid) & (pl.col("simulator") == "blis-trained-physics")
        ).iter_rows(named=True)}
        first = g.row(0, named=True)

        def cell(x: dict | None) -> str:
            return "–" if x is None else f"{x['mpe']:+.1f}%"

        def bcell(v: float | None) -> str:
            return "–" if v is None else f"{v:.1f}%"
        lines.append(f"| {eid} | {first['group']} | {first['trained_on']} | "
                     f"{first['scale']:.3f} | {cell(m.get('ttft_mean'))} | "
                     f"{cell(m.get('itl_mean'))} | {cell(m.get('e2e_mean'))} | "
                     f"{bcell(b.get('ttft_mean'))} | {bcell(b.get('itl_mean'))} | "
                     f"{bcell(b.get('e2e_mean'))} |")
    med = folds_df.group_by("metric").agg(pl.col("mape").median())
    ours = {r["metric"]: r["mape"] for r in med.iter_rows(named=True)}
    bmed = bl.group_by("simulator", "metric").agg(pl.col("mape").median(),
                                                  pl.col("exp_id").n_unique().alias("n"))
    lines += ["", "| simulator | experiments | ttft_mean | itl_mean | e2e_mean |",
              "| --- | --- | --- | --- | --- |",
              f"| request-log calibrated replay (LOO) | {len(ids)} | "
              f"{ours.get('ttft_mean', float('nan')):.1f}% | "
              f"{ours.get('itl_mean', float('nan')):.1f}% | "
              f"{ours.get('e2e_mean', float('nan')):.1f}% |"]
    for (sim,), g in bmed.sort("simulator").group_by("simulator", maintain_order=True):
        d = {r["metric"]: r for r in g.iter_rows(named=True)}
        if not all(k in d for k in ("ttft_mean", "itl_mean", "e2e_mean")):
            continue
        lines.append(f"| {sim} | {d['itl_mean']['n']} | {d['ttft_mean']['mape']:.1f}% | "
                     f"{d['itl_mean']['mape']:.1f}% | {d['e2e_mean']['mape']:.1f}% |")
    return "\n".join(lines)


def cmd_loo(args: argparse.Namespace) -> None:
    from kernel.calibration.requests_loo import leave_one_out
    from kernel.replay.simtoreal.study import load_measured

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()

    def progress(fold) -> None:  # type: ignore[no-untyped-def]
        for r in fold.scores.iter_rows(named=True):
            rows.append({"exp_id": fold.exp_id, "group": fold.group,
                         "trained_on": " ".join(str(x) for x in fold.trained_on),
                         "scale": fold.values.get("scale", 1.0), "metric": r["metric"],
                         "predicted_ms": r["predicted_ms"], "actual_ms": r["actual_ms"],
                         "mape": r["mape"], "mpe": r["mpe"], "replays": fold.replays,
                         "seconds": fold.seconds})
        pl.DataFrame(rows).write_csv(out / "folds.csv")
        print(f"exp {fold.exp_id}: scale {fold.values.get('scale', 1.0):.3f}  "
              + "  ".join(f"{r['metric']} {r['mpe']:+.1f}%" for r in
                          fold.scores.iter_rows(named=True))
              + f"  ({fold.replays} replays, {fold.seconds:.0f} s)", flush=True)

    leave_one_out(_exps(args.exp), load_measured(), parameters=tuple(args.parameters.split(",")),
                  start=args.start, refine=args.refine, duration_scale=args.duration_scale,
                  progress=progress)
    print(f"\n{time.perf_counter() - t0:.0f} s wall, {os.cpu_count()} cores\n")
    print(_table(pl.DataFrame(rows)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("time", "loo"):
        p = sub.add_parser(name)
        p.add_argument("--duration-scale", type=float, default=0.1,
                       help="stage durations × this (rates unchanged): the replayed subsample")
        p.add_argument("--parameters", default="scale")
        p.add_argument("--start", default="no_overlap", choices=["no_overlap", "overlap"])
        p.add_argument("--refine", type=int, default=10 if name == "time" else 0,
                       help="golden-section steps after the grid and its parabola")
    sub.choices["time"].add_argument("--exp", type=int, default=16)
    sub.choices["time"].add_argument("--repeats", type=int, default=1)
    sub.choices["loo"].add_argument("--exp", default=None, help="comma-separated ids")
    sub.choices["loo"].add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    {"time": cmd_time, "loo": cmd_loo}[args.cmd](args)


if __name__ == "__main__":
    main()
