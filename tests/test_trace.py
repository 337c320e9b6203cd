"""The trace format: sources, column names, row-local validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from kernel.io.trace import RejectedRowError, Rows, TraceError, coerce, open_trace

FRAME = pl.DataFrame({"batch_id": [0, 0, 1, 2, 2, 2], "scheduled": [1, 7, 1, 1, 1, 300],
                      "computed": [5, 0, 9, 3, 4, 0], "prompt_len": [4, 7, 8, 2, 3, 300],
                      "extra": ["a", "b", "c", "d", "e", "f"]})


def _read_all(src, **kw) -> pa.Table:
    ts = open_trace(src, **kw)
    return pa.concat_tables(list(ts.chunks()))


def _write(fmt: str, path: Path) -> Path:
    if fmt == "parquet":
        FRAME.write_parquet(path)
    elif fmt == "csv":
        FRAME.write_csv(path)
    elif fmt == "tsv":
        FRAME.write_csv(path, separator="\t")
    elif fmt == "csv.gz":
        import gzip

        path.write_bytes(gzip.compress(FRAME.write_csv().encode()))
    elif fmt == "arrow":
        FRAME.write_ipc(path)
    elif fmt == "arrows":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, FRAME.to_arrow().schema) as w:
            w.write_table(FRAME.to_arrow())
    return path


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv", "csv.gz", "arrow", "arrows"])
def test_every_file_format_reads_the_same_rows(tmp_path: Path, fmt: str) -> None:
    path = _write(fmt, tmp_path / f"t.{fmt}")
    t = _read_all(path, chunk_rows=4)
    want = ["batch_id", "scheduled", "computed", "prompt_len"]
    if fmt == "parquet":  # statistics prove prompt_len valid: not read
        want = want[:3]
    assert t.column_names == want
    rows = coerce(t, 0)
    assert rows.scheduled.tolist() == FRAME["scheduled"].to_list()
    assert rows.batch_id.tolist() == FRAME["batch_id"].to_list()
    assert not rows.bad.any()


def test_in_memory_sources() -> None:
    for src in (FRAME, FRAME.lazy(), FRAME.to_arrow(), FRAME.to_arrow().to_batches()[0]):
        assert _read_all(src).num_rows == 6
    reader = pa.RecordBatchReader.from_batches(FRAME.to_arrow().schema,
                                               FRAME.to_arrow().to_batches())
    assert _read_all(reader).num_rows == 6
    with pytest.raises(TraceError, match="cannot read a trace"):
        open_trace(42)
    with pytest.raises(TraceError, match="no such trace file"):
        open_trace("/nonexistent/trace.parquet")


def test_chunks_have_the_requested_size(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"batch_id": np.arange(1000), "scheduled": np.ones(1000, int),
                             "computed": np.ones(1000, int), "prompt_len": np.ones(1000, int)}),
                   path, row_group_size=300)
    sizes = [c.num_rows for c in open_trace(path, chunk_rows=128).chunks()]
    assert sum(sizes) == 1000 and max(sizes) <= 128


def test_column_names_are_configurable_and_checked() -> None:
    df = FRAME.rename({"scheduled": "n_sched", "batch_id": "step"})
    t = _read_all(df, columns={"scheduled": "n_sched", "batch_id": "step"})
    assert t.column_names[:2] == ["batch_id", "scheduled"]
    with pytest.raises(TraceError, match="missing columns 'batch_id', 'scheduled'"):
        open_trace(df)
    with pytest.raises(TraceError, match="unknown trace column"):
        open_trace(FRAME, columns={"tokens": "x"})
    with pytest.raises(TraceError, match="missing column 'thr'"):
        open_trace(FRAME, columns={"decode_threshold": "thr"})
    opt = _read_all(FRAME.with_columns(pl.lit(3).alias("thr")),
                    columns={"decode_threshold": "thr"})
    assert "decode_threshold" in opt.column_names


def test_unsupported_column_type_is_a_whole_input_error() -> None:
    with pytest.raises(TraceError, match="counts must be integers"):
        coerce(FRAME.with_columns(pl.col("scheduled") > 0).to_arrow(), 0)


def test_row_local_reasons_and_details() -> None:
    t = pa.table({
        "batch_id": pa.array(["1", "1", "2", "x", "3", "4", "5"]),
        "scheduled": pa.array([" 1", "2.0", "-1", "1", None, "nan", "1"]),
        "computed": pa.array(["0", "0", "0", "0", "0", "0", "1e30"]),
        "prompt_len": pa.array(["1", "1", "1", "1", "1", "1", "1"]),
    })
    rej: list[pa.Table] = []
    rows = coerce(t, 100, rejects=rej)
    r = pl.from_arrow(pa.concat_tables(rej))
    assert isinstance(r, pl.DataFrame)
    got = {row["row"]: (row["reason"], row["column"]) for row in r.iter_rows(named=True)}
    assert got == {102: ("negative", "scheduled"), 103: ("non_integer", "batch_id"),
                   104: ("null", "scheduled"), 105: ("non_integer", "scheduled"),
                   106: ("overflow", "computed")}
    # the row with an unreadable batch id is not handed on; the others are, marked
    assert rows.row.tolist() == [100, 101, 102, 104, 105, 106]
    assert rows.bad.tolist() == [False, False, True, True, True, True]
    assert rows.scheduled[:2].tolist() == [1, 2]
    assert r.filter(pl.col("row") == 103)["batch_id"][0] is None
    assert "'-1'" in r.filter(pl.col("row") == 102)["detail"][0]


def test_strict_coerce_raises_with_the_reason() -> None:
    t = FRAME.with_columns(pl.when(pl.col("batch_id") == 1).then(-5).otherwise(
        pl.col("computed")).alias("computed")).to_arrow()
    with pytest.raises(RejectedRowError, match="row 2 .*batch 1.*negative.*computed = -5"):
        coerce(t, 0, strict=True)


def test_per_batch_columns_kept_only_when_present() -> None:
    rows = coerce(FRAME.to_arrow().drop_columns(["extra"]), 0)
    assert rows.decode_threshold is None and rows.sm_budget is None
    t = FRAME.with_columns(pl.lit(-1).alias("decode_threshold"),
                           pl.lit(0).alias("sm_budget")).to_arrow()
    rows = coerce(t, 0)
    assert rows.decode_threshold is not None and rows.decode_threshold.tolist() == [-1] * 6
    assert rows.bad.all()  # a negative decode threshold is refused, as the option is (RL8)
    zero = FRAME.with_columns(pl.lit(0).alias("decode_threshold")).to_arrow()
    assert not coerce(zero, 0).bad.any()
    neg_sm = FRAME.with_columns(pl.lit(-3).alias("sm_budget")).to_arrow()
    assert coerce(neg_sm, 0).bad.all()


def test_rows_concat_slice_and_arrow_round_trip() -> None:
    rows = coerce(FRAME.to_arrow(), 0)
    both = Rows.concat([rows.slice(0, 2), Rows.empty(), rows.slice(2, 6)])
    assert both.scheduled.tolist() == rows.scheduled.tolist()
    back = Rows.from_arrow(both.to_arrow())
    assert back.row.tolist() == rows.row.tolist() and back.decode_threshold is None


def test_csv_reader_treats_bad_values_as_rows_not_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    pcsv.write_csv(pa.table({"batch_id": ["1"] * 3, "scheduled": ["1", "oops", ""],
                             "computed": ["0"] * 3, "prompt_len": ["1"] * 3}), path)
    rej: list[pa.Table] = []
    rows = coerce(_read_all(path), 0, rejects=rej)
    assert rows.bad.tolist() == [False, True, True]
    assert pa.concat_tables(rej).column("reason").to_pylist() == ["non_integer", "null"]


def test_parquet_statistics_spare_reading_valid_prompt_lengths(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    FRAME.write_parquet(good, statistics=True)
    FRAME.with_columns(pl.when(pl.col("batch_id") == 2).then(-1).otherwise(
        pl.col("prompt_len")).alias("prompt_len")).write_parquet(bad, statistics=True)
    assert "prompt_len" not in _read_all(good).column_names  # proven valid, not read
    rej: list[pa.Table] = []
    rows = coerce(_read_all(bad), 0, rejects=rej)
    assert rows.bad.tolist() == [False, False, False, True, True, True]
    assert set(pa.concat_tables(rej).column("column").to_pylist()) == {"prompt_len"}


def test_narrowed_rows_keep_their_values_in_the_smallest_type_that_holds_them() -> None:
    n = 6
    rows = Rows(np.arange(70_000, 70_000 + n, dtype=np.int64),  # row: beyond uint16
                np.arange(n, dtype=np.int64),
                np.array([1, 1, 8192, 65_535, 0, 3], np.int64),  # fits uint16
                np.array([0, 5, -1, 2**31 - 1, 7, 9], np.int64),  # negative: int32
                np.zeros(n, bool), sm_budget=np.array([0, 0, 0, 0, 0, 2**40], np.int64))
    before = {k: getattr(rows, k).copy() for k in ("row", "scheduled", "computed", "sm_budget")}
    rows.narrowed()
    assert rows.row.dtype == np.int32 and rows.scheduled.dtype == np.uint16
    assert rows.computed.dtype == np.int32 and rows.sm_budget.dtype == np.int64
    assert rows.batch_id.dtype == np.int64  # (never narrowed here)
    for k, v in before.items():
        assert np.array_equal(getattr(rows, k), v), k
    rows.widened()
    assert all(getattr(rows, k).dtype == np.int64 for k in before)
