"""Bulk pricing == scalar pricing, exactly; bad rows; streaming == in-memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel import bulk
from kernel.bulk.options import Tuning
from kernel.io.synth import synth
from kernel.io.trace import RejectedRowError
from kernel.model import step
from kernel.model.types import Batch, Resource

from .bulk_pools import VARIANTS, pool

RES_COLS = [f"{r.value}_ns" for r in Resource]
# One of each family the issue names, as far as the embedded data has them.
SCENARIOS = {
    "dense": "llama-3.1-8b-h100-tp1",
    "moe-mla": "deepseek-v3-h200-fp8-sglang-tp8",
    "sparse-mla-dcp": "glm5-h200-tp8-dcp4",
    "sliding-window": "gpt-oss-120b-h200-fp4-vllm-tp8",
    "hybrid-recurrent": "nemotron3-ultra-h100-agg",
    "pcp": "deepseek-v3-h200-tp8-pcp2",
    "sparse-mla-compressed-window": "deepseek-v4-pro-b200-fp4-vllm-tp8",
}
BATCHES_PER_SCENARIO = 3000  # x 7 scenarios: 21,000 random batches


def random_trace(n: int, seed: int, *, per_batch_cols: bool = True) -> pl.DataFrame:
    """Batches that hit every branch: decodes, prefill chunks, empty rows (ctx 0), zero
    scheduled with context, uniform decode, odd thresholds and SM budgets, long contexts."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 14, n)
    bid = np.repeat(np.arange(n, dtype=np.int64) * 3 + 7, sizes)  # sparse, increasing ids
    m = bid.size
    kind = rng.random(m)
    s = np.where(kind < 0.6, 1, np.where(kind < 0.66, 0, np.where(
        kind < 0.72, rng.integers(2, 5, m), rng.integers(2, 9000, m))))
    c = np.where(rng.random(m) < 0.25, 0, rng.integers(0, 300_000, m))
    uniform = rng.random(n) < 0.1  # some all-decode batches
    s = np.where(uniform[np.searchsorted(np.unique(bid), bid)], 1, s)
    # a batch scheduling no token is no forward pass (a reject, RL8): its first row gets one
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    s[starts[np.add.reduceat(s, starts) == 0]] = 1
    cols = {"batch_id": bid, "scheduled": s, "computed": c, "prompt_len": c + s}
    if per_batch_cols:
        thr = rng.choice([1, 1, 1, 1, 0, 4, 2], n)  # (a negative one is a reject: RL8)
        sm = rng.choice([0, 0, 0, 40, 66, 132, 10_000], n)
        dense = np.searchsorted(np.unique(bid), bid)
        cols["decode_threshold"] = thr[dense]
        cols["sm_budget"] = sm[dense]
    return pl.DataFrame(cols)


def scalar_prices(r, df: pl.DataFrame, *, thr: int = 1, sm: int = 0) -> pl.DataFrame:
    out = []
    has_thr = "decode_threshold" in df.columns
    for (b,), grp in df.group_by("batch_id", maintain_order=True):
        reqs = list(zip(grp["scheduled"].to_list(), grp["computed"].to_list(), strict=True))
        if not any(s for s, _ in reqs):
            continue  # no token scheduled: no forward pass, a reject in bulk (RL8)
        batch = Batch(reqs, decode_threshold=int(grp["decode_threshold"][0]) if has_thr else thr,
                      sm_budget=int(grp["sm_budget"][0]) if has_thr else sm)
        per: dict[Resource, int] = {}
        est = step.step_time_into(r, batch, per)
        row = {"batch_id": b, "overlap_ns": est.overlap, "no_overlap_ns": est.no_overlap,
               "bottleneck": est.bottleneck.value}
        row.update({f"{x.value}_ns": per.get(x, 0) for x in Resource})
        summ = step.summarise(r, batch)
        row.update({"tokens": batch.tokens(), "requests": len(reqs),
                    "prefill_requests": summ.prefill_requests,
                    "decode_requests": summ.decode_requests})
        out.append(row)
    return pl.DataFrame(out, schema_overrides={c: pl.Int64 for c in
                                               [*RES_COLS, "prefill_requests",
                                                "decode_requests"]})


