"""Markdown tables for docs/accuracy.md: our errors per experiment beside the study's six
simulators, the medians over experiments, and the runtime per experiment."""

from __future__ import annotations

import polars as pl

from kernel.replay.simtoreal.catalogue import Experiment

__all__ = ["OURS", "SIMULATORS", "medians_table", "per_experiment_table", "runtime_table"]

OURS = "blis-kernel replay"
# the study's simulators in its table order (results_iter36)
SIMULATORS = ("blis-trained-physics", "blis-evolved", "blis-roofline",
              "aiconfigurator-estimate", "llm-optimizer-estimate", "vidur")
HEADLINE = ("ttft_mean", "itl_mean", "e2e_mean")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}%"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _runs(ours: pl.DataFrame | dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Our errors as {label: whole-run rows}: one table is labelled ``OURS``."""
    runs = ours if isinstance(ours, dict) else {OURS: ours}
    return {k: v.filter(pl.col("stage_index") == -1) for k, v in runs.items()}


def per_experiment_table(ours: pl.DataFrame | dict[str, pl.DataFrame], sims: pl.DataFrame,
                         exps: list[Experiment]) -> str:
    """One row per experiment we replayed: its deployment, then per headline metric (TTFT,
    ITL, E2E mean, whole run) our signed error for each labelled run and BLIS
    trained-physics' MAPE on the same row."""
    info = {e.exp_id: e for e in exps}
    runs = _runs(ours)
    blis = sims.filter((pl.col("stage_index") == -1)
                       & (pl.col("simulator") == "blis-trained-physics"))

    def get(df: pl.DataFrame, exp_id: int, metric: str, col: str) -> float | None:
        hit = df.filter((pl.col("exp_id") == exp_id) & (pl.col("metric") == metric))
        return None if hit.height == 0 else float(hit[col][0])

    head = ["exp", "model", "GPU", "TP", "mbt", "gmu", "offload", "workload"]
    for m in HEADLINE:
        name = m.split("_")[0].upper()
        head += [f"{name} {label} (signed)" for label in runs] + [f"{name} BLIS (MAPE)"]
    lines = [_row(head), _row(["---"] * len(head))]
    ids = sorted({i for df in runs.values() for i in df["exp_id"].unique().to_list()})
    for exp_id in ids:
        e = info[exp_id]
        cells = [str(exp_id), e.model, e.hardware, str(e.tp), str(e.max_num_batched_tokens),
                 f"{e.gpu_memory_utilization:g}", "yes" if e.cpu_offload else "no", e.workload]
        for m in HEADLINE:
            for df in runs.values():
                mpe = get(df, exp_id, m, "mpe")
                cells.append("–" if mpe is None else f"{mpe:+.1f}%")
            cells.append(_pct(get(blis, exp_id, m, "mape")))
        lines.append(_row(cells))
    return "\n".join(lines)


def medians_table(ours: pl.DataFrame | dict[str, pl.DataFrame], sims: pl.DataFrame,
                  metrics: tuple[str, ...] = ("ttft_mean", "ttft_p90", "ttft_p99", "itl_mean",
                                              "e2e_mean", "e2e_p90", "e2e_p99")) -> str:
    """Median whole-run MAPE over experiments, per metric: ours (each labelled run) over the
    experiments we replayed, and each simulator over the same experiments (those it covers;
    the count says how many)."""
    runs = _runs(ours)
    ids = sorted({i for df in runs.values() for i in df["exp_id"].unique().to_list()})
    same = sims.filter((pl.col("stage_index") == -1) & pl.col("exp_id").is_in(ids))
    head = ["simulator", "experiments"] + list(metrics)
    lines = [_row(head), _row(["---"] * len(head))]
    for name, df in list(runs.items()) + [(s, same.filter(pl.col("simulator") == s))
                                          for s in SIMULATORS]:
        if df.height == 0:
            lines.append(_row([name, "0"] + ["–"] * len(metrics)))
            continue
        cells = [name, str(df["exp_id"].n_unique())]
        for m in metrics:
            v = df.filter(pl.col("metric") == m)["mape"]
            cells.append(_pct(None if v.len() == 0 else float(v.median())))  # type: ignore[arg-type]
        lines.append(_row(cells))
    return "\n".join(lines)


def runtime_table(ours: pl.DataFrame, runtime: pl.DataFrame) -> str:
    """Seconds per experiment: ours (exp_id, seconds) beside each simulator's
    (runtime.csv), and the medians over the experiments we replayed."""
    ids = ours["exp_id"].to_list()
    sims = runtime.filter(pl.col("exp_id").is_in(ids))
    names = [s for s in SIMULATORS if s in sims["simulator"].unique().to_list()]
    cpu = "cpu_seconds" in ours.columns
    head = ["exp", OURS] + (["(CPU s)"] if cpu else []) + names
    lines = [_row(head), _row(["---"] * len(head))]
    for row in ours.sort("exp_id").iter_rows(named=True):
        cells = [str(row["exp_id"]), f"{row['seconds']:.2f}"]
        if cpu:
            cells.append(f"{row['cpu_seconds']:.2f}")
        for s in names:
            hit = sims.filter((pl.col("simulator") == s) & (pl.col("exp_id") == row["exp_id"]))
            cells.append("–" if hit.height == 0 else f"{hit['seconds'][0]:.2f}")
        lines.append(_row(cells))
    med = [f"**{float(ours['seconds'].median()):.2f}**"]  # type: ignore[arg-type]
    if cpu:
        med.append(f"**{float(ours['cpu_seconds'].median()):.2f}**")  # type: ignore[arg-type]
    for s in names:
        v = sims.filter(pl.col("simulator") == s)["seconds"]
        med.append(f"**{float(v.median()):.2f}** (n={v.len()})")  # type: ignore[arg-type]
    lines.append(_row(["median"] + med))
    return "\n".join(lines)
