"""The sim-to-real study's published tables, as small extracts under
``data/measurements/simtoreal/`` (decision ST2).

The study (github.com/inference-sim/sim-to-real-accuracy-validation, kept verbatim in
``shared/reference/measurements/sim-to-real-accuracy-validation``) publishes one row per
(simulator, experiment, stage, metric) in ``results_iter36/error_records.csv`` and each
simulator's wall-clock seconds per experiment in ``results/runtime.csv``. ``extract_study``
turns them into four small files keyed on ``exp_id`` (the study's own paths are dropped):

* ``experiments.csv``: one row per experiment, its deployment as the study states it;
* ``measured.csv``: the measured value of every (experiment, stage, metric), in ms (the
  ``actual`` column, identical for every simulator of a row; checked, not assumed);
* ``simulators.csv``: every simulator's prediction and error on those rows;
* ``runtime.csv``: every simulator's seconds per experiment.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.resources import data_dir

__all__ = ["METRICS", "SETS", "StudyError", "extract_study", "load_experiments", "load_measured",
           "load_runtime", "load_simulators", "study_dir"]

# The seven metrics the study scores, in its names (milliseconds).
METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")

ERROR_RECORDS = Path("results_iter36") / "error_records.csv"
RUNTIME = Path("results") / "runtime.csv"

_EXPERIMENT_COLUMNS = {
    "exp_id": pl.Int64, "folder": pl.String, "hf_model": pl.String, "workload": pl.String,
    "hardware": pl.String, "tp": pl.Int64, "dp": pl.Int64, "max_num_batched_tokens": pl.Int64,
    "gpu_memory_utilization": pl.Float64, "cpu_offload": pl.Boolean, "precision": pl.String,
}
_MEASURED_COLUMNS = {"exp_id": pl.Int64, "stage_index": pl.Int64, "metric": pl.String,
                     "actual_ms": pl.Float64}
_SIMULATOR_COLUMNS = {"simulator": pl.String, "exp_id": pl.Int64, "stage_index": pl.Int64,
                      "metric": pl.String, "predicted_ms": pl.Float64, "actual_ms": pl.Float64,
                      "mape": pl.Float64, "mpe": pl.Float64}
_RUNTIME_COLUMNS = {"simulator": pl.String, "exp_id": pl.Int64, "seconds": pl.Float64}


class StudyError(ValueError):
    """A study table that is missing, malformed or inconsistent."""


def study_dir() -> Path:
    """Where the embedded extracts live."""
    return data_dir() / "measurements" / "simtoreal"


def _read_csv(path: Path, what: str) -> pl.DataFrame:
    if not path.is_file():
        raise StudyError(f"{path}: no such file (the study's {what})")
    try:
        return pl.read_csv(path, infer_schema_length=None)
    except Exception as exc:  # polars raises several types for unreadable CSV
        raise StudyError(f"{path}: cannot be read as CSV ({exc})") from None


def _require(df: pl.DataFrame, path: Path, columns: list[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise StudyError(f"{path}: no column {', '.join(map(repr, missing))}; it has "
                         f"{', '.join(df.columns)}")


def _folder_name(col: str) -> pl.Expr:
    # the study's experiment_folder is the author's local path; keep its last component only
    return pl.col(col).str.split("/").list.last()


def _experiments_from(records: pl.DataFrame, path: Path) -> pl.DataFrame:
    deployment = ["exp_id", "experiment_folder", "model", "workload", "hardware", "tp", "dp",
                  "max_num_batched_tokens", "gpu_mem_util", "cpu_offload", "precision"]
    exp = (records.select(deployment).unique()
           .with_columns(_folder_name("experiment_folder").alias("folder"))
           .rename({"model": "hf_model", "gpu_mem_util": "gpu_memory_utilization"})
           .with_columns(pl.col("dp").fill_null(1))
           .select(list(_EXPERIMENT_COLUMNS)).cast(_EXPERIMENT_COLUMNS)  # type: ignore[arg-type]
           .sort("exp_id"))
    dup = exp.group_by("exp_id").len().filter(pl.col("len") > 1)
    if dup.height:
        raise StudyError(f"{path}: experiments {dup['exp_id'].to_list()} have more than one "
                         f"deployment (model, hardware, tp, dp, limits)")
    return exp


def _measured_from(records: pl.DataFrame, path: Path) -> pl.DataFrame:
    keys = ["exp_id", "stage_index", "metric_name"]
    per_row = records.group_by(keys).agg(pl.col("actual").n_unique().alias("n"),
                                         pl.col("actual").first())
    bad = per_row.filter(pl.col("n") > 1)
    if bad.height:
        row = bad.row(0, named=True)
        raise StudyError(f"{path}: the simulators disagree on the measured value of experiment "
                         f"{row['exp_id']} stage {row['stage_index']} {row['metric_name']}; "
                         f"every simulator's row must carry the same `actual`")
    return (per_row.select(keys + ["actual"])
            .rename({"metric_name": "metric", "actual": "actual_ms"})
            .cast(_MEASURED_COLUMNS)  # type: ignore[arg-type]
            .sort("exp_id", "stage_index", "metric"))


def extract_study(study: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """Write the four extracts of the study checkout ``study`` into ``out`` (default: the
    embedded ``data/measurements/simtoreal``); returns {name: path}."""
    root, target = Path(study), Path(out) if out is not None else study_dir()
    rec_path, rt_path = root / ERROR_RECORDS, root / RUNTIME
    records = _read_csv(rec_path, "error records")
    _require(records, rec_path, ["simulator", "experiment_folder", "model", "workload",
                                 "stage_index", "metric_name", "predicted", "actual", "mape",
                                 "mpe", "exp_id", "hardware", "dp", "cpu_offload",
                                 "gpu_mem_util", "precision", "tp", "max_num_batched_tokens"])
    unknown = sorted(set(records["metric_name"].unique().to_list()) - set(METRICS))
    if unknown:
        raise StudyError(f"{rec_path}: unknown metric_name {unknown}; allowed: {list(METRICS)}")
    runtime = _read_csv(rt_path, "runtime table")
    _require(runtime, rt_path, ["simulator", "exp_id", "wall_clock_seconds"])
    tables = {
        "experiments": _experiments_from(records, rec_path),
        "measured": _measured_from(records, rec_path),
        "simulators": (records.select("simulator", "exp_id", "stage_index", "metric_name",
                                      "predicted", "actual", "mape", "mpe")
                       .rename({"metric_name": "metric", "predicted": "predicted_ms",
                                "actual": "actual_ms"})
                       .cast(_SIMULATOR_COLUMNS)  # type: ignore[arg-type]
                       .sort("simulator", "exp_id", "stage_index", "metric")),
        "runtime": (runtime.select("simulator", "exp_id", "wall_clock_seconds")
                    .rename({"wall_clock_seconds": "seconds"})
                    .cast(_RUNTIME_COLUMNS)  # type: ignore[arg-type]
                    .sort("simulator", "exp_id")),
    }
    target.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, df in tables.items():
        path = target / f"{name}.csv"
        df.write_csv(path, float_precision=None)
        written[name] = path
    return written


def _load(name: str, schema: dict[str, pl.DataType | type[pl.DataType]],
          root: str | Path | None) -> pl.DataFrame:
    path = (Path(root) if root is not None else study_dir()) / f"{name}.csv"
    df = _read_csv(path, name)
    _require(df, path, list(schema))
    try:
        df = df.select(list(schema)).cast(schema)  # type: ignore[arg-type]
    except pl.exceptions.PolarsError as exc:
        raise StudyError(f"{path}: a column has the wrong type ({exc}); expected "
                         f"{ {k: str(v) for k, v in schema.items()} }") from None
    nulls = [c for c in df.columns if df[c].null_count()]
    if nulls:
        raise StudyError(f"{path}: empty values in {nulls}")
    return df


# the experiment sets: the study's 38, and inference-sim/training's runs that are not among
# them (kernel/replay/simtoreal/training.py); "all" is both
SETS = {"study": ("experiments", "measured"), "training": ("training", "training_measured")}


def _sets(which: str) -> list[tuple[str, str]]:
    if which == "all":
        return list(SETS.values())
    if which not in SETS:
        raise StudyError(f"unknown experiment set {which!r}; allowed: {sorted(SETS)} or 'all'")
    return [SETS[which]]


def load_experiments(root: str | Path | None = None, which: str = "study") -> pl.DataFrame:
    """Experiments, one row each: the study's (``experiments.csv``), inference-sim/training's
    other runs (``training.csv``) or ``all``."""
    return pl.concat([_load(e, _EXPERIMENT_COLUMNS, root)  # type: ignore[arg-type]
                      for e, _ in _sets(which)])


def load_measured(root: str | Path | None = None, which: str = "study") -> pl.DataFrame:
    """Measured values: exp_id, stage_index (-1 = whole run), metric, actual_ms."""
    frames = []
    for _, name in _sets(which):
        df = _load(name, _MEASURED_COLUMNS, root)  # type: ignore[arg-type]
        bad = sorted(set(df["metric"].to_list()) - set(METRICS))
        if bad:
            raise StudyError(f"{name}.csv: unknown metric {bad}; allowed: {list(METRICS)}")
        frames.append(df)
    return pl.concat(frames)


def load_simulators(root: str | Path | None = None) -> pl.DataFrame:
    """Every simulator's row: simulator, exp_id, stage_index, metric, predicted_ms, actual_ms,
    mape, mpe (percent)."""
    return _load("simulators", _SIMULATOR_COLUMNS, root)  # type: ignore[arg-type]


def load_runtime(root: str | Path | None = None) -> pl.DataFrame:
    """Every simulator's wall-clock seconds per experiment."""
    return _load("runtime", _RUNTIME_COLUMNS, root)  # type: ignore[arg-type]
