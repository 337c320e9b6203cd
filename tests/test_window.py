"""Mode ``window``: traces whose batch ids advance through the file (a request-major log),
beyond the memory budget, grouped in memory, each piece priced as soon as the parquet
statistics show no later row group can reach it (``kernel/bulk/window.py``, decision SP1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernel import bulk
from kernel.bulk import spill, window
from kernel.bulk.options import Tuning
from kernel.bulk.partition import plan_from_ranges
from kernel.io.trace import TraceError

from .bulk_pools import VARIANTS, pool
from .test_bulk import random_trace
from .test_bulk_io import TWICE, _reasons, _tagged, _with_bad_rows


def advancing(df: pl.DataFrame, width: int, seed: int) -> pl.DataFrame:
    """The rows in an order that advances through the ids, as a request-major log's do:
    batches in windows of ``width`` ids, the rows of a window shuffled, each batch keeping
    its requests in order."""
    rng = np.random.default_rng(seed)
    ix = df.with_row_index("i")
    key = (pl.col("batch_id") // width).cast(pl.Float64) + pl.Series("r", rng.random(df.height))
    return (ix.with_columns(key.alias("k")).with_columns(pl.col("k").sort().over("batch_id"))
            .sort("k").drop("k", "i"))


def _budget(df: pl.DataFrame) -> int:
    """Just under the validated rows' least size (8 bytes a row: beyond the budget), so the
    window may hold a quarter of the rows (16 bytes a row, in half the budget)."""
    return 8 * df.height - 1


@pytest.mark.parametrize("seed", [1, 2])
def test_an_advancing_trace_beyond_the_budget_is_priced_in_a_window_bit_for_bit(
        tmp_path: Path, seed: int) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = _with_bad_rows(random_trace(600, seed), seed)
    want = bulk.price_result(r, df, on_reject="ignore")
    assert want.rejects.height > 6
    for width, group in ((3, 50), (30, 97), (50, 151)):
        src = tmp_path / f"w{width}.parquet"
        advancing(df, width, seed).write_parquet(src, row_group_size=group)
        for chunk in (32, 64, 10_000):
            dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
            c = bulk.price_file(r, src, dst, rejects=rej,
                                tuning=Tuning(chunk_rows=chunk, memory_budget=_budget(df), order="sort"),
                                progress=False)
            assert c.mode == "window", (width, group, chunk)
            assert c.rows_in == df.height == c.rows_priced + c.rows_rejected
            assert c.rows_rejected == want.counts.rows_rejected
            assert pl.read_parquet(dst).equals(want.priced), (width, chunk)  # bit for bit
            assert _reasons(pl.read_parquet(rej)) == _reasons(want.rejects)
    assert not list(tmp_path.glob(".blis-*"))


def test_kept_and_produced_columns_follow_the_rows_through_the_window(tmp_path: Path) -> None:
    r = pool(**VARIANTS["pcp2-dcp4"])
    df = _tagged(400, 6)
    want = bulk.price(r, df, producers=[TWICE], keep=["replica", "tag"])
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    advancing(df, 20, 6).write_parquet(src, row_group_size=60)
    c = bulk.price_file(r, src, dst,
                        tuning=Tuning(chunk_rows=40, memory_budget=_budget(df), order="sort"),
                        progress=False, producers=[TWICE],
                        keep=["replica", "tag"])
    assert c.mode == "window"
    assert pl.read_parquet(dst).equals(want)


def test_a_shuffled_trace_or_a_too_small_budget_is_spilled_instead(tmp_path: Path) -> None:
    """The window holds rows until no later row group can reach their pieces: when that is
    most of the trace (rows anywhere) or more than half the budget, the trace is spilled."""
    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(300, 4, per_batch_cols=False)
    want = bulk.price(r, df)
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    df.sample(fraction=1.0, shuffle=True, seed=4).write_parquet(src, row_group_size=50)
    c = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=_budget(df)),
                        progress=False)
    assert c.mode == "spill"
    assert pl.read_parquet(dst).equals(want)
    advancing(df, 10, 4).write_parquet(src, row_group_size=50)
    c = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=64), progress=False)
    assert c.mode == "spill"
    assert pl.read_parquet(dst).equals(want)


def test_pieces_declared_complete_get_no_later_row_and_the_held_rows_are_bounded() -> None:
    """Against a brute force over random row groups: no row of a later group falls in a
    piece complete after group g, and no group is held past the point the bound says."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None)
    @given(groups=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 300),
                                     st.integers(1, 400)), min_size=1, max_size=30),
           piece_rows=st.integers(1, 2000))
    def check(groups: list[tuple[int, int, int]], piece_rows: int) -> None:
        ranges = [(a, a + w, n) for a, w, n in groups]
        part = plan_from_ranges(ranges, piece_rows)
        assert part is not None
        done = window.complete_pieces(ranges, part)
        assert done[-1] == part.n and bool(np.all(np.diff(done) >= 0))
        firsts = part.first_ids()
        for g in range(len(ranges) - 1):
            if done[g]:  # every later row lies at or past the first open piece's start
                assert min(r[0] for r in ranges[g + 1:]) >= firsts[done[g] - 1] + \
                    part.piece_span(int(done[g]) - 1)
        # brute force: group j held from its read until the group after which its last
        # piece is complete
        held = []
        for g in range(len(ranges)):
            rows = 0
            for j in range(g + 1):
                last = int(np.searchsorted(firsts, ranges[j][1], side="right")) - 1
                if not done[g] > last:
                    rows += ranges[j][2]
            held.append(rows)
        # (a group is still in memory while the group that completes it is being read)
        assert window.held_rows(ranges, part) >= max(held)
        assert window.held_rows(ranges, part) <= sum(r[2] for r in ranges)

    check()


