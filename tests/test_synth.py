"""The synthetic continuous-batching trace generator, and the CLI around traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from kernel.io.synth import Lengths, synth, synth_batches, write_synth


def _frame(**kw) -> pl.DataFrame:
    df = pl.from_arrow(synth(**kw))
    assert isinstance(df, pl.DataFrame)
    return df


def test_shape_mix_and_determinism() -> None:
    stats: list = []
    parts = list(synth_batches(20_000, seed=7, stats=stats, window=4096))
    st = stats[0]
    df = pl.from_arrow(parts[0])
    assert isinstance(df, pl.DataFrame)
    assert st.rows == sum(p.num_rows for p in parts)
    assert 28 <= st.requests_per_batch <= 36
    assert 0.04 <= st.prefill_share <= 0.06
    assert st.over_budget_steps == 0
    a = _frame(batches=3000, seed=1)
    b = _frame(batches=3000, seed=1)
    c = _frame(batches=3000, seed=2)
    assert a.equals(b) and not a.equals(c)
    # steps in order, every step present
    assert a["batch_id"].is_sorted() and a["batch_id"].n_unique() == 3000


def test_requests_follow_continuous_batching() -> None:
    df = _frame(batches=4000, seed=3, request_ids=True, requests_per_batch=16,
                prompt="uniform:10:3000", output="uniform:2:60", chunk=512)
    assert df["scheduled"].cast(pl.Int64).max() == 512 and int(df["scheduled"].min()) >= 1  # type: ignore[arg-type]
    per = df.sort("request_id", "batch_id").group_by("request_id", maintain_order=True).agg(
        pl.col("batch_id").diff().drop_nulls().alias("gaps"),
        pl.col("computed").first().alias("c0"),
        (pl.col("computed") + pl.col("scheduled")).alias("ends"),
        pl.col("computed").alias("cs"),
        pl.col("prompt_len").first().alias("p"),
        pl.col("scheduled").alias("ss"),
        pl.col("batch_id").first().alias("first"))
    for row in per.iter_rows(named=True):
        assert all(g == 1 for g in row["gaps"])  # one row per step while in flight
        cs, ends, ss, p = row["cs"], row["ends"], row["ss"], row["p"]
        if row["first"] > 0:  # arrived inside the trace: starts at 0
            assert row["c0"] == 0
        assert cs[1:] == ends[:-1]  # each step continues where the last ended
        pre = [s for s, c in zip(ss, cs, strict=True) if c < p]
        assert all(s == 1 for s, c in zip(ss, cs, strict=True) if c >= p)  # decode: 1 token
        assert all(c + s <= p for s, c in zip(ss, cs, strict=True) if c < p)  # chunks fit
        del pre


def test_lengths_parse_and_sample() -> None:
    rng = np.random.default_rng(0)
    assert Lengths.parse("fixed:7").sample(rng, 5).tolist() == [7] * 5
    u = Lengths.parse("uniform:3:9").sample(rng, 1000)
    assert u.min() >= 3 and u.max() <= 9
    ln = Lengths.parse("lognormal:1000:0.5").sample(rng, 200_000)
    assert 950 < ln.mean() < 1050
    assert Lengths.parse("exponential:50").sample(rng, 10).min() >= 1
    for bad in ("normal:3", "fixed", "uniform:1", "lognormal:a:b", "fixed:-1"):
        with pytest.raises(ValueError):
            Lengths.parse(bad)
    with pytest.raises(ValueError):
        synth(10, prefill_share=1.5)


def test_write_formats(tmp_path: Path) -> None:
    for name in ("t.parquet", "t.csv", "t.arrow"):
        st = write_synth(tmp_path / name, 500, seed=4)
        assert st.rows > 0
    a = pl.read_parquet(tmp_path / "t.parquet")
    b = pl.read_csv(tmp_path / "t.csv", schema_overrides=dict(a.schema))
    c = pl.read_ipc(tmp_path / "t.arrow")
    assert a.equals(b) and a.equals(c)


def test_generation_streams_in_record_batches() -> None:
    # Speed is measured in benchmarks/synth.py; here only that a large trace arrives in pieces.
    parts = [rb.num_rows for rb in synth_batches(70_000, seed=0)]
    assert len(parts) > 1 and sum(parts) > 2_000_000


# -- CLI -----------------------------------------------------------------------------------

def test_cli_synth_price_rejects_and_db(tmp_path: Path) -> None:
    import duckdb

    from kernel.cli import cli

    runner = CliRunner()
    trace = tmp_path / "t.parquet"
    res = runner.invoke(cli, ["trace", "synth", "--batches", "300", "--mix", "0.05",
                              "-o", str(trace)])
    assert res.exit_code == 0, res.output
    assert "300 batches" in res.output
    out, db = tmp_path / "p.parquet", tmp_path / "p.duckdb"
    res = runner.invoke(cli, ["price", str(trace), "--scenario",
                              "deepseek-v3-h200-fp8-sglang-tp8", "-o", str(out), "--db",
                              str(db), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "rejected 0" in res.output
    assert not (tmp_path / "p.rejects.parquet").exists()
    priced = pl.read_parquet(out)
    assert priced.height == 300
    con = duckdb.connect(str(db))
    n = con.execute("SELECT count(*) FROM priced_steps").fetchone()
    assert n is not None and n[0] == 300
    prov = con.execute("SELECT count(*) FROM kernel_provenance WHERE scenario = "
                       "'deepseek-v3-h200-fp8-sglang-tp8'").fetchone()
    assert prov is not None and prov[0] > 0
    con.close()
    # re-pricing the same trace replaces its rows
    res = runner.invoke(cli, ["price", "-s", "deepseek-v3-h200-fp8-sglang-tp8", str(trace), "-o", str(out), "--db", str(db),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    con = duckdb.connect(str(db))
    n = con.execute("SELECT count(*) FROM priced_steps").fetchone()
    assert n is not None and n[0] == 300
    con.close()

    bad = tmp_path / "bad.csv"
    bad.write_text("batch_id,scheduled,computed,prompt_len\n1,1,5,5\n2,-1,0,1\n")
    res = runner.invoke(cli, ["price", "-s", "deepseek-v3-h200-fp8-sglang-tp8", str(bad), "-o", str(tmp_path / "b.parquet"),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "rejected 1" in res.output
    rj = pl.read_parquet(tmp_path / "b.rejects.parquet")
    assert rj["reason"].to_list() == ["negative"]
    res = runner.invoke(cli, ["price", "-s", "deepseek-v3-h200-fp8-sglang-tp8", str(bad), "-o", str(tmp_path / "c.parquet"),
                              "--strict", "--no-progress"])
    assert res.exit_code != 0 and "negative" in res.output
    assert not (tmp_path / "c.parquet").exists()
    res = runner.invoke(cli, ["price", "-s", "deepseek-v3-h200-fp8-sglang-tp8", str(bad), "-o", str(tmp_path / "d.parquet"),
                              "--column", "scheduled=nope", "--no-progress"])
    assert res.exit_code != 0 and "missing column 'nope'" in res.output
