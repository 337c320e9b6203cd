"""FPM (aggregate) traces: integer shapes keep count and sum exactly and the variance as
closely as the shape allows; impossible aggregates are rejected; uniform passes price exactly
as their request rows; calibrate and its command line read them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.calibration.splitwise import scenario_path, splitwise_trace
from kernel.cli import cli
from kernel.io.fpm import FpmError, fpm_to_requests, integer_shape


@st.composite
def groups(draw: st.DrawFn) -> tuple[int, int, float, int]:
    minimum = draw(st.sampled_from([0, 1]))
    n = draw(st.integers(1, 200))
    excess = draw(st.one_of(st.integers(0, 50), st.integers(0, 10**7)))
    vmax = excess * excess * (n - 1) / (n * n)
    var = draw(st.one_of(st.floats(0, 1.3) .map(lambda f: f * vmax), st.floats(0, 5)))
    return n, n * minimum + excess, var, minimum


@settings(max_examples=300, deadline=None)
@given(st.lists(groups(), min_size=1, max_size=8))
def test_integer_shape_keeps_count_and_sum_and_nears_the_variance(
        gs: list[tuple[int, int, float, int]]) -> None:
    for minimum in (0, 1):
        sel = [x for x in gs if x[3] == minimum]
        if not sel:
            continue
        n = np.array([x[0] for x in sel])
        total = np.array([x[1] for x in sel])
        var = np.array([x[2] for x in sel])
        g, y = integer_shape(n, total, var, minimum)
        assert y.dtype == np.int64 and (y >= minimum).all()
        assert (np.bincount(g, minlength=n.size) == n).all()
        for i in range(n.size):
            yi = y[g == i]
            assert int(yi.sum()) == total[i]
            excess = total[i] - n[i] * minimum
            vmax = excess * excess * (n[i] - 1) / (n[i] * n[i])
            if var[i] >= vmax:  # past what the sum allows: the widest shape
                assert float(yi.var()) == pytest.approx(vmax)
            else:  # within a token of the target standard deviation
                assert abs(np.sqrt(yi.var()) - np.sqrt(var[i])) <= 1.0


def _fpm_row(**kw: float) -> dict[str, float]:
    row = {"num_prefill_requests": 0, "sum_prefill_tokens": 0, "sum_prefill_kv_tokens": 0,
           "var_prefill_length": 0.0, "num_decode_requests": 1, "sum_decode_kv_tokens": 10,
           "var_decode_kv_tokens": 0.0, "latency_ms": 1.0}
    row.update(kw)
    return row


@pytest.mark.parametrize("bad, reason, column", [
    ({"num_prefill_requests": -1}, "negative", "num_prefill_requests"),
    ({"num_prefill_requests": 2, "sum_prefill_tokens": 1}, "impossible_aggregate",
     "sum_prefill_tokens"),
    ({"num_decode_requests": 3, "sum_decode_kv_tokens": 2}, "impossible_aggregate",
     "sum_decode_kv_tokens"),
    ({"sum_prefill_kv_tokens": 5}, "impossible_aggregate", "sum_prefill_kv_tokens"),
    ({"num_decode_requests": 0, "sum_decode_kv_tokens": 0}, "impossible_aggregate",
     "num_prefill_requests"),
    ({"var_decode_kv_tokens": -2.0}, "negative", "var_decode_kv_tokens"),
    ({"num_decode_requests": 1.5}, "non_integer", "num_decode_requests"),
    ({"sum_decode_kv_tokens": None}, "null", "sum_decode_kv_tokens"),
])
def test_impossible_aggregates_are_rejected_with_reasons(bad: dict, reason: str,
                                                         column: str) -> None:
    rows = [_fpm_row(), _fpm_row(**bad), _fpm_row(num_decode_requests=2,
                                                  sum_decode_kv_tokens=30)]
    f = pl.DataFrame(rows, schema_overrides={k: pl.Float64 for k in rows[0]})
    f = f.with_columns(pl.Series("worker_id", ["w0", "w1", "w2"]))
    req, batches, rej = fpm_to_requests(f)
    assert batches.height + rej.height == 3  # rows in = passes kept + passes rejected
    assert rej["row"].to_list() == [1] and rej["reason"][0] == reason
    assert rej["column"][0] == column and column in rej["values"][0]
    assert batches["worker_id"].to_list() == ["w0", "w2"]  # identifiers pass through
    assert req["batch_id"].unique().sort().to_list() == [0, 2]


def test_missing_fpm_column_is_an_error() -> None:
    with pytest.raises(FpmError, match="missing FPM column.*var_decode_kv_tokens"):
        fpm_to_requests(pl.DataFrame([_fpm_row()]).drop("var_decode_kv_tokens"))


def _splitwise_as_fpm(hardware: str, tp: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    requests, batches = splitwise_trace()
    b = batches.filter((pl.col("hardware") == hardware) & (pl.col("tp") == tp)
                       & ~pl.col("suspect"))
    r = requests.join(b.select("batch_id"), on="batch_id")
    pre = pl.col("scheduled") > 1
    agg = r.group_by("batch_id", maintain_order=True).agg(
        pre.sum().alias("num_prefill_requests"),
        pl.col("scheduled").filter(pre).sum().alias("sum_prefill_tokens"),
        pl.col("computed").filter(pre).sum().alias("sum_prefill_kv_tokens"),
        pl.lit(0.0).alias("var_prefill_length"),
        (~pre).sum().alias("num_decode_requests"),
        pl.col("computed").filter(~pre).sum().alias("sum_decode_kv_tokens"),
        pl.lit(0.0).alias("var_decode_kv_tokens"))
    fpm = agg.join(b.select("batch_id", "measured_ms", "config"), on="batch_id") \
        .rename({"measured_ms": "latency_ms"})
    return r, fpm


def test_uniform_passes_price_exactly_as_their_requests() -> None:
    r, fpm = _splitwise_as_fpm("h100-80gb", 4)
    k = kernel.open(str(scenario_path("h100-80gb", 4)))
    req, batches, rej = fpm_to_requests(fpm)
    assert rej.height == 0
    a = k.price(r).sort("batch_id")
    b = k.price(req).sort("batch_id")
    assert a.drop("requests").equals(b.drop("requests"))


def test_calibrate_command_on_fpm_traces(tmp_path: Path) -> None:
    paths, scens = [], []
    for tp in (2, 4):
        _, fpm = _splitwise_as_fpm("h100-80gb", tp)
        if tp == 4:  # one impossible pass: set aside, counted
            fpm = fpm.with_columns(pl.when(pl.col("batch_id") == fpm["batch_id"][0])
                                   .then(-1).otherwise(pl.col("num_decode_requests"))
                                   .alias("num_decode_requests"))
        p = tmp_path / f"tp{tp}.csv"
        fpm.write_csv(p)
        paths.append(str(p))
        scens += ["-s", str(scenario_path("h100-80gb", tp))]
    out = tmp_path / "cal.yaml"
    res = CliRunner().invoke(cli, ["calibrate", *paths, *scens, "--measured", "latency_ms",
                                   "--measured-unit", "ms", "--trace-format", "fpm",
                                   "--fold-by", "config", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "held out (2 folds by config)" in res.output
    assert "1 step(s) set aside" in res.output
    cal = kernel.calibration.load_calibration(out)
    assert cal.chip == "h100" and cal.document["sources"]["measured"]["rejected_steps"] == 1


def test_calibrate_command_errors_are_one_line(tmp_path: Path) -> None:
    _, fpm = _splitwise_as_fpm("h100-80gb", 2)
    p = tmp_path / "t.parquet"
    fpm.write_parquet(p)
    res = CliRunner().invoke(cli, ["calibrate", str(p), "-s", "llama-3.1-8b-h100-tp1",
                                   "-s", "llama-3.1-8b-h100-tp1", "--measured", "latency_ms",
                                   "-o", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2 and "2 --scenario for 1 traces" in res.output


def test_price_command_reads_fpm_with_measured(tmp_path: Path) -> None:
    _, fpm = _splitwise_as_fpm("h100-80gb", 4)
    fpm = fpm.with_columns(pl.lit("w7").alias("worker_id"),
                           pl.col("num_decode_requests").cast(pl.Int64))
    fpm = pl.concat([fpm, fpm.head(1).with_columns(pl.lit(-3, pl.Int64)
                                                   .alias("num_decode_requests"),
                                                   pl.lit(10**6, pl.Int64).alias("batch_id"))])
    src = tmp_path / "fpm.parquet"
    fpm.write_parquet(src)
    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(cli, ["price", str(src), "-s", str(scenario_path("h100-80gb", 4)),
                                   "-o", str(out), "--trace-format", "fpm", "--measured",
                                   "latency_ms", "--measured-unit", "ms", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"forward passes in {fpm.height:,} = rebuilt {fpm.height - 1:,} + rejected 1" \
        in res.output
    p = pl.read_parquet(out)
    assert p.height == fpm.height - 1 and set(p["worker_id"]) == {"w7"}
    assert set(p["config"]) == {"h100-80gb-tp4"} and "measured_ns" in p.columns
    rej = pl.read_parquet(tmp_path / "p.rejects.fpm.parquet")
    assert rej["batch_id"].to_list() == [10**6] and rej["reason"][0] == "negative"


def test_kernel_price_reads_fpm_in_python() -> None:
    r, fpm = _splitwise_as_fpm("h100-80gb", 2)
    k = kernel.open(str(scenario_path("h100-80gb", 2)))
    p = k.price(fpm, trace_format="fpm", measured="latency_ms", measured_unit="ms")
    assert p.height == fpm.height and set(p["config"]) == {"h100-80gb-tp2"}
    want = k.price(r).sort("batch_id")["no_overlap_ns"]
    assert p.sort("batch_id")["no_overlap_ns"].equals(want)
    assert (p["measured_ns"] > 0).all() and "no_overlap_error" in p.columns
    with pytest.raises(ValueError, match="trace_format"):
        k.price(fpm, trace_format="csv")
