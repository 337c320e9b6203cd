"""Bulk I/O: the output's extension point, kept columns, metadata, types and row groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel import bulk
from kernel.bulk import BatchContext, ColumnProducer
from kernel.trace import TraceError

from .bulk_pools import VARIANTS, pool
from .test_bulk import random_trace


def _tokens_twice(ctx: BatchContext) -> dict[str, np.ndarray]:
    return {"tokens_x2": 2 * ctx.summary.tokens_all,
            "first_tag": np.asarray(ctx.inputs["tag"]) * 10}


TWICE = ColumnProducer("twice", (pa.field("tokens_x2", pa.int64()),
                                 pa.field("first_tag", pa.int64())),
                       _tokens_twice, inputs=("tag",))


def _tagged(n: int, seed: int) -> pl.DataFrame:
    df = random_trace(n, seed)
    rng = np.random.default_rng(seed)
    return df.with_columns(pl.Series("tag", rng.integers(0, 1000, df.height)),
                           pl.Series("replica", rng.choice(["a", "b", "c"], df.height)))


def test_producer_and_keep_columns_follow_the_base_columns(tmp_path: Path) -> None:
    r = pool(**VARIANTS["pcp2-dcp4"])
    df = _tagged(300, 3)
    base = bulk.price(r, df)
    got = bulk.price(r, df, producers=[TWICE], keep=["replica", "tag"])
    assert got.columns == [*bulk.PRICED_SCHEMA.names, "tokens_x2", "first_tag", "replica",
                           "tag"]
    assert got.select(base.columns).equals(base)  # the priced numbers do not move
    first = df.group_by("batch_id", maintain_order=True).first()
    assert got["tokens_x2"].to_list() == (2 * base["tokens"]).to_list()
    assert got["replica"].to_list() == first["replica"].to_list()
    assert got["first_tag"].to_list() == (10 * first["tag"]).to_list()
    # streaming, with batches spanning chunks, gives the same table
    dst = tmp_path / "o.parquet"
    bulk.price_file(r, df, dst, chunk_rows=17, progress=False, producers=[TWICE],
                    keep=["replica", "tag"])
    assert pl.read_parquet(dst).equals(got)


def test_registered_producer_applies_to_every_run() -> None:
    bulk.register_columns(TWICE)
    try:
        got = bulk.price(pool(), _tagged(40, 1))
        assert "tokens_x2" in got.columns
    finally:
        bulk.unregister_columns("twice")
    assert "tokens_x2" not in bulk.price(pool(), _tagged(40, 1)).columns


def test_clashing_or_missing_added_columns_are_errors() -> None:
    df = _tagged(20, 2)
    with pytest.raises(TraceError, match="'tokens' the priced table already has"):
        bulk.price(pool(), df.with_columns(pl.col("tag").alias("tokens")), keep=["tokens"])
    with pytest.raises(TraceError, match="no column 'nope'"):
        bulk.price(pool(), df, keep=["nope"])
    bad = ColumnProducer("short", (pa.field("x", pa.int64()),), lambda ctx: {"x": [1]})
    with pytest.raises(ValueError, match="returned 1 values for 'x'"):
        bulk.price(pool(), df, producers=[bad])


def test_metadata_bottleneck_type_and_row_groups(tmp_path: Path) -> None:
    n = 300_000  # one request per batch: more than one row group of batches
    df = pl.DataFrame({"batch_id": np.arange(n), "scheduled": np.ones(n, np.int64),
                       "computed": np.arange(n) % 5000, "prompt_len": np.ones(n, np.int64)})
    dst = tmp_path / "o.parquet"
    bulk.price_file(pool(), df, dst, chunk_rows=10_000, progress=False,
                    metadata={"blis.scenario": "x", "blis.rows": "300000"})
    md = pq.read_metadata(dst)
    assert md.metadata[b"blis.scenario"] == b"x"
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    assert sum(groups) == n and all(g >= 128 * 1024 for g in groups[:-1]) and len(groups) >= 2
    assert pa.types.is_dictionary(pq.read_schema(dst).field("bottleneck").type)
    back = pl.read_parquet(dst)
    assert back.schema["bottleneck"] == pl.Enum(list(bulk.RESOURCE_NAMES))
    assert bulk.price(pool(), df).schema["bottleneck"] == back.schema["bottleneck"]
