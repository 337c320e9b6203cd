"""The study's seven metrics from per-request latencies, computed as the study computes its
measured values (decision ST6), and the errors against them.

The study's measured values are inference-perf's lifecycle reports (``stage_<n>`` and
``summary_lifecycle_metrics.json``) converted to milliseconds by its ``ground_truth.py``:

* a request belongs to the load stage it was sent in; stage -1 is the whole run;
* ``e2e_*`` and ``ttft_*``: mean, 90th and 99th percentile over the stage's successful
  requests of ``request_latency`` and ``time_to_first_token``;
* ``itl_mean``: (mean E2E − mean TTFT) / (mean output tokens − 1): the mean decode time per
  token after the first. (Recomputed from the published stage files of the 16 public runs, this
  reproduces the study's ``actual`` to the last digit; it is neither inference-perf's
  ``inter_token_latency`` nor its ``time_per_output_token``, which count stream events, about
  two per token.)

Percentiles are numpy's default (linear interpolation), inference-perf's method.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kernel.replay.simtoreal.study import METRICS, StudyError

__all__ = ["LATENCY_COLUMNS", "compare", "itl_mean", "stage_metrics", "summary_mape"]

# what stage_metrics needs, one row per finished request
LATENCY_COLUMNS = ("stage", "ttft_ns", "e2e_ns", "output_tokens")


def itl_mean(e2e_mean_ms: float, ttft_mean_ms: float, output_tokens_mean: float) -> float:
    """The study's ITL: the mean decode time per token after the first, from a stage's means.
    NaN when the stage's requests produce one token on average (no decode to time)."""
    if not output_tokens_mean > 1.0:
        return float("nan")
    return (e2e_mean_ms - ttft_mean_ms) / (output_tokens_mean - 1.0)


def _one(stage: int, ttft_ms: np.ndarray, e2e_ms: np.ndarray, out: np.ndarray) -> list[dict]:
    values = {
        "e2e_mean": float(e2e_ms.mean()),
        "e2e_p90": float(np.percentile(e2e_ms, 90)),
        "e2e_p99": float(np.percentile(e2e_ms, 99)),
        "ttft_mean": float(ttft_ms.mean()),
        "ttft_p90": float(np.percentile(ttft_ms, 90)),
        "ttft_p99": float(np.percentile(ttft_ms, 99)),
        "itl_mean": itl_mean(float(e2e_ms.mean()), float(ttft_ms.mean()), float(out.mean())),
    }
    return [{"stage_index": stage, "metric": m, "predicted_ms": values[m],
             "requests": int(e2e_ms.size)} for m in METRICS]


def stage_metrics(latencies: pl.DataFrame) -> pl.DataFrame:
    """The seven metrics per stage and for the whole run (stage_index -1), in ms.

    ``latencies``: one row per finished request with ``stage`` (the load stage it arrived in),
    ``ttft_ns``, ``e2e_ns`` (integer ns from arrival) and ``output_tokens``. Returns
    stage_index, metric, predicted_ms, requests (how many requests the value is over)."""
    missing = [c for c in LATENCY_COLUMNS if c not in latencies.columns]
    if missing:
        raise StudyError(f"per-request latencies: no column {missing}; need "
                         f"{list(LATENCY_COLUMNS)}, have {latencies.columns}")
    if latencies.height == 0:
        raise StudyError("per-request latencies: no finished request to compute metrics over")
    for col in LATENCY_COLUMNS:
        if latencies[col].null_count():
            raise StudyError(f"per-request latencies: {latencies[col].null_count()} empty "
                             f"values in {col!r}")
    bad = latencies.filter((pl.col("ttft_ns") < 0) | (pl.col("e2e_ns") < pl.col("ttft_ns"))
                           | (pl.col("output_tokens") < 1))
    if bad.height:
        raise StudyError(f"per-request latencies: {bad.height} rows with a negative TTFT, an "
                         f"E2E below the TTFT or no output token, e.g. {bad.row(0, named=True)}")
    rows: list[dict] = []
    stage = latencies["stage"].to_numpy()
    ttft = latencies["ttft_ns"].to_numpy().astype(np.float64) / 1e6
    e2e = latencies["e2e_ns"].to_numpy().astype(np.float64) / 1e6
    out = latencies["output_tokens"].to_numpy().astype(np.float64)
    for s in sorted(set(stage.tolist())):
        sel = stage == s
        rows += _one(int(s), ttft[sel], e2e[sel], out[sel])
    rows += _one(-1, ttft, e2e, out)
    return pl.DataFrame(rows, schema={"stage_index": pl.Int64, "metric": pl.String,
                                      "predicted_ms": pl.Float64, "requests": pl.Int64})


def compare(predicted: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """Join predictions (exp_id, stage_index, metric, predicted_ms) with the measured values
    (exp_id, stage_index, metric, actual_ms); adds ``mape`` = |p − a| / a × 100 and the signed
    ``mpe`` = (p − a) / a × 100, as the study defines them. Every prediction must have a
    measured row: one without is an error, not a silent drop."""
    keys = ["exp_id", "stage_index", "metric"]
    joined = predicted.join(measured.select(keys + ["actual_ms"]), on=keys, how="left")
    orphan = joined.filter(pl.col("actual_ms").is_null())
    if orphan.height:
        raise StudyError(f"{orphan.height} predictions have no measured value, e.g. "
                         f"{orphan.select(keys).row(0, named=True)}")
    err = (pl.col("predicted_ms") - pl.col("actual_ms")) / pl.col("actual_ms") * 100.0
    return joined.with_columns(err.abs().alias("mape"), err.alias("mpe"))


def summary_mape(errors: pl.DataFrame, by: str = "simulator") -> pl.DataFrame:
    """Median over experiments of each metric's whole-run (stage -1) MAPE, per ``by`` value:
    the study's headline figure. Columns: ``by``, metric, median_mape, experiments."""
    return (errors.filter(pl.col("stage_index") == -1)
            .group_by(by, "metric")
            .agg(pl.col("mape").median().alias("median_mape"),
                 pl.col("exp_id").n_unique().alias("experiments"))
            .sort(by, "metric"))