def test_statistics_that_lie_before_any_piece_is_priced_send_the_rows_to_the_spill(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from kernel.io import sources

    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(300, 5, per_batch_cols=False)
    want = bulk.price(r, df)
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    advancing(df, 10, 5).write_parquet(src, row_group_size=50)
    real = sources._id_ranges

    def first_group_min_overstated(frags: object, col: str) -> list[tuple[int, int, int]]:
        rr = real(frags, col)  # type: ignore[arg-type]
        assert rr is not None
        a, b, n = rr[0]
        return [(b, b, n), *rr[1:]]  # (its smallest ids then outside the plan)

    monkeypatch.setattr(sources, "_id_ranges", first_group_min_overstated)
    with caplog.at_level(logging.INFO, logger="kernel"):
        c = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=_budget(df)),
                            progress=False)
    assert any("moving window" in m.getMessage() for m in caplog.records)  # (chosen first)
    assert c.mode in ("spill", "external") and c.rows_in == df.height
    assert pl.read_parquet(dst).equals(want)
    assert not list(tmp_path.glob(".blis-*"))


def test_statistics_that_lie_after_pieces_were_priced_stop_the_run_with_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.io import sources

    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(300, 6, per_batch_cols=False)
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    order = advancing(df, 10, 6)
    # the smallest batch moved to the last row group, its statistics not saying so
    lowest = order["batch_id"].min()
    order = pl.concat([order.filter(pl.col("batch_id") != lowest),
                       order.filter(pl.col("batch_id") == lowest)])
    order.write_parquet(src, row_group_size=50)
    real = sources._id_ranges

    def last_group_hides_its_min(frags: object, col: str) -> list[tuple[int, int, int]]:
        rr = real(frags, col)  # type: ignore[arg-type]
        assert rr is not None
        a, b, n = rr[-1]
        return [*rr[:-1], (rr[-2][0], b, n)]

    monkeypatch.setattr(sources, "_id_ranges", last_group_hides_its_min)
    with pytest.raises(TraceError, match=r"row group \d+ holds batch ids outside its parquet "
                                         r"statistics .*order='external'"):
        bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=_budget(df)),
                        progress=False)
    assert not dst.exists() and not list(tmp_path.glob(".blis-*"))


def test_the_window_is_chosen_only_where_it_fits_half_the_budget() -> None:
    ranges = [(i * 100, i * 100 + 150, 1000) for i in range(40)]  # overlapping neighbours
    budget = 200_000
    part = spill.spill_plan(ranges, budget)
    assert part is not None
    need = window.held_rows(ranges, part) * window.ROW_BYTES
    assert need < sum(r[2] for r in ranges) * window.ROW_BYTES  # something is let go
    assert window.fits_window(ranges, part, 2 * need)
    assert not window.fits_window(ranges, part, 2 * need - 2)
    assert not window.fits_window(None, part, 10**12)


def test_window_property_any_chunking_prices_like_the_sorted_trace(tmp_path: Path) -> None:
    """Random advancing traces (with and without per-batch columns and bad rows), row-group
    and chunk sizes: whichever of window and spill is taken, the prices, rejects and counts
    are those of the sorted trace (the window taken in several examples)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    r = pool(**VARIANTS["window-pcp2"])
    modes: list[str] = []

    @settings(max_examples=15, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(n=st.integers(20, 200), seed=st.integers(0, 10**6), width=st.integers(1, 12),
           group=st.integers(5, 120), chunk=st.integers(3, 200), per_batch=st.booleans(),
           bad=st.booleans())
    def check(n: int, seed: int, width: int, group: int, chunk: int, per_batch: bool,
              bad: bool) -> None:
        df = random_trace(n, seed, per_batch_cols=per_batch)
        if bad:
            df = _with_bad_rows(df, seed)
        want = bulk.price_result(r, df, on_reject="ignore")
        src, dst, rej = tmp_path / "t.parquet", tmp_path / "o.parquet", tmp_path / "r.parquet"
        advancing(df, width, seed).write_parquet(src, row_group_size=group)
        c = bulk.price_file(r, src, dst, rejects=rej,
                            tuning=Tuning(chunk_rows=chunk, memory_budget=_budget(df), order="sort"),
                            progress=False)
        modes.append(c.mode)
        assert c.mode in ("window", "spill")
        assert c.rows_in == df.height == c.rows_priced + c.rows_rejected
        assert pl.read_parquet(dst).equals(want.priced)
        assert _reasons(pl.read_parquet(rej)) == _reasons(want.rejects)

    check()
    assert modes.count("window") >= 3, modes  # (the window is exercised, not only spill)
