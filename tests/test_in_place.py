"""Pricing rows where they lie: batches whose rows are not contiguous price exactly like
grouped ones (the walk reduces by a dense batch index, in row order), so a trace in no known
order is never grouped unless something needs the rows contiguous."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel import bulk
from kernel.bulk import BatchContext, ColumnProducer, engine, walk
from kernel.bulk.groups import groups_in_range, groups_of_grouped, regroup
from kernel.bulk.options import Tuning
from kernel.bulk.utilisation import column_producer
from kernel.io.trace import Rows
from kernel.model import step

from .bulk_pools import VARIANTS, pool
from .test_bulk import random_trace
from .test_bulk_io import _orders

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"


def _interleaved(ids: np.ndarray, seed: int) -> np.ndarray:
    """A permutation of the rows that mixes batches but keeps each batch's rows in order."""
    key = np.random.default_rng(seed).random(ids.size)
    for b in np.unique(ids):  # each batch's keys sorted: its rows stay in order
        at = np.flatnonzero(ids == b)
        key[at] = np.sort(key[at])
    return np.argsort(key, kind="stable")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), span=st.integers(1, 70), seed=st.integers(0, 10**6))
def test_batches_of_rows_in_any_order_reduce_like_grouped_ones(n: int, span: int,
                                                                seed: int) -> None:
    rng = np.random.default_rng(seed)
    lo = int(rng.integers(-2**40, 2**40))
    ids = lo + rng.integers(0, span, n)
    v = rng.integers(-2**40, 2**40, n)
    g = groups_in_range(ids, lo, span)
    order = np.argsort(ids, kind="stable")
    want = groups_of_grouped(ids[order])
    assert not g.grouped and g.ids.tolist() == want.ids.tolist()
    assert g.counts.tolist() == want.counts.tolist()
    assert g.sum(v).tolist() == want.sum(v[order]).tolist()
    assert g.max(v).tolist() == want.max(v[order]).tolist()
    assert order[want.starts].tolist() == g.starts.tolist()  # each batch's first row
    rows = Rows(np.arange(n), ids, v, v, np.zeros(n, bool))
    grouped, gg = regroup(rows, g)
    assert gg.grouped and grouped.row.tolist() == order.tolist()
    assert gg.starts.tolist() == want.starts.tolist()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_walk_sums_rows_in_place_bit_for_bit(variant: str) -> None:
    r = pool(**VARIANTS[variant])
    df = random_trace(150, 11, per_batch_cols=False)
    ids = df["batch_id"].to_numpy()
    s, c = df["scheduled"].to_numpy(), df["computed"].to_numpy()
    grouped = groups_of_grouped(ids)
    nb = grouped.n
    thr, sm = np.ones(nb, np.int64), np.full(nb, 66, np.int64)
    want = walk.summarise_columns(r, grouped, s, c, thr, sm)
    for seed in range(3):
        perm = _interleaved(ids, seed)
        mixed = groups_in_range(ids[perm], int(ids.min()), int(ids.max() - ids.min()) + 1)
        got = walk.summarise_columns(r, mixed, s[perm], c[perm], thr, sm)
        for name, a, b in zip(step.BatchSummary._fields, got, want, strict=True):
            if isinstance(a, tuple):
                assert len(a) == len(b), name
                for x, y in zip(a, b, strict=True):
                    assert np.array_equal(x, y) and np.asarray(x).dtype == np.asarray(y).dtype
            else:
                assert np.array_equal(a, b), name


def _widest_request(ctx: BatchContext) -> dict[str, Any]:
    """A producer that reads the grouped rows (as producers written for sorted traces do)."""
    assert ctx.rows is not None and ctx.starts is not None
    assert bool(np.all(np.diff(ctx.rows.batch_id) >= 0))  # grouped, batches in id order
    return {"widest": np.maximum.reduceat(ctx.rows.scheduled, ctx.starts)}


WIDEST = ColumnProducer("widest", (pa.field("widest", pa.int64()),), _widest_request)


@pytest.fixture(scope="module")
def ds3() -> Any:
    return kernel.open(DS3)


