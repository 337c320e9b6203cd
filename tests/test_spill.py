"""Mode ``spill``: traces in no known order beyond the memory budget, partitioned to disk by
batch-id range and grouped one spill group at a time (``kernel/bulk/spill.py``). A tiny
``memory_budget`` forces it (and many groups) on small traces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from kernel import bulk
from kernel.bulk import spill
from kernel.bulk.engine import Engine
from kernel.bulk.options import Tuning

from .bulk_pools import VARIANTS, pool
from .jit_modes import jit_mode  # noqa: F401  (a fixture)
from .test_bulk import random_trace
from .test_bulk_io import _orders, _reasons, _with_bad_rows

REPO = Path(__file__).resolve().parents[1]

# every test with the compiled scatter and gather and with the numpy/Arrow ones (SJ1)
pytestmark = pytest.mark.usefixtures("jit_mode")


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of spill groups of each spill run (recorded as the files are set up)."""
    seen: list[int] = []
    init = spill.SpillFiles.__init__

    def record(self: spill.SpillFiles, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        seen.append(self.n)

    monkeypatch.setattr(spill.SpillFiles, "__init__", record)
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_spill_prices_every_row_order_like_the_sorted_trace(tmp_path: Path, seed: int,
                                                            groups: list[int]) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = _with_bad_rows(random_trace(300, seed), seed)
    want = bulk.price_result(r, df, on_reject="ignore")
    assert want.rejects.height > 6
    modes: set[tuple[str, str]] = set()
    for name, other in {"sorted": df, **_orders(df, seed)}.items():
        src = tmp_path / f"{name}.parquet"
        other.write_parquet(src, row_group_size=97)
        # one piece a group ... a few groups, and (14 bytes a row: under the rows' size,
        # over its lower bound) spilled from half-way, the rows held so far first
        for budget in (1, 3_000, 10_000, 14 * df.height):
            dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
            # (order="sort": a sorted source too is grouped rather than streamed whole)
            c = bulk.price_file(r, src, dst, rejects=rej, progress=False,
                                tuning=Tuning(chunk_rows=64, memory_budget=budget,
                                              order="sort"))
            # (ids that advance through the file fit a window of pieces when the budget
            # allows: mode window, SP1)
            assert c.mode == "spill" or (c.mode == "window" and name in ("sorted", "late")
                                         and budget > 1), (name, budget)
            modes.add((name, c.mode))
            assert c.rows_in == df.height == c.rows_priced + c.rows_rejected
            assert (c.rows_priced, c.rows_rejected) == (want.counts.rows_priced,
                                                        want.counts.rows_rejected)
            assert pl.read_parquet(dst).equals(want.priced), (name, budget)  # bit for bit
            assert _reasons(pl.read_parquet(rej)) == _reasons(want.rejects), (name, budget)
    assert max(groups) > 10 and min(groups) >= 1
    assert {(n, "spill") for n in ("sorted", "reversed", "request-major", "shuffled",
                                   "late")} <= modes
    assert not list(tmp_path.glob(".blis-*"))


def test_spill_of_in_memory_tables_and_per_batch_columns_property() -> None:
    """Random traces (with and without per-batch columns and bad rows), any order, chunk
    size and budget: the spilled run prices exactly as the sorted trace in memory."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    r = pool(**VARIANTS["window-pcp2"])

    @settings(max_examples=12, deadline=None)
    @given(n=st.integers(1, 120), seed=st.integers(0, 10**6),
           order=st.sampled_from(["shuffled", "request-major", "reversed", "late"]),
           chunk=st.integers(3, 300), share=st.floats(0, 0.9),
           per_batch=st.booleans(), bad=st.booleans())
    def check(n: int, seed: int, order: str, chunk: int, share: float, per_batch: bool,
              bad: bool) -> None:
        df = random_trace(n, seed, per_batch_cols=per_batch)
        if bad and df.height >= 6:
            df = _with_bad_rows(df, seed)
        want = bulk.price_result(r, df, on_reject="ignore")
        budget = 1 + int(share * 8 * df.height)  # (under the rows' least size: spilled)
        got = bulk.price_result(r, _orders(df, seed)[order],
                                tuning=Tuning(chunk_rows=chunk, memory_budget=budget, order="sort"),
                                on_reject="ignore")
        assert got.counts.mode == "spill"
        assert got.priced.equals(want.priced)
        assert got.counts.rows_in == got.counts.rows_priced + got.counts.rows_rejected
        assert _reasons(got.rejects) == _reasons(want.rejects)

    check()


def test_spilled_row_numbers_go_as_steps_or_whole_and_price_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SW2: every slice written as row steps (the path taken), then every other slice with its
    row numbers whole (as when a step passes 16 bits), groups mixing both: the priced table is
    the sorted trace's, bit for bit, and the rejects, row numbers included, those of the same
    file grouped in memory."""
    r = pool(**VARIANTS["dcp4-ctxgather"])
    df = _with_bad_rows(random_trace(12_000, 3), 3)  # (rows past 65,535: int32 numbers)
    assert df.height > 2**16
    want = bulk.price_result(r, df, on_reject="ignore")
    src = tmp_path / "t.parquet"
    _orders(df, 3)["shuffled"].write_parquet(src, row_group_size=8_192)
    ref = tmp_path / "ref-rej.parquet"
    c = bulk.price_file(r, src, tmp_path / "ref.parquet", rejects=ref, progress=False)
    assert c.mode == "sorted"
    want_rej = pl.read_parquet(ref).sort("row")
    assert want_rej.height > 20 and want_rej["row"].max() > 2**16
    encode = spill.row_steps
    for refuse_every in (0, 2):
        calls: list[bool] = []

        def counted(row: np.ndarray, seg: np.ndarray, calls: list[bool] = calls,
                    refuse_every: int = refuse_every) -> Any:
            got = encode(row, seg)
            if refuse_every and len(calls) % refuse_every:
                got = None
            calls.append(got is not None)
            return got

        monkeypatch.setattr(spill, "row_steps", counted)
        dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
        c = bulk.price_file(r, src, dst, rejects=rej, progress=False,
                            tuning=Tuning(chunk_rows=8_192, memory_budget=200_000))
        assert c.mode == "spill" and len(calls) > 20
        assert all(calls) if not refuse_every else (any(calls) and not all(calls))
        assert pl.read_parquet(dst).equals(want.priced)
        assert pl.read_parquet(rej).sort("row").equals(want_rej)


def test_pieces_are_cut_to_65536_ids_where_batches_have_few_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SW4: a trace whose planned pieces span more than 65,536 ids (at 4 rows a batch, 1 Mi-row
    pieces do; here ~0.23 rows an id and pieces of 18,750 rows) is planned again into pieces
    of at most ``LOCAL_IDS`` ids, so that its ids spill as 2 bytes; prices and rejects as the
    sorted trace's, bit for bit. A plan that cannot be made local, or only with pieces under
    ``LOCAL_MIN_ROWS`` rows, stays as it was."""
    monkeypatch.setattr(spill, "LOCAL_MIN_ROWS", 1_000)  # (the trace is small)
    r = pool(**VARIANTS["window-pcp2"])
    df = _with_bad_rows(random_trace(17_000, 4), 4).with_columns(
        pl.col("batch_id") * 10)  # (ids 3 apart: now 30 apart)
    want = bulk.price_result(r, df, on_reject="ignore")
    src = tmp_path / "t.parquet"
    _orders(df, 4)["shuffled"].write_parquet(src, row_group_size=8_192)
    seen: list[tuple[bool, bool]] = []
    plan = spill.local_plan

    def spied(ranges: Any, part: Any) -> Any:
        got = plan(ranges, part)
        seen.append((part.local, got.local))
        return got

    from kernel.bulk import stream
    monkeypatch.setattr(stream, "local_plan", spied)
    dst, rej = tmp_path / "o.parquet", tmp_path / "rej.parquet"
    c = bulk.price_file(r, src, dst, rejects=rej, progress=False,
                        tuning=Tuning(chunk_rows=8_192, memory_budget=1_200_000))
    assert c.mode == "spill" and seen == [(False, True)]
    assert pl.read_parquet(dst).equals(want.priced)
    assert _reasons(pl.read_parquet(rej)) == _reasons(want.rejects)
    # batches 70,000 ids apart: no piece of whole cells spans fewer than 65,536 ids
    wide = [(0, 70_000 * 20_000, 10**6)]
    part = spill.spill_plan(wide, 1 << 30)
    assert part is not None and not part.local and plan(wide, part) is part
    near = [(0, 4 * 10**6, 10**7)]  # (2.5 rows an id: pieces of 150,000 rows)
    part = spill.spill_plan(near, 1 << 30)
    assert part is not None and not part.local and plan(near, part).local
    monkeypatch.setattr(spill, "LOCAL_MIN_ROWS", 200_000)  # (too few rows a piece: kept)
    assert plan(near, part) is part


def test_spill_groups_are_bounded_and_cover_every_piece() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kernel.bulk.partition import plan_from_ranges

    @settings(max_examples=80, deadline=None)
    @given(rows=st.integers(1, 10**10), span=st.integers(1, 10**9),
           budget=st.integers(1, 10**11))
    def check(rows: int, span: int, budget: int) -> None:
        part = plan_from_ranges([(0, span - 1, rows)], spill.group_rows(budget))
        assert part is not None
        b = spill.group_bounds(part, rows, budget)
        assert b[0] == 0 and b[-1] == part.n and bool(np.all(np.diff(b) > 0))
        assert b.size - 1 <= spill.MAX_FILES
        per_piece = -(-rows // part.n)
        widest = int(np.diff(b).max())
        # a group holds about group_rows rows, unless one piece is more (a piece is at
        # least a cell) or the file limit makes groups wider
        assert (widest * per_piece <= max(spill.group_rows(budget), per_piece)
                or widest == -(-part.n // spill.MAX_FILES))

    check()


def test_statistics_that_do_not_cover_the_rows_go_to_duckdb(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk outside the plan (statistics that lie: they never should) sends the rows
    spilled so far, then the rest, to DuckDB's sort; prices unchanged, no file left."""
    from kernel.io import sources

    r = pool(**VARIANTS["window-pcp2"])
    df = random_trace(200, 5)
    want = bulk.price(r, df)
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    _orders(df, 5)["shuffled"].write_parquet(src, row_group_size=64)
    lo, hi = int(df["batch_id"].min()), int(df["batch_id"].max())
    monkeypatch.setattr(sources, "_id_ranges",
                        lambda frags, col: [(lo, (lo + hi) // 2, df.height)])
    c = bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=1), progress=False)
    assert c.mode == "external" and c.rows_in == df.height
    assert pl.read_parquet(dst).equals(want)
    assert not list(tmp_path.glob(".blis-*"))


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_while_spilled_groups_are_priced_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]) -> None:
    r = pool(**VARIANTS["window-pcp2"])
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    _orders(random_trace(300, 7), 7)["shuffled"].write_parquet(src, row_group_size=64)
    calls = []

    def failing(price: Any) -> Any:
        def fn(self: Engine, *a: Any) -> Any:
            calls.append(1)
            assert [p.name[:12] for p in tmp_path.iterdir() if p.name.startswith(".blis")] \
                == [".blis-spill-"]  # (the spill directory exists while groups are priced)
            if len(calls) == 5:
                raise error("stop")
            return price(self, *a)
        return fn

    # (a piece gathered grouped is priced by price_groups_task, else where it lies: SW5)
    for name in ("price_range_task", "price_groups_task"):
        monkeypatch.setattr(Engine, name, failing(getattr(Engine, name)))
    with pytest.raises(error, match="stop"):
        bulk.price_file(r, src, dst, tuning=Tuning(chunk_rows=50, memory_budget=3_000, workers=1),
                        progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def test_a_bad_row_under_strict_mid_spill_leaves_no_file(tmp_path: Path) -> None:
    from kernel.io.trace import RejectedRowError

    r = pool(**VARIANTS["window-pcp2"])
    df = _with_bad_rows(random_trace(300, 8), 8)
    src = tmp_path / "t.parquet"
    _orders(df, 8)["shuffled"].write_parquet(src, row_group_size=64)
    with pytest.raises(RejectedRowError):
        bulk.price_file(r, src, tmp_path / "o.parquet",
                        tuning=Tuning(chunk_rows=50, memory_budget=1), progress=False,
                        on_reject="raise")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


_SIGNALLED = """
import sys
from pipeline import safe_output
from kernel import bulk
from tests.bulk_pools import VARIANTS, pool
safe_output.install_signal_handlers()
bulk.price_file(pool(**VARIANTS["window-pcp2"]), sys.argv[1], sys.argv[2], progress=False,
                tuning=bulk.Tuning(chunk_rows=500, memory_budget=1, workers=1))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_spill_leaves_no_file(tmp_path: Path, sig: int) -> None:
    from .test_safe_output import _shuffled_trace, interrupt_when

    trace = tmp_path / "t.parquet"
    _shuffled_trace(trace, 200_000, 8)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _SIGNALLED, str(trace),
                             str(out_dir / "priced.parquet")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    err = interrupt_when(proc, lambda: any(p.name.startswith(".blis-spill-") and any(p.iterdir())
                                           for p in out_dir.iterdir()),  # spill files written
                         sig, "spilling", 120)
    assert proc.returncode == 128 + sig, err.decode()
    assert list(out_dir.iterdir()) == []
