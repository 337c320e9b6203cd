"""Bulk I/O: the output's extension point, kept columns, metadata, types and row groups."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import bulk
from kernel.bulk import BatchContext, ColumnProducer
from kernel.bulk.options import Tuning
from kernel.bulk.stream import PRICE_AHEAD, ROW_GROUP_ROWS
from kernel.io.trace import TraceError

from .bulk_pools import VARIANTS, pool
from .jit_modes import jit_mode  # noqa: F401  (a fixture)
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
    assert got.columns == [*bulk.PRICED_SCHEMA.names, "tokens_x2", "first_tag", "scenario",
                           "pool", "replica", "tag"]
    assert got.select(base.columns).equals(base)  # the priced numbers do not move
    first = df.group_by("batch_id", maintain_order=True).first()
    assert got["tokens_x2"].to_list() == (2 * base["tokens"]).to_list()
    assert got["replica"].to_list() == first["replica"].to_list()
    assert got["first_tag"].to_list() == (10 * first["tag"]).to_list()
    # streaming, with batches spanning chunks, gives the same table
    dst = tmp_path / "o.parquet"
    bulk.price_file(r, df, dst, tuning=Tuning(chunk_rows=17), progress=False, producers=[TWICE],
                    keep=["replica", "tag"])
    assert pl.read_parquet(dst).equals(got)


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
    bulk.price_file(pool(), df, dst, tuning=Tuning(chunk_rows=10_000, workers=2), progress=False,
                    metadata={"blis.scenario": "x", "blis.rows": "300000"})
    md = pq.read_metadata(dst)
    assert md.metadata[b"blis.scenario"] == b"x"
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    # full row groups, then the results still due once every unit was on the pool (at most
    # PRICE_AHEAD per worker, and what was pending then), each written as it came
    full = [g >= ROW_GROUP_ROWS for g in groups]
    tail = full.index(False) if False in full else len(groups)
    assert sum(groups) == n and tail >= 1 and not any(full[tail:]), groups
    assert len(groups) - tail <= PRICE_AHEAD * 2 + 1, groups
    assert pa.types.is_dictionary(pq.read_schema(dst).field("bottleneck").type)
    back = pl.read_parquet(dst)
    assert back.schema["bottleneck"] == pl.Enum(list(bulk.RESOURCE_NAMES))
    assert bulk.price(pool(), df).schema["bottleneck"] == back.schema["bottleneck"]


# -- any row order ---------------------------------------------------------------------------

def _orders(df: pl.DataFrame, seed: int) -> dict[str, pl.DataFrame]:
    """The same rows in other orders, each batch keeping its requests in order."""
    rng = np.random.default_rng(seed)
    ix = df.with_row_index("i")
    key = pl.Series("k", rng.random(df.height))
    shuffled = (ix.with_columns(key).with_columns(pl.col("k").sort().over("batch_id"))
                .sort("k").drop("k", "i"))
    # request-major: the j-th request of every batch, then the (j+1)-th, ...
    major = (ix.with_columns(pl.int_range(pl.len()).over("batch_id").alias("j"))
             .sort("j", "i").drop("j", "i"))
    late = ix.with_columns(pl.when(pl.col("batch_id") == df["batch_id"][0])
                           .then(pl.lit(10**9)).otherwise(pl.col("i")).alias("k"))
    return {"reversed": ix.sort("batch_id", "i", descending=[True, False]).drop("i"),
            "request-major": major, "shuffled": shuffled,
            "late": late.sort("k").drop("k", "i")}


@pytest.mark.usefixtures("jit_mode")  # (compiled scatter and numpy: SJ1)
@pytest.mark.parametrize("seed", [1, 2])
def test_any_row_order_prices_bit_for_bit_like_the_sorted_trace(tmp_path: Path,
                                                                seed: int) -> None:
    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(400, seed)
    want = bulk.price(r, df)  # sorted input
    for name, other in _orders(df, seed).items():
        assert not other.equals(df)
        src = tmp_path / f"{name}.parquet"
        other.write_parquet(src, row_group_size=97)
        dst = tmp_path / f"{name}.out.parquet"
        counts = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50), progress=False)
        got = pl.read_parquet(dst)
        if name == "reversed":  # row groups whose id ranges do not overlap: trace order
            assert counts.mode == "grouped"
            assert got["batch_id"].to_list() == sorted(want["batch_id"].to_list(),
                                                       reverse=True)
        elif name == "late":  # whole batches moved: found by reading batch_id alone
            assert counts.mode == "grouped"
            assert got["batch_id"].to_list() == other["batch_id"].unique(
                maintain_order=True).to_list()
        else:  # sorted through DuckDB: batch_id order, recorded in the file
            assert counts.mode == "sorted"
            assert got["batch_id"].is_sorted()
            cols = pq.ParquetFile(dst).metadata.row_group(0).sorting_columns
            assert cols and cols[0].column_index == 0
        assert got.sort("batch_id").equals(want), name
        mem = bulk.price(r, other)  # in memory: grouped whole, first-row order
        assert mem.sort("batch_id").equals(want), name
    assert not list(tmp_path.glob(".blis-sort-*"))


def test_internal_disorder_inside_row_groups_stays_grouped(tmp_path: Path) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = random_trace(300, 7)
    # rows shuffled only inside each 100-row block (batches keep their request order)
    blocks = df.with_columns((pl.col("batch_id").rank("dense") // 20).alias("blk"))
    key = np.random.default_rng(0).random(df.height)
    mixed = (blocks.with_columns(pl.Series("k", key))
             .with_columns(pl.col("k").sort().over("batch_id"))
             .sort("blk", "k").drop("k", "blk"))
    src = tmp_path / "t.parquet"
    sizes = mixed.group_by((pl.col("batch_id").rank("dense") // 20).alias("b"),
                           maintain_order=True).len()["len"].to_list()
    with pq.ParquetWriter(src, mixed.to_arrow().schema) as w:
        off = 0
        for n in sizes:  # one row group per block
            w.write_table(mixed.slice(off, n).to_arrow())
            off += n
    dst = tmp_path / "o.parquet"
    counts = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=64), progress=False)
    assert counts.mode == "grouped"
    got = pl.read_parquet(dst)
    assert got["batch_id"].is_sorted() and got.equals(bulk.price(r, df))


# -- any Arrow source ------------------------------------------------------------------------

def _reference(tmp_path: Path) -> tuple[pl.DataFrame, pl.DataFrame, Path]:
    df = _tagged(300, 5).with_columns((pl.col("batch_id") % 3).alias("part"))
    src = tmp_path / "t.parquet"
    df.write_parquet(src, row_group_size=200)
    want = bulk.price(pool(), src, keep=["replica"])
    return df, want, src


def test_duckdb_relation_dataset_glob_and_lazyframe_price_like_the_file(tmp_path: Path) -> None:
    import duckdb
    import pyarrow.dataset as ds

    df, want, src = _reference(tmp_path)
    hive = tmp_path / "hive"
    pq.write_to_dataset(df.to_arrow(), hive, partition_cols=["part"])
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, off in enumerate(range(0, df.height, 1000)):
        df.slice(off, 1000).write_parquet(parts / f"p{i:02d}.parquet")
    con = duckdb.connect()
    sources = {
        "duckdb": con.sql(f"SELECT * FROM read_parquet('{src}')"),
        "dataset": ds.dataset(hive, format="parquet", partitioning="hive"),
        "hive dir": hive,
        "glob": str(parts / "p*.parquet"),
        "lazyframe": pl.scan_parquet(src),
        "scanner": ds.dataset(src).scanner(),
    }
    for name, s in sources.items():
        got = bulk.price(pool(), s, keep=["replica"])
        assert got.sort("batch_id").equals(want.sort("batch_id")), name
        dst = tmp_path / "o.parquet"
        counts = bulk.price_file(pool(), s if name != "duckdb" else con.sql(
            f"SELECT * FROM read_parquet('{src}')"), dst, progress=False, keep=["replica"])
        assert counts.rows_in == df.height, name
        assert pl.read_parquet(dst).sort("batch_id").equals(want.sort("batch_id")), name


def test_a_lazyframe_is_streamed_not_collected(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    df, want, src = _reference(tmp_path)

    def no_collect(*a: object, **k: object) -> None:
        raise AssertionError("the LazyFrame was collected whole")
    monkeypatch.setattr(pl.LazyFrame, "collect", no_collect)
    got = bulk.price_result(pool(), pl.scan_parquet(src), keep=["replica"],
                            tuning=Tuning(chunk_rows=64))
    assert got.priced.sort("batch_id").equals(want.sort("batch_id"))


LAZY_RSS = """
import resource, sys
import numpy as np, polars as pl
from kernel import bulk
from kernel.bulk.options import Tuning
from tests.bulk_pools import pool
n = 8_000_000
df = pl.DataFrame({"batch_id": np.arange(n) // 64, "scheduled": np.ones(n, np.int64),
                   "computed": np.arange(n) % 3000, "prompt_len": np.ones(n, np.int64)})
