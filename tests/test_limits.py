"""Deployment limits: impossible steps are flagged (never refused, never re-priced), and the
scalar check and the array check flag the same limits for the same batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.bulk.groups import groups_from_starts
from kernel.cli import cli
from kernel.model import limits
from kernel.model.types import MAX_DURATION_NS, Batch, Request

S = "llama-3.1-8b-h100-tp1"  # max_num_seqs 256, max_num_batched_tokens 8192, max_model_len 32768


@pytest.fixture(scope="module")
def k() -> kernel.Kernel:
    return kernel.open(S)


def names(k: kernel.Kernel, batch: Batch) -> list[str]:
    return [b.limit for b in k.check(batch)]


def test_the_issue_cases_are_flagged_and_still_priced(k: kernel.Kernel) -> None:
    lim = k.limits
    assert (lim.max_num_seqs, lim.max_num_batched_tokens, lim.max_model_len) == (256, 8192,
                                                                                32768)
    many = Batch([Request(1, 100)] * 100_000)
    assert names(k, many)[0] == "max_num_seqs"
    assert str(k.check(many)[0]) == "max_num_seqs 256 < 100,000 requests"
    assert names(k, Batch([Request(100_000, 0)])) == ["max_num_batched_tokens",
                                                       "max_model_len"]
    assert "max_model_len" in names(k, Batch([Request(1, 10_000_000)]))
    huge = Batch([Request(1, 10**20)])
    assert k.step_time(huge).no_overlap == MAX_DURATION_NS  # priced as the reference does
    assert names(k, huge) == ["max_model_len", "kv_capacity", "duration"]
    ok = Batch([Request(1, 4095)] * 32)
    assert k.check(ok) == [] and k.step_time(ok) == k.step_time(ok)


def test_each_limit_is_exact_at_its_boundary(k: kernel.Kernel) -> None:
    lim = k.limits
    assert "max_num_seqs" not in names(k, Batch([Request(1, 1)] * lim.max_num_seqs))
    assert "max_num_seqs" in names(k, Batch([Request(1, 1)] * (lim.max_num_seqs + 1)))
    at = lim.max_num_batched_tokens
    assert "max_num_batched_tokens" not in names(k, Batch([Request(at, 0)]))
    assert "max_num_batched_tokens" in names(k, Batch([Request(at + 1, 0)]))
    assert "max_model_len" not in names(k, Batch([Request(1, lim.max_model_len - 1)]))
    assert "max_model_len" in names(k, Batch([Request(1, lim.max_model_len)]))
    per = lim.block_tokens * (lim.kv_blocks // 4)  # four requests fill the cache exactly
    full = Batch([Request(1, per - 1)] * 4)
    assert "kv_capacity" not in names(k, full)
    assert "kv_capacity" in names(k, Batch([*full.requests, Request(1, 0)]))


def _rows(batches: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = [len(b) for b in batches]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    s = np.array([q[0] for b in batches for q in b], np.int64)
    c = np.array([q[1] for b in batches for q in b], np.int64)
    return starts, s, c


LIM = limits.Limits(max_num_seqs=6, max_num_batched_tokens=40, max_model_len=100, kv_blocks=20,
                    block_tokens=16)
request = st.tuples(st.integers(0, 50), st.integers(0, 120))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(request, min_size=1, max_size=9), min_size=1, max_size=12),
       st.lists(st.sampled_from([5, MAX_DURATION_NS]), min_size=12, max_size=12))
def test_scalar_and_array_checks_agree(batches: list[list[tuple[int, int]]],
                                       durations: list[int]) -> None:
    starts, s, c = _rows(batches)
    ns = np.array(durations[:len(batches)], np.int64)
    # the per-batch totals as bulk pricing takes them (kernel.bulk.groups)
    g = groups_from_starts(np.repeat(np.arange(len(batches)), np.diff([*starts, s.size])),
                           starts)
    ctx = s + c
    masks = limits.check_batches(LIM, g.counts, g.sum(s), g.max(ctx),
                                 g.sum(limits.blocks_held(ctx, LIM.block_tokens)), ns)
    column = limits.label_array(masks).to_pylist()
    for b, reqs, dur, label in zip(range(len(batches)), batches, ns.tolist(), column,
                                   strict=True):
        scalar = [x.limit for x in limits.check(LIM, Batch([Request(*q) for q in reqs]), dur)]
        assert limits.names(int(masks[b])) == scalar
        assert label == ",".join(scalar)


def test_step_warns_with_the_limit_and_both_values() -> None:
    result = CliRunner().invoke(cli, ["step", "-s", S, "--batch", "5000x1@4095"])
    assert result.exit_code == 0, result.output
    assert "warning: over a deployment limit: max_num_seqs 256 < 5,000 requests" in \
        result.stderr
    fine = CliRunner().invoke(cli, ["step", "-s", S, "--batch", "32x1@4095"])
    assert fine.exit_code == 0 and "warning" not in fine.stderr


def _random_trace(seed: int, batches: int = 80) -> tuple[pa.Table, list[list[tuple[int, int]]]]:
    """Batches that break each limit now and then: many requests, long prefills, long
    contexts, full caches, and a context so long the step time saturates."""
    rng = np.random.default_rng(seed)
    per_batch = []
    for _ in range(batches):
        kind = int(rng.integers(0, 6))
        n = int(rng.integers(1, 40)) if kind != 0 else int(rng.integers(250, 300))
        reqs = [(int(rng.integers(1, 3)), int(rng.integers(0, 4096))) for _ in range(n)]
        if kind == 1:
            reqs.append((int(rng.integers(7000, 9000)), 0))
        elif kind == 2:
            reqs.append((1, int(rng.integers(32000, 34000))))
        elif kind == 3:
            reqs += [(1, 30000)] * int(rng.integers(10, 20))
        elif kind == 4 and rng.random() < 0.3:
            reqs.append((1, 2**61))
        per_batch.append(reqs)
    ids = np.repeat(np.arange(batches, dtype=np.int64), [len(b) for b in per_batch])
    s = np.array([q[0] for b in per_batch for q in b], np.int64)
    c = np.array([q[1] for b in per_batch for q in b], np.int64)
    table = pa.table({"batch_id": ids, "scheduled": s, "computed": c,
                      "prompt_len": np.zeros(s.size, np.int64)})
    return table, per_batch


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bulk_flags_equal_the_scalar_flags(k: kernel.Kernel, seed: int) -> None:
    from kernel import bulk

    table, per_batch = _random_trace(seed)
    priced = bulk.price(k, table)
    assert priced.height == len(per_batch)
    seen = set()
    for row, reqs in zip(priced.iter_rows(named=True), per_batch, strict=True):
        batch = Batch([Request(*q) for q in reqs])
        scalar = [b.limit for b in k.check(batch)]
        assert row["limits"] == ",".join(scalar), (row["batch_id"], scalar)
        assert row["no_overlap_ns"] == k.step_time(batch).no_overlap  # flagged, still priced
        seen.update(scalar)
    assert {"max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_capacity"} <= seen


def test_reject_over_limit_sets_the_batches_aside(k: kernel.Kernel) -> None:
    from kernel import bulk

    table, per_batch = _random_trace(3)
    flags = [[b.limit for b in k.check(Batch([Request(*q) for q in reqs]))]
             for reqs in per_batch]
    kept = bulk.price_result(k, table, reject_over_limit=True, on_reject="ignore")
    ok = [i for i, f in enumerate(flags) if not f]
    assert kept.priced["batch_id"].to_list() == ok
    assert set(kept.priced["limits"].to_list()) == {""}
    rej = kept.rejects
    assert set(rej["reason"].to_list()) == {"over_limit"}
    assert sorted(set(rej["batch_id"].to_list())) == [i for i, f in enumerate(flags) if f]
    assert kept.counts.rows_in == kept.counts.rows_priced + kept.counts.rows_rejected
    assert rej.height == sum(len(per_batch[i]) for i, f in enumerate(flags) if f)
    first = rej.filter(pl.col("batch_id") == rej["batch_id"][0]).row(0, named=True)
    b = int(first["batch_id"])
    assert first["column"] == ",".join(flags[b])
    assert first["detail"] == "; ".join(
        str(x) for x in k.check(Batch([Request(*q) for q in per_batch[b]])))


def test_price_command_counts_and_rejects_over_limit(tmp_path: Path) -> None:
    table, per_batch = _random_trace(4, batches=30)
    pq.write_table(table, tmp_path / "t.parquet")
    k = kernel.open(S)
    n_over = sum(1 for reqs in per_batch if k.check(Batch([Request(*q) for q in reqs])))
    assert n_over
    flagged = CliRunner().invoke(cli, ["price", str(tmp_path / "t.parquet"), "-s", S, "-o",
                                       str(tmp_path / "p.parquet"), "--no-progress"])
    assert flagged.exit_code == 0, flagged.output
    assert f"warning: {n_over:,} priced batches are over a deployment limit" in flagged.stderr
    report = CliRunner().invoke(cli, ["report", str(tmp_path / "p.parquet"), "-o",
                                      str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    assert f"limits          {n_over:,} batches over a deployment limit" in report.output
    assert "over a deployment limit" in (tmp_path / "r.html").read_text()
    rejected = CliRunner().invoke(cli, ["price", str(tmp_path / "t.parquet"), "-s", S, "-o",
                                        str(tmp_path / "q.parquet"), "--reject-over-limit",
                                        "--rejects", str(tmp_path / "q.rejects.parquet"),
                                        "--no-progress"])
    assert rejected.exit_code == 0, rejected.output
    assert pl.read_parquet(tmp_path / "q.parquet").height == len(per_batch) - n_over
    assert set(pl.read_parquet(tmp_path / "q.rejects.parquet")["reason"]) == {"over_limit"}
