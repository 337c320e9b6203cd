"""Priced rows carry ``scenario`` and ``pool`` (issue 30 item 4): dictionary-encoded, last
before the kept columns, every other column unchanged bit for bit, and joinable in SQL."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel import bulk
from kernel.io.synth import synth
from kernel.io.trace import TraceError

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
LLAMA = "llama-3.1-8b-h100-tp1"
PD = "deepseek-v3-h200-1p1d"


@pytest.fixture(scope="module")
def ds3() -> kernel.Kernel:
    return kernel.open(DS3)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**31 - 1))
def test_identity_adds_two_columns_and_moves_no_number(ds3: kernel.Kernel, batches: int,
                                                       seed: int) -> None:
    trace = synth(batches, seed=seed)
    plain = ds3.price(trace, identity=False)
    got = ds3.price(trace)
    assert got.columns == [*plain.columns, "scenario", "pool"]
    assert got.drop("scenario", "pool").equals(plain)  # bit for bit, every old column
    assert got["scenario"].dtype == pl.Categorical
    assert set(got["scenario"].to_list()) == {DS3} and set(got["pool"].to_list()) == {0}


def test_the_columns_are_dictionary_encoded_in_arrow_and_parquet(ds3: kernel.Kernel,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    counts = kernel.price_file(ds3, synth(300, seed=1), out, progress=False)
    table = pq.read_table(out)
    assert table.num_rows == counts.batches_priced
    assert table.schema.field("scenario").type == pa.dictionary(pa.int32(), pa.string())
    assert table.schema.field("pool").type == pa.int32()
    meta = pq.ParquetFile(out).metadata.row_group(0)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    for name in ("scenario", "pool"):
        chunk = meta.column(names.index(name))
        assert any("DICT" in e for e in chunk.encodings), chunk.encodings


def test_pool_is_the_pool_priced() -> None:
    k1 = kernel.open(PD, None, 1)
    priced = k1.price(synth(50, seed=3))
    assert set(priced["pool"].to_list()) == {1} and set(priced["scenario"].to_list()) == {PD}


def test_priced_files_of_two_deployments_join_in_sql(tmp_path: Path) -> None:
    trace = synth(200, seed=5)
    files = []
    for name in (DS3, LLAMA):
        files.append(str(tmp_path / f"{name}.parquet"))
        kernel.price_file(kernel.open(name), trace, files[-1], progress=False)
    rows = duckdb.sql(f"""
        SELECT a.batch_id, a.scenario AS sa, b.scenario AS sb,
               b.no_overlap_ns - a.no_overlap_ns AS delta
        FROM read_parquet('{files[0]}') a JOIN read_parquet('{files[1]}') b USING (batch_id)
        ORDER BY batch_id""").pl()
    assert rows.height == pl.read_parquet(files[0]).height
    assert set(rows["sa"]) == {DS3} and set(rows["sb"]) == {LLAMA}
    per = duckdb.sql(f"SELECT scenario, pool, count(*) AS n FROM read_parquet({files!r}) "
                     "GROUP BY ALL ORDER BY scenario").fetchall()
    assert [(s, p) for s, p, _ in per] == sorted([(DS3, 0), (LLAMA, 0)])


def test_a_kept_column_of_the_same_name_is_refused_before_pricing(ds3: kernel.Kernel) -> None:
    trace = pl.from_arrow(synth(20, seed=2)).with_columns(pl.lit("x").alias("scenario"))
    with pytest.raises(TraceError, match="'scenario' the priced table already has"):
        ds3.price(trace, keep=["scenario"])
    kept = ds3.price(trace, keep=["scenario"], identity=False)  # the way to keep one's own
    assert set(kept["scenario"].to_list()) == {"x"}


def test_a_bare_resolved_pool_carries_them_too(ds3: kernel.Kernel) -> None:
    priced = bulk.price(ds3.resolved_pool, synth(30, seed=4))
    assert set(priced["scenario"].to_list()) == {ds3.resolved_pool.scenario}
    assert set(priced["pool"].to_list()) == {ds3.resolved_pool.pool_index}