def assert_bulk_equals_scalar(r, df: pl.DataFrame, **kw) -> pl.DataFrame:
    got = bulk.price(r, df, **kw)
    want = scalar_prices(r, df, thr=kw.get("decode_threshold", 1), sm=kw.get("sm_budget", 0))
    assert got.height == want.height
    cols = ["batch_id", "overlap_ns", "no_overlap_ns", "bottleneck", *RES_COLS, "tokens",
            "requests", "prefill_requests", "decode_requests"]
    # (batches in trace order, or in batch_id order when the trace's batches are scattered)
    g, w = got.select(cols).sort("batch_id"), want.select(cols).sort("batch_id")
    if not g.equals(w):
        diff = g.with_row_index().join(w.with_row_index(), on="index", suffix="_want")
        bad = diff.filter(pl.any_horizontal([pl.col(c) != pl.col(f"{c}_want") for c in cols]))
        raise AssertionError(f"{bad.height} batches differ, first:\n{bad.head(3)}")
    assert (got["prefill_requests"] + got["decode_requests"] <= got["requests"]).all()
    return got


# -- the equality test ------------------------------------------------------------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bulk_equals_scalar_on_hand_built_pools(variant: str) -> None:
    r = pool(**VARIANTS[variant])
    df = random_trace(700, seed=sorted(VARIANTS).index(variant))
    got = assert_bulk_equals_scalar(r, df)
    assert got["prefill_requests"].sum() > 0 and got["decode_requests"].sum() > 0


@pytest.mark.parametrize("variant", ["pcp2-dcp4", "dcp4-ctxgather", "sparse-dcp2", "window-pcp2"])
def test_array_summary_equals_stacked_scalar_summaries(variant: str) -> None:
    r = pool(**VARIANTS[variant])
    df = random_trace(300, seed=5, per_batch_cols=False)
    rows, g = bulk._group(bulk._rows_of(df))
    got = bulk.summarise_columns(r, g, rows.scheduled, rows.computed,
                                 np.ones(g.n, np.int64), np.zeros(g.n, np.int64))
    batches = [Batch(list(zip(grp["scheduled"].to_list(), grp["computed"].to_list(),
                              strict=True)))
               for _, grp in df.group_by("batch_id", maintain_order=True)]
    want = step.stack_summaries([step.summarise(r, b) for b in batches])
    for name in step.BatchSummary._fields:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, tuple):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("family", sorted(SCENARIOS))
def test_bulk_equals_scalar_on_embedded_scenarios(family: str) -> None:
    import kernel
    from kernel.model import step as step_mod

    k = kernel.open(SCENARIOS[family])
    p = step_mod.prepared(k.resolved_pool)
    lay = k.resolved_pool.layout
    # the scenario really exercises its family's path
    assert {"sparse-mla-dcp": lay.dcp > 1 and bool(p.decode_sigs) and p.ctx_runs,
            "sliding-window": bool(p.windows), "pcp": lay.pcp > 1,
            "hybrid-recurrent": any(L.rec for L in p.layers),
            "moe-mla": k.resolved_pool.experts > 0,
            "sparse-mla-compressed-window": len(p.decode_sigs) > 1,
            "dense": k.resolved_pool.experts == 0}[family]
    df = random_trace(BATCHES_PER_SCENARIO, seed=len(family))
    got = bulk.price(k, df)
    want = scalar_prices(k.resolved_pool, df)
    assert got.select(want.columns).equals(want)
    # and k.step_time itself (the public scalar path) on a sample
    for (b,), grp in df.group_by("batch_id", maintain_order=True):
        if b % 50 != 7:
            continue
        batch = Batch(list(zip(grp["scheduled"].to_list(), grp["computed"].to_list(),
                               strict=True)),
                      decode_threshold=int(grp["decode_threshold"][0]),
                      sm_budget=int(grp["sm_budget"][0]))
        est = k.step_time(batch)
        row = got.row(by_predicate=pl.col("batch_id") == b, named=True)
        assert (row["overlap_ns"], row["no_overlap_ns"], row["bottleneck"]) == (
            est.overlap, est.no_overlap, est.bottleneck.value)
        assert {c: row[c] for c in RES_COLS} == {
            f"{x.value}_ns": (est.per_resource or {}).get(x, 0) for x in Resource}


def test_synthetic_trace_prices_like_scalar() -> None:
    r = pool(**VARIANTS["pcp2-dcp4"])
    df = pl.from_arrow(synth(400, seed=3, requests_per_batch=16))
    assert isinstance(df, pl.DataFrame)
    assert_bulk_equals_scalar(r, df)


def test_price_arguments_are_the_defaults_for_missing_per_batch_columns() -> None:
    r = pool()
    df = random_trace(200, seed=9, per_batch_cols=False)
    assert_bulk_equals_scalar(r, df, decode_threshold=3, sm_budget=66)