df.write_parquet(sys.argv[1], row_group_size=1 << 16)  # polars decodes groups ahead
size = df.estimated_size()
del df
r = pool()
bulk.price_result(r, pl.LazyFrame({"batch_id": [0], "scheduled": [1], "computed": [0],
                            "prompt_len": [1]}), tuning=Tuning(tmp_dir=sys.argv[2]))  # warm up
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
res = bulk.price_result(r, pl.scan_parquet(sys.argv[1]), tuning=Tuning(
    chunk_rows=1 << 16, sort_memory="64MB", tmp_dir=sys.argv[2]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(res.counts.rows_in, size, peak - base)
"""


def test_a_lazyframe_prices_in_bounded_memory(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", LAZY_RSS, str(tmp_path / "t.parquet"),
                          str(tmp_path)], capture_output=True, text=True, cwd=root, check=True)
    rows, size, grew = (int(x) for x in out.stdout.splitlines()[-1].split())
    assert rows == 8_000_000
    # collecting the frame alone would take `size` bytes (256 MB); streaming takes far less
    assert grew < size / 2, (grew, size)


# -- rejects in memory -------------------------------------------------------------------------

def test_on_reject_modes_and_counts() -> None:
    from kernel.io.trace import RejectedRowError

    from .test_bulk import _bad_trace

    with pytest.warns(bulk.RejectedRowsWarning, match="11 of 14 trace rows rejected"):
        res = bulk.price_result(pool(), _bad_trace())
    assert res.rejects.height == 11
    assert res.counts.rows_in == res.counts.rows_priced + res.counts.rows_rejected
    with pytest.raises(RejectedRowError, match="row 2 .*negative"):
        bulk.price(pool(), _bad_trace(), on_reject="raise")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = bulk.price(pool(), _bad_trace(), on_reject="ignore")
    assert quiet.equals(res.priced)
    with pytest.raises(ValueError, match="on_reject must be one of"):
        bulk.price(pool(), _bad_trace(), on_reject="drop")


def test_rows_in_equal_priced_plus_rejected_in_every_mode(tmp_path: Path) -> None:
    from .test_bulk import _bad_trace

    t = pl.from_arrow(_bad_trace())
    assert isinstance(t, pl.DataFrame)
    shuffled = t.sample(fraction=1.0, shuffle=True, seed=3)
    for name, src in {"grouped": t, "sorted": shuffled, "stream": shuffled.lazy()}.items():
        dst, rej = tmp_path / f"{name}.parquet", tmp_path / f"{name}.rej.parquet"
        c = bulk.price_file(pool(), src, dst, rejects=rej, tuning=Tuning(chunk_rows=3),
                            progress=False)
        assert (c.rows_in, c.rows_priced, c.rows_rejected) == (14, 3, 11), name
        assert pl.read_parquet(rej).height == 11 and pl.read_parquet(dst).height == 2


def test_parquet_row_groups_of_any_size_price_like_memory(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    r = pool(**VARIANTS["dcp4-ctxgather"])

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(n=st.integers(1, 60), seed=st.integers(0, 10**6), group=st.integers(1, 90),
           chunk=st.integers(1, 60), order=st.sampled_from(["plain", "reverse", "permute"]))
    def check(n: int, seed: int, group: int, chunk: int, order: str) -> None:
        df = random_trace(n, seed)
        reverse = order != "plain"
        if order == "reverse":
            df = df.with_row_index("i").sort("batch_id", "i", descending=[True, False]).drop("i")
        elif order == "permute":  # whole batches in a random order
            rank = {b: k for k, b in enumerate(np.random.default_rng(seed).permutation(
                df["batch_id"].unique().to_numpy()))}
            df = (df.with_row_index("i")
                  .with_columns(pl.col("batch_id").replace_strict(rank).alias("k"))
                  .sort("k", "i").drop("k", "i"))
        src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
        df.write_parquet(src, row_group_size=group)
        counts = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=chunk), progress=False)
        if group <= 4 * chunk:  # row groups read whole: batches found together
            assert counts.mode == "grouped"
        mem = bulk.price(r, df)
        got = pl.read_parquet(dst)
        assert counts.rows_in == df.height and got.height == mem.height
        assert got.sort("batch_id").equals(mem.sort("batch_id"))
        if counts.mode == "sorted" or not reverse:
            assert got["batch_id"].is_sorted()

    check()


def test_a_failed_sort_leaves_no_spill_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sort_memory='lots'"):
        bulk.price_file(pool(), random_trace(20, 1), tmp_path / "o.parquet",
                        tuning=Tuning(order="sort", sort_memory="lots"), progress=False)
    assert not list(tmp_path.glob(".blis-*")) and not (tmp_path / "o.parquet").exists()


def test_narrow_counts_cross_the_sort_exactly(tmp_path: Path) -> None:
    from kernel.io.synth import synth

    r = pool(**VARIANTS["pcp2-dcp4"])
    t = pl.from_arrow(synth(300, seed=4, requests_per_batch=12))  # int32 counts
    assert isinstance(t, pl.DataFrame) and t.schema["scheduled"] == pl.Int32
    shuffled = _orders(t.with_columns(pl.col("computed") + 2**30), 4)["shuffled"]
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    shuffled.write_parquet(src, row_group_size=500)  # overlapping row groups
    want = bulk.price(r, t.with_columns(pl.col("computed") + 2**30))
    for order in ("auto", "external"):  # int32 in memory, int32 through DuckDB
        counts = bulk.price_file(r, src, dst, progress=False, tuning=Tuning(order=order))
        assert counts.mode == ("sorted" if order == "auto" else "external")
        assert pl.read_parquet(dst).equals(want)


# -- grouping in memory, or through DuckDB beyond the memory budget ----------------------------

def _with_bad_rows(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Some null and some negative counts: rejected, and their batches with them."""
    pick = np.random.default_rng(seed).choice(df.height, 6, replace=False).tolist()
    return (df.with_row_index("i")
            .with_columns(pl.when(pl.col("i").is_in(pick[:3])).then(None)
                          .when(pl.col("i").is_in(pick[3:])).then(-1)
                          .otherwise(pl.col("scheduled")).alias("scheduled"))
            .drop("i"))


def _reasons(rej: pl.DataFrame) -> list[tuple[int, str, str]]:
    """The rejects without row numbers (which depend on the row order)."""
    return sorted(zip(rej["batch_id"].to_list(), rej["reason"].to_list(),
                      rej["column"].to_list(), strict=True))


@pytest.mark.usefixtures("jit_mode")  # (compiled scatter and numpy: SJ1)
@pytest.mark.parametrize("seed", [3, 4])
def test_every_grouping_path_prices_any_order_like_the_sorted_trace(tmp_path: Path,
                                                                    seed: int) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = _with_bad_rows(random_trace(300, seed), seed)
    want = bulk.price_result(r, df, on_reject="ignore")
    assert want.counts.mode == "grouped" and want.rejects.height > 6
    for name in ("request-major", "shuffled"):
        other = _orders(df, seed)[name]
        src, csv = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
        other.write_parquet(src, row_group_size=97)
        other.write_csv(csv)
        half = 29 * other.height // 2  # bytes: about half the validated rows
        runs = {  # path: (source, keywords, expected mode)
            "memory, planned from statistics": (src, {}, "sorted"),
            "memory, planned after reading": (csv, {}, "sorted"),
            "external": (src, {"order": "external"}, "external"),
            "spill from the start": (src, {"memory_budget": 1}, "spill"),
            "spill from half-way": (src, {"memory_budget": half}, "spill"),
            "external from the start": (csv, {"memory_budget": 1}, "external"),
            "external from half-way": (csv, {"memory_budget": half}, "external"),
        }
        rejects = []
        for path, (source, kw, mode) in runs.items():
            dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
            c = bulk.price_file(r, source, dst, rejects=rej, tuning=Tuning(chunk_rows=64, **kw),
                                progress=False)
            assert c.mode == mode, (name, path)
            assert (c.rows_in, c.rows_priced) == (df.height, want.counts.rows_priced)
            assert c.rows_rejected == want.counts.rows_rejected, (name, path)
            got = pl.read_parquet(dst)
            assert got.equals(want.priced), (name, path)  # bit for bit, batch_id order
            assert pq.ParquetFile(dst).metadata.row_group(0).sorting_columns
            rejects.append(pl.read_parquet(rej).sort("row"))
        for kw in ({}, {"memory_budget": half}, {"memory_budget": 1}, {"order": "external"}):
            for source in (other, other.lazy()):  # in memory: the same paths
                res = bulk.price_result(r, source, tuning=Tuning(chunk_rows=64, **kw),
                                        on_reject="ignore")
                assert res.priced.equals(want.priced), (name, kw)
                rejects.append(res.rejects.sort("row"))
        # the same rows for the same reasons whatever the path (the values as read and
        # their wording depend on the source's types: CSV text, parquet ints)
        key = ["row", "batch_id", "reason", "column", "source"]
        assert all(x.select(key).equals(rejects[0].select(key)) for x in rejects), name
        assert all(x.equals(rejects[0]) for x in rejects[2:5]), name  # parquet, every path
        assert _reasons(rejects[0]) == _reasons(want.rejects), name
    assert not list(tmp_path.glob(".blis-*"))


@pytest.mark.usefixtures("jit_mode")  # (compiled scatter and numpy: SJ1)
def test_partition_groups_rows_like_a_stable_sort() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kernel.bulk import partition as part
    from kernel.io.trace import Rows

    # ("wraps": ids across multiples of 2**16, where their low 16 bits wrap)
    ids_of = st.sampled_from(["dense", "sparse64", "one", "lumpy", "wraps"])

    @settings(max_examples=60, deadline=None)
    @given(kind=ids_of, n=st.integers(1, 400), seed=st.integers(0, 10**6),
           chunk=st.integers(1, 200), piece_rows=st.integers(1, 120),
           planned=st.sampled_from(["histogram", "ranges", "mixed"]))
    def check(kind: str, n: int, seed: int, chunk: int, piece_rows: int, planned: str) -> None:
        rng = np.random.default_rng(seed)
        ids = {"dense": rng.integers(-50, 50, n),
               "sparse64": rng.choice(rng.integers(-2**63, 2**63 - 1, 9, dtype=np.int64), n),
               "one": np.full(n, 2**62),
               "lumpy": np.where(rng.random(n) < 0.8, rng.integers(0, 3, n),
                                 rng.integers(0, 2**40, n)),
               "wraps": rng.choice([-3, 1, 5]) * 2**16 + rng.integers(-40, 40, n),
               }[kind].astype(np.int64)
        kept = np.sort(rng.choice(n + 5, n, replace=False))  # row numbers, some dropped
        rows = Rows(kept.astype(np.int32) if seed % 2 else kept, ids, rng.integers(0, 9, n),
                    rng.integers(0, 9, n), rng.random(n) < (0.1 if seed % 3 else 0.0))
        chunks = [rows.slice(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        lo, hi = int(ids.min()), int(ids.max())
        shift = part.cell_shift(lo, hi)
        exact = part.plan(lo, shift, part.histogram(ids, lo, shift), piece_rows)
        by_ranges = part.plan_from_ranges([(int(c.batch_id.min()), int(c.batch_id.max()),
                                            len(c)) for c in chunks], piece_rows)
        assert by_ranges is not None
        assert all(part.fits(p, ids) for p in (exact, by_ranges))
        final = by_ranges if planned == "ranges" else exact
        held = []
        for i, c in enumerate(chunks):
            fresh = not (planned == "mixed" and i % 2)
            if not fresh:  # scattered by one plan, then by another
                c = part.scatter(c, by_ranges, fresh=True).absolute()
            held.append(part.scatter(c, final, fresh=fresh))
        pieces = [part.gather_piece(held, k) for k in range(final.n)]
        for k, p in enumerate(pieces):  # each piece's rows, with their ids restored
            lo_k, span = final.piece_lo(k), final.piece_span(k)  # (Python ints: no overflow)
            assert sorted(p.batch_id.tolist()) == sorted(i for i in ids.tolist()
                                                         if lo_k <= i < lo_k + span)
        got = Rows.concat([part.group_piece(p, final.piece_lo(k), final.piece_span(k))
                           for k, p in enumerate(pieces)])
        order = np.argsort(ids, kind="stable")
        assert got.batch_id.tolist() == ids[order].tolist()
        assert got.row.tolist() == kept[order].tolist()  # each batch's rows in input order
        assert got.bad.tolist() == rows.bad[order].tolist()
        assert got.scheduled.dtype == np.int64  # widened for the walk

    check()


@pytest.mark.usefixtures("jit_mode")  # (compiled scatter and numpy: SJ1)
def test_a_plan_the_rows_do_not_fit_is_replaced(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Statistics that do not cover the ids read (they never should): the chunks that do not
    fit the plan made before reading are grouped by a plan made after, prices unchanged."""
    from kernel.io import sources

    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(200, 5)
    want = bulk.price(r, df)
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    _orders(df, 5)["shuffled"].write_parquet(src, row_group_size=64)
    lo, hi = int(df["batch_id"].min()), int(df["batch_id"].max())
    for ranges in ([(lo, (lo + hi) // 2, df.height)], [(hi + 1, hi + 10**6, df.height)]):
        monkeypatch.setattr(sources, "_id_ranges", lambda frags, col, rr=ranges: rr)
        counts = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50), progress=False)
        assert counts.mode == "sorted"
        assert pl.read_parquet(dst).equals(want)


@pytest.mark.usefixtures("jit_mode")  # (compiled scatter and numpy: SJ1)
def test_kept_and_produced_columns_follow_the_rows_through_every_grouping(
        tmp_path: Path) -> None:
    r = pool(**VARIANTS["pcp2-dcp4"])
    df = _tagged(200, 6)
    want = bulk.price(r, df, producers=[TWICE], keep=["replica", "tag"])
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    _orders(df, 6)["shuffled"].write_parquet(src, row_group_size=77)
    for kw in ({}, {"order": "external"}, {"memory_budget": 1}):
        c = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=40, **kw), progress=False,
                            producers=[TWICE], keep=["replica", "tag"])
        assert c.mode == ("sorted" if not kw else "spill" if "memory_budget" in kw
                          else "external")
        assert pl.read_parquet(dst).equals(want), kw


def test_allocator_is_tuned_by_the_command_line_only() -> None:
    """A library call leaves the process's allocator alone; the command line (an
    application) tunes it when its module is imported, before numpy starts threads."""
    import subprocess
    import sys

    probe = ("import kernel.io.malloc as m, numpy, kernel.bulk as b{extra}; "
             "print(m._TUNED)")
    lib = probe.format(extra="; b.price(__import__('tests.bulk_pools', fromlist=['pool'])"
                             ".pool(), __import__('polars').DataFrame({'batch_id': [1], "
                             "'scheduled': [1], 'computed': [3], 'prompt_len': [1]}))")
    import os

    cli = str(sys.platform.startswith("linux") and not os.environ.get("BLIS_KEEP_MALLOC"))
    for code, want in ((lib, "False"), (probe.format(extra=", kernel.cli"), cli)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], check=True)
        assert out.stdout.split()[-1] == want, (code, out.stdout, out.stderr[-2000:])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tuning is Linux-only")
def test_the_memory_allocator_mode_leaves_glibc_and_moves_arrow(tmp_path: Path) -> None:
    """BLIS_ALLOCATOR=memory (decision AL1): Arrow's pool becomes jemalloc/mimalloc, glibc's
    settings stay; speed (the default) puts Arrow on the tuned system heap; an unknown mode
    names the allowed ones; and the mode never changes a priced number."""
    import os
    import subprocess

    probe = ("import os, kernel.io.malloc as m, pyarrow as pa; m.tune(); "
             "print(m._TUNED, pa.default_memory_pool().backend_name, "
             "os.environ.get('MIMALLOC_PURGE_DELAY'))")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("BLIS_KEEP_MALLOC", "MIMALLOC_PURGE_DELAY")}
    got = {}
    for mode in ("speed", "memory"):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             cwd=root, check=True, env={**env, "BLIS_ALLOCATOR": mode})
        got[mode] = out.stdout.split()
    assert got["speed"] == ["True", "system", "0"]  # (mimalloc's purge delay: AL5)
    assert got["memory"][0] == "True" and got["memory"][1] in ("jemalloc", "mimalloc")
    assert got["memory"][2] == "0"
    own = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=root, check=True, env={**env, "MIMALLOC_PURGE_DELAY": "250"})
    assert own.stdout.split()[2] == "250"  # (a user's own setting stands)
    bad = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=root, env={**env, "BLIS_ALLOCATOR": "fast"})
    assert bad.returncode != 0 and "BLIS_ALLOCATOR='fast': expected one of 'speed', " \
        "'memory'" in bad.stderr
    src = tmp_path / "t.parquet"
    random_trace(400, 5).write_parquet(src)
    outs = []
    for mode in ("speed", "memory"):
        dst = tmp_path / f"{mode}.parquet"
        subprocess.run([sys.executable, "-m", "kernel.cli", "price", str(src), "-s",
                        "llama-3.1-8b-h100-tp1", "-o", str(dst), "--no-progress"],
                       cwd=root, check=True, capture_output=True,
                       env={**env, "BLIS_ALLOCATOR": mode})
        outs.append(pl.read_parquet(dst))
    assert outs[0].equals(outs[1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-3, 40), max_size=60), st.integers(0, 9000))
def test_all_distinct_is_no_value_twice(values: list[int], spread: int) -> None:
    # prefixes are sorted first (a repeat shows early in a shuffled column): the answer must
    # be the plain one whatever the length, with the repeat early, late or absent
    from kernel.io.trace import all_distinct

    for ids in (np.array(values, np.int64), np.arange(spread, dtype=np.int64) * 7 % 9001,
                np.r_[np.arange(spread), values].astype(np.int64)):
        assert all_distinct(ids) == (len(set(ids.tolist())) == ids.size)


def test_rows_grouped_in_memory_skip_compiled_loops_and_spilled_rows_use_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CS1: a shuffled trace grouped in memory is scattered and gathered by Arrow even where
    compiled loops are on (numba's start would cost such a run more than it saves); one
    spilled to disk asks for the compiled loops. Prices the same either way."""
    pytest.importorskip("numba", reason="numba is not installed for this Python")
    from kernel.bulk import partition

    from .jit_modes import jit_switched

    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(300, 7)
    want = bulk.price(r, df)
    src = tmp_path / "t.parquet"
    _orders(df, 7)["shuffled"].write_parquet(src, row_group_size=64)
    asked: list[int] = []
    compiled = partition._compiled

    def counting() -> object:
        asked.append(1)
        return compiled()

    monkeypatch.setattr(partition, "_compiled", counting)
    with jit_switched(True):
        for budget, mode, uses in ((None, "sorted", False), (20_000, "spill", True)):
            asked.clear()
            dst = tmp_path / f"{mode}.parquet"
            counts = bulk.price_file(r, src, dst, progress=False, tuning=Tuning(
                chunk_rows=50, memory_budget=budget))
            assert counts.mode == mode
            assert bool(asked) == uses, mode
            assert pl.read_parquet(dst).sort("batch_id").equals(want), mode