def test_a_shuffled_trace_is_priced_in_place_with_every_kind_of_column(
        tmp_path: Path, ds3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    df = random_trace(400, 5, per_batch_cols=False)
    df = df.with_columns(pl.Series("replica", rng.choice(["a", "b"], df.height)))
    extra: dict[str, Any] = {"producers": [column_producer(), WIDEST], "keep": ["replica"]}
    want = bulk.price(ds3, df, **extra)
    assert (want["limits"] != "").any() and (want["limits"] == "").any()
    grouped_pieces: list[int] = []
    real = engine.group_piece

    def counting(rows: Rows, lo: int, span: int) -> Rows:
        grouped_pieces.append(len(rows))
        return real(rows, lo, span)

    monkeypatch.setattr(engine, "group_piece", counting)
    for name in ("shuffled", "request-major"):
        src, dst = tmp_path / f"{name}.parquet", tmp_path / f"{name}.out.parquet"
        _orders(df, 5)[name].write_parquet(src, row_group_size=101)
        counts = bulk.price_file(ds3, src, dst, tuning=Tuning(chunk_rows=60), progress=False,
                                 **extra)
        assert counts.mode == "sorted"
        assert pl.read_parquet(dst).equals(want), name
    assert grouped_pieces == []  # every piece priced where its rows lay
    # a rejected row: its piece is grouped first (its batch is set aside), the rest unchanged
    bad = _orders(df, 5)["shuffled"].with_columns(
        pl.when(pl.int_range(pl.len()) == 7).then(-1).otherwise(pl.col("computed"))
        .alias("computed"))
    src, dst = tmp_path / "bad.parquet", tmp_path / "bad.out.parquet"
    bad.write_parquet(src, row_group_size=101)
    counts = bulk.price_file(ds3, src, dst, tuning=Tuning(chunk_rows=60), progress=False, **extra)
    assert len(grouped_pieces) == 1 and counts.rows_rejected >= 1
    dropped = bad["batch_id"][7]
    assert pl.read_parquet(dst).equals(want.filter(pl.col("batch_id") != dropped))


# -- mode "summed": per-batch sums as the rows stream by --------------------------------------

def _shuffled_parquet(tmp_path: Path, df: pl.DataFrame, name: str, seed: int = 5) -> Path:
    src = tmp_path / f"{name}.parquet"
    _orders(df, seed)[name].write_parquet(src, row_group_size=101)
    return src


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), pieces=st.integers(1, 12),
       variant=st.sampled_from(sorted(VARIANTS)))
def test_sums_added_piece_by_piece_equal_sums_of_all_rows(seed: int, pieces: int,
                                                          variant: str) -> None:
    p = step.prepared(pool(**VARIANTS[variant]))
    df = random_trace(40, seed % 1000, per_batch_cols=False)
    ids = df["batch_id"].to_numpy()
    perm = _interleaved(ids, seed)
    key, s, c = ids[perm] - ids.min(), df["scheduled"].to_numpy()[perm], \
        df["computed"].to_numpy()[perm]
    span = int(key.max()) + 1
    whole = walk.RowSums.zeros(p, span).add(walk.row_terms(p, key, s, c, 1))
    cuts = np.sort(np.random.default_rng(seed).integers(0, key.size, pieces - 1))
    parts = walk.RowSums.zeros(p, span)
    for a, b in zip([0, *cuts], [*cuts, key.size], strict=True):
        parts.add(walk.row_terms(p, key[a:b], s[a:b], c[a:b], 1))
    keep = np.flatnonzero(whole.sums["requests"])
    sm = np.zeros(keep.size, np.int64)
    want, got = whole.select(keep).summary(p, sm), parts.select(keep).summary(p, sm)
    for name, a, b in zip(step.BatchSummary._fields, got, want, strict=True):
        if isinstance(a, tuple):
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), name
        else:
            assert np.array_equal(a, b), name


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_pool_prices_a_request_major_trace_by_summing_it(tmp_path: Path, variant: str) -> None:
    r = pool(**VARIANTS[variant])
    df = random_trace(300, 8, per_batch_cols=False)
    want = bulk.price(r, df)
    # request by request: rows near each other in id, summed as they come; shuffled: grouped
    for name, mode in (("request-major", "summed"), ("shuffled", "sorted")):
        dst = tmp_path / f"{name}.out.parquet"
        counts = bulk.price_file(r, _shuffled_parquet(tmp_path, df, name), dst,
                                 tuning=Tuning(chunk_rows=70), progress=False)
        assert counts.mode == mode, name
        assert pl.read_parquet(dst).equals(want), (variant, name)
        res = bulk.price_result(r, _orders(df, 5)[name])  # an in-memory table: the same
        assert res.counts.mode == mode and res.priced.equals(want), (variant, name)
        cols = pq.ParquetFile(dst).metadata.row_group(0).sorting_columns
        assert cols and cols[0].column_index == 0  # batch_id order, recorded


def test_a_kernel_sums_a_request_major_trace_with_its_limits_and_utilisation(
        tmp_path: Path, ds3: Any) -> None:
    df = random_trace(500, 9, per_batch_cols=False)
    want = bulk.price(ds3, df, producers=[column_producer()])
    assert (want["limits"] != "").any() and (want["limits"] == "").any()
    src, dst = _shuffled_parquet(tmp_path, df, "request-major"), tmp_path / "o.parquet"
    counts = bulk.price_file(ds3, src, dst, tuning=Tuning(chunk_rows=64), progress=False,
                             producers=[column_producer()])
    assert counts.mode == "summed"
    assert (counts.rows_in, counts.rows_priced, counts.batches_priced) == (
        df.height, df.height, want.height)
    assert pl.read_parquet(dst).equals(want)