def test_extreme_values_stay_exact() -> None:
    # (not on a DCP+MLA pool: its context gathers loop once per 4096-token chunk)
    r = pool(**VARIANTS["pcp2"])
    big = 2**40
    df = pl.DataFrame({"batch_id": [1, 1, 2, 3, 3, 4],
                       "scheduled": [big, 1, 2**31, 0, 0, 1],
                       "computed": [big, 2**50, 0, 0, 5, 0],
                       "prompt_len": [0] * 6})
    assert_bulk_equals_scalar(r, df)


def test_empty_trace() -> None:
    df = pl.DataFrame({"batch_id": [], "scheduled": [], "computed": [], "prompt_len": []},
                      schema={c: pl.Int64 for c in ("batch_id", "scheduled", "computed",
                                                    "prompt_len")})
    res = bulk.price_result(pool(), df)
    assert res.priced.height == 0 and res.counts.rows_in == 0
    assert res.priced.columns == [*bulk.PRICED_SCHEMA.names, "scenario", "pool"]


# -- bad rows -------------------------------------------------------------------------------

def _bad_trace() -> pa.Table:
    # batch 1: fine; 2: negative; 3: non-integer; 4: null; 5: per-row overflow;
    # 6: per-batch sum overflow; 7: conflicting decode_threshold; 8: fine; null batch id
    big = float(2**62)
    return pa.table({
        "batch_id": pa.array([1, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 7, 8, None], pa.int64()),
        "scheduled": pa.array([1, 300, -1, 1, 2.5, 1, None, big, big, big, 1, 1, 1, 1],
                              pa.float64()),
        "computed": pa.array([10, 0, 0, 5, 0, 3, 0, big, 0, 0, 9, 9, 7, 0], pa.float64()),
        "prompt_len": pa.array([10] * 14, pa.int64()),
        "decode_threshold": pa.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1], pa.int64()),
    })


def test_every_bad_row_class_is_set_aside_with_its_reason() -> None:
    res = bulk.price_result(pool(), _bad_trace())
    assert res.priced["batch_id"].to_list() == [1, 8]
    c = res.counts
    assert (c.rows_in, c.rows_priced, c.rows_rejected) == (14, 3, 11)
    rj = res.rejects
    assert rj.height == 11 and sorted(rj["row"].to_list()) == list(range(2, 12)) + [13]
    by_row = {row["row"]: row for row in rj.iter_rows(named=True)}
    assert by_row[2]["reason"] == "negative" and by_row[2]["column"] == "scheduled"
    assert by_row[3]["reason"] == "batch_rejected" and "row 2" in by_row[3]["detail"]
    assert by_row[4]["reason"] == "non_integer"
    assert by_row[6]["reason"] == "null" and by_row[5]["reason"] == "batch_rejected"
    assert by_row[7]["reason"] == "overflow" and by_row[7]["batch_id"] == 5
    assert {by_row[8]["reason"], by_row[9]["reason"]} == {"overflow"}
    assert {by_row[10]["reason"], by_row[11]["reason"]} == {"conflicting_batch_value"}
    assert by_row[10]["column"] == "decode_threshold"
    assert by_row[13]["reason"] == "null" and by_row[13]["batch_id"] is None
    assert "scheduled=-1" in by_row[2]["values"]


def test_strict_raises_on_the_first_bad_row() -> None:
    with pytest.raises(RejectedRowError, match="row 2 .*negative"):
        bulk.price_result(pool(), _bad_trace(), on_reject="raise")