@pytest.mark.parametrize("case", ["keep", "per-batch column", "row producer", "csv",
                                  "rejected row", "over limit", "huge counts"])
def test_what_needs_the_rows_of_a_batch_takes_the_grouping_path(tmp_path: Path, ds3: Any,
                                                                case: str) -> None:
    df = random_trace(200, 10, per_batch_cols=case == "per-batch column")
    kw: dict[str, Any] = {}
    if case == "keep":
        df = df.with_columns(pl.col("batch_id").mod(3).alias("tag"))
        kw["keep"] = ["tag"]
    elif case == "row producer":
        kw["producers"] = [WIDEST]
    elif case == "over limit":
        kw["reject_over_limit"] = True
    elif case == "huge counts":  # a batch's sums might pass int64: checked batch by batch
        sizes = df.group_by("batch_id").len()
        big = sizes.filter(pl.col("len") >= 2)["batch_id"][0]
        df = df.with_columns(pl.when(pl.col("batch_id") == big).then(2**62)
                             .otherwise(pl.col("computed")).alias("computed"))
    elif case == "rejected row":
        df = df.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(-1)
                             .otherwise(pl.col("scheduled")).alias("scheduled"))
    want = bulk.price_result(ds3, df, on_reject="ignore", **kw)
    src = _shuffled_parquet(tmp_path, df, "request-major")
    if case == "csv":  # no statistics: the id range is not known before reading
        src = tmp_path / "t.csv"
        _orders(df, 5)["request-major"].write_csv(src)
    dst, rej = tmp_path / "o.parquet", tmp_path / "r.parquet"
    counts = bulk.price_file(ds3, src, dst, rejects=rej, tuning=Tuning(chunk_rows=64),
                             progress=False, **kw)
    assert counts.mode == "sorted", case
    assert pl.read_parquet(dst).equals(want.priced), case
    assert counts.rows_rejected == want.counts.rows_rejected
    # mode summed holds no row: the rows it took are read again, neither counted nor
    # rejected twice
    assert (counts.rows_in, pl.read_parquet(rej).height) == (df.height, counts.rows_rejected)
    if case in ("rejected row", "huge counts", "over limit"):
        assert counts.rows_rejected > 0, case
    if case == "rejected row":  # found late, after chunks summed without their rows held
        assert pl.read_parquet(src)["scheduled"].arg_min() >= 3 * 64
    if case in ("rejected row", "huge counts"):  # an in-memory table: read again as well
        res = bulk.price_result(ds3, _orders(df, 5)["request-major"], on_reject="ignore",
                                tuning=Tuning(chunk_rows=64))
        assert res.counts.mode == "sorted" and res.priced.equals(want.priced), case
        assert res.counts.rows_rejected == want.counts.rows_rejected


def test_row_totals_are_checked_and_reach_the_producer_in_every_mode(tmp_path: Path) -> None:
    from kernel.bulk.columns import RowTotal
    from kernel.io.trace import TraceError

    with pytest.raises(ValueError, match="kind must be one of"):
        RowTotal("x", "mean", lambda r, s, c: s)
    widest = RowTotal("widest", "max", lambda r, s, c: s)
    other = RowTotal("widest", "sum", lambda r, s, c: s)
    produce = lambda ctx: {"widest": ctx.row_totals["widest"]}  # noqa: E731
    fields = (pa.field("widest", pa.int64()),)
    with pytest.raises(TraceError, match="another producer defines differently"):
        bulk.price(pool(), random_trace(5, 1, per_batch_cols=False), producers=[
            ColumnProducer("a", fields, produce, totals=(widest,), needs_rows=False),
            ColumnProducer("b", (pa.field("w2", pa.int64()),), produce, totals=(other,))])
    df = random_trace(200, 12, per_batch_cols=False)
    want = df.group_by("batch_id").agg(pl.col("scheduled").max().alias("widest"))
    streamed = ColumnProducer("w", fields, produce, totals=(widest,), needs_rows=False)
    for name, mode in (("request-major", "summed"), ("shuffled", "sorted")):
        dst = tmp_path / f"{name}.parquet"
        counts = bulk.price_file(pool(), _shuffled_parquet(tmp_path, df, name), dst,
                                 tuning=Tuning(chunk_rows=50), progress=False, producers=[streamed])
        assert counts.mode == mode
        got = pl.read_parquet(dst).select("batch_id", "widest")
        assert got.equals(want.sort("batch_id")), name