def test_csv_with_garbage_values(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("batch_id,scheduled,computed,prompt_len\n"
                 "1,1,5,5\n1,abc,0,1\n2,1,99999999999999999999,1\n3,,0,1\n4,3.0,0,3\n"
                 "5,-2,0,0\n6,2,1.5,1\n")
    res = bulk.price_result(pool(), p)
    reasons = dict(zip(res.rejects["row"].to_list(), res.rejects["reason"].to_list(),
                       strict=True))
    assert reasons == {0: "batch_rejected", 1: "non_integer", 2: "overflow", 3: "null",
                       5: "negative", 6: "non_integer"}
    assert res.priced["batch_id"].to_list() == [4]  # 3.0 is an integer
    res.counts.check()


def test_uint64_overflow_and_missing_column() -> None:
    t = pa.table({"batch_id": pa.array([1, 2], pa.uint64()),
                  "scheduled": pa.array([1, 2**63 + 5], pa.uint64()),
                  "computed": pa.array([0, 0], pa.uint64()),
                  "prompt_len": pa.array([1, 1], pa.uint64())})
    res = bulk.price_result(pool(), t)
    assert res.rejects["reason"].to_list() == ["overflow"] and res.priced.height == 1
    from kernel.io.trace import TraceError

    with pytest.raises(TraceError, match="missing column 'computed'"):
        bulk.price(pool(), t.drop_columns(["computed"]))
    with pytest.raises(TraceError, match="missing column 'n_sched'"):
        bulk.price(pool(), t, columns={"scheduled": "n_sched"})


def test_configurable_column_names() -> None:
    df = random_trace(50, seed=1, per_batch_cols=False)
    renamed = df.rename({"batch_id": "step", "scheduled": "n_new", "computed": "n_done"})
    got = bulk.price(pool(), renamed, columns={"batch_id": "step", "scheduled": "n_new",
                                              "computed": "n_done"})
    assert got.equals(bulk.price(pool(), df))


def test_per_batch_table_and_unknown_ids() -> None:
    r = pool()
    df = random_trace(60, seed=4, per_batch_cols=False)
    ids = df["batch_id"].unique(maintain_order=True).to_list()
    table = pl.DataFrame({"batch_id": ids[:30] + [10**9, ids[40], ids[40]],
                          "decode_threshold": [4] * 30 + [1, 1, 2],
                          "sm_budget": [66] * 30 + [0, 0, 0]})
    res = bulk.price_result(r, df, batches=table)
    rj = res.rejects
    unknown = rj.filter(pl.col("reason") == "unknown_batch_id")
    assert unknown["batch_id"].to_list() == [10**9] and unknown["source"][0] == "batches"
    dup = rj.filter(pl.col("reason") == "duplicate_batch_id")
    assert dup.height == 2
    assert res.counts.batch_table_rows_rejected == 3
    banned = rj.filter(pl.col("source") == "trace")
    assert set(banned["batch_id"].to_list()) == {ids[40]}
    assert res.counts.rows_in == res.counts.rows_priced + res.counts.rows_rejected
    # the priced batches use the table's values where it has them, the defaults elsewhere
    inline = df.join(table.head(30), on="batch_id", how="left").with_columns(
        pl.col("decode_threshold").fill_null(1), pl.col("sm_budget").fill_null(0)).filter(
        pl.col("batch_id") != ids[40])
    want = scalar_prices(r, inline)
    assert res.priced.select(want.columns).equals(want)


# -- streaming ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "csv", "arrow"])
def test_streaming_with_tiny_chunks_equals_in_memory(tmp_path: Path, fmt: str) -> None:
    r = pool(**VARIANTS["pcp2-dcp4"])
    df = random_trace(400, seed=12)
    src = tmp_path / f"t.{fmt}"
    if fmt == "parquet":
        df.write_parquet(src, row_group_size=37)
    elif fmt == "csv":
        df.write_csv(src)
    else:
        df.write_ipc(src)
    whole = bulk.price(r, df)
    dst = tmp_path / "o.parquet"
    counts = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=7),
                             progress=False)  # batches span chunks
    assert counts.mode in ("grouped", "sorted") and counts.batches_priced == whole.height
    assert pl.read_parquet(dst).equals(whole)


def test_a_batch_longer_than_many_chunks(tmp_path: Path) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = random_trace(30, seed=2)
    long = pl.DataFrame({"batch_id": [10**6] * 200, "scheduled": [1] * 150 + [700] * 50,
                         "computed": list(range(200)), "prompt_len": [5] * 200,
                         "decode_threshold": [1] * 200, "sm_budget": [0] * 200})
    df = pl.concat([df, long, df.with_columns(pl.col("batch_id") + 2 * 10**6)])
    dst = tmp_path / "o.parquet"
    bulk.price_file(r, df, dst, tuning=Tuning(chunk_rows=16), progress=False)
    assert pl.read_parquet(dst).equals(bulk.price(r, df))
    assert_bulk_equals_scalar(r, df)


def test_non_contiguous_ids_are_sorted_through_duckdb(tmp_path: Path) -> None:
    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(300, seed=8)
    # scatter the rows of every batch across the file, each batch keeping its request order
    key = np.random.default_rng(0).random(df.height)
    trace = (df.with_columns(pl.Series("k", key))
             .with_columns(pl.col("k").sort().over("batch_id")).sort("k").drop("k"))
    assert trace["batch_id"].n_unique() < trace["batch_id"].rle().len()
    whole = bulk.price(r, trace)
    src = tmp_path / "t.parquet"
    trace.write_parquet(src)
    dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
    counts = bulk.price_file(r, src, dst, rejects=rej, tuning=Tuning(chunk_rows=50), progress=False)
    assert counts.mode == "sorted"
    got = pl.read_parquet(dst)
    assert got.sort("batch_id").equals(whole.sort("batch_id"))
    assert_bulk_equals_scalar(r, trace)
    assert pl.read_parquet(rej).height == 0
    assert not list(tmp_path.glob(".blis-sort-*"))  # the sort's spill directory is gone


def test_streaming_rejects_and_identity(tmp_path: Path) -> None:
    src = tmp_path / "bad.parquet"
    pq.write_table(_bad_trace(), src)
    dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
    counts = bulk.price_file(pool(), src, dst, rejects=rej, tuning=Tuning(chunk_rows=3),
                             progress=False)
    mem = bulk.price_result(pool(), _bad_trace())
    assert (counts.rows_in, counts.rows_priced, counts.rows_rejected) == (14, 3, 11)
    assert pl.read_parquet(dst).equals(mem.priced)
    # (``values`` shows the columns read: parquet statistics spare reading prompt_len)
    assert pl.read_parquet(rej).sort("row").drop("values").equals(
        mem.rejects.sort("row").drop("values"))
    with pytest.raises(RejectedRowError):
        bulk.price_file(pool(), src, tmp_path / "s.parquet", on_reject="raise", progress=False)
    assert not (tmp_path / "s.parquet").exists()


def test_streaming_equals_in_memory_for_any_chunking(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    r = pool(**VARIANTS["dcp4-ctxgather"])

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(n=st.integers(1, 40), seed=st.integers(0, 10**6), chunk=st.integers(1, 25),
           scatter=st.booleans(), bad=st.booleans())
    def check(n: int, seed: int, chunk: int, scatter: bool, bad: bool) -> None:
        df = random_trace(n, seed)
        if bad:  # one negative count somewhere
            i = seed % df.height
            df = df.with_columns(pl.when(pl.int_range(pl.len()) == i).then(-1)
                                 .otherwise(pl.col("computed")).alias("computed"))
        if scatter:
            key = np.random.default_rng(seed).random(df.height)
            df = (df.with_columns(pl.Series("k", key))
                  .with_columns(pl.col("k").sort().over("batch_id")).sort("k").drop("k"))
        mem = bulk.price_result(r, df)
        dst, rej = tmp_path / "o.parquet", tmp_path / "r.parquet"
        counts = bulk.price_file(r, df, dst, rejects=rej, tuning=Tuning(chunk_rows=chunk),
                                 progress=False)
        assert (counts.rows_in, counts.rows_priced, counts.rows_rejected) == (
            mem.counts.rows_in, mem.counts.rows_priced, mem.counts.rows_rejected)
        assert pl.read_parquet(dst).sort("batch_id").equals(mem.priced.sort("batch_id"))
        assert pl.read_parquet(rej).sort("row").equals(mem.rejects.sort("row"))

    check()


def test_every_reject_table_comes_from_the_one_constructor() -> None:
    from kernel.io.trace import REJECT_SCHEMA, RejectedRowError, record_rejects, reject_table

    t = reject_table(np.array([4, 9]), np.array([1, 0]), "null", ["scheduled", "computed"],
                     "d", ["a", "b"], source="batches", batch_id_null=np.array([False, True]))
    assert t.schema == REJECT_SCHEMA
    assert t.to_pylist() == [
        {"row": 4, "batch_id": 1, "reason": "null", "column": "scheduled", "detail": "d",
         "source": "batches", "values": "a"},
        {"row": 9, "batch_id": None, "reason": "null", "column": "computed", "detail": "d",
         "source": "batches", "values": "b"}]
    got: list[pa.Table] = []
    record_rejects(t, got, strict=False)
    assert got == [t]
    with pytest.raises(RejectedRowError, match="row 4 .batch 1. rejected: null: d"):
        record_rejects(t, got, strict=True)
    # no module builds a trace rejects table by hand any more (the replay's request rejects
    # are another table, with a schema and one constructor of their own: kernel/replay/requests)
    root = Path(__file__).resolve().parents[1] / "kernel"
    by_hand = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if "schema=REJECT_SCHEMA" in p.read_text() or
               "RejectedRowError(tbl" in p.read_text()]
    assert sorted(by_hand) == ["io/trace.py", "replay/requests.py"]
    assert "REJECT_SCHEMA = pa.schema" in (root / "replay" / "requests.py").read_text()
