"""A spill group read back end to end and its pieces gathered grouped (kernel/bulk/joined.py,
decision SW5): against the per-slice read, the gather of every piece and a stable grouping
of it (``group_piece``), column by column, on random chunks of every id layout, narrow
type, bad rows and per-batch columns, row numbers spilled as steps or whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.bulk import joined, partition, spill
from kernel.bulk.groups import groups_of_grouped
from kernel.io.trace import Rows

from .jit_modes import jit_switched
from .test_row_loops import NARROW, _chunk, _plan

pytest.importorskip("numba", reason="numba is not installed for this Python")


def _spilled(tmp: Path, chunks: list[Rows], plan: partition.Partition, groups: int,
             whole_rows: bool) -> spill.SpillFiles:
    """The chunks scattered by ``plan`` and written to ``groups`` spill groups (at least)."""
    bounds = np.unique(np.linspace(0, plan.n, groups + 1).astype(np.int64))
    files = spill.SpillFiles(tmp, plan, bounds)
    encode, calls = spill.row_steps, []

    def every_other_whole(row: np.ndarray, seg: np.ndarray) -> object:
        calls.append(1)
        return None if len(calls) % 2 else encode(row, seg)

    if whole_rows:  # (row numbers whole in every other slice, as when a step passes 16 bits)
        spill.row_steps = every_other_whole  # type: ignore[assignment]
    try:
        for c in chunks:
            files.add(partition.scatter(c, plan))
        files.finish()
    finally:
        spill.row_steps = encode
    return files


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.sampled_from([1, 7, 300, 2_000]), seed=st.integers(0, 10**6),
       kind=st.sampled_from(["dense", "wraps", "sparse64", "one"]),
       dtypes=st.lists(st.sampled_from(NARROW), min_size=4, max_size=4),
       per_batch=st.booleans(), bad=st.sampled_from([0.0, 0.2]), gaps=st.booleans(),
       piece_rows=st.sampled_from([1, 50, 600, 10**6]), groups=st.integers(1, 5),
       parts=st.integers(1, 4), whole_rows=st.booleans(), mixed=st.booleans())
def test_a_piece_gathered_grouped_is_the_gathered_piece_grouped(
        tmp_path_factory: pytest.TempPathFactory, n: int, seed: int, kind: str,
        dtypes: list[type], per_batch: bool, bad: float, gaps: bool, piece_rows: int,
        groups: int, parts: int, whole_rows: bool, mixed: bool) -> None:
    rng = np.random.default_rng(seed)
    rows = _chunk(rng, n, kind, dtypes, per_batch, bad, gaps)
    plan = _plan(rows.batch_id, piece_rows, False)
    cuts = np.linspace(0, n, parts + 1).astype(int)
    chunks = [rows.slice(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    # (mixed: the first chunk's counts in another type: copied end to end in the widest)
    mixed = mixed and parts > 1 and rows.scheduled.dtype != np.int64
    if mixed:
        c = chunks[0]
        chunks[0] = Rows(c.row, c.batch_id, c.scheduled.astype(np.int64), c.computed, c.bad,
                         c.decode_threshold, c.sm_budget)
    with jit_switched(True):
        a = _spilled(tmp_path_factory.mktemp("a"), chunks, plan, groups, whole_rows)
        b = _spilled(tmp_path_factory.mktemp("b"), chunks, plan, groups, whole_rows)
        seen = 0
        for g in range(a.n):
            stepped = bool(a.index[g]) and all(sl.firsts is not None for sl in a.index[g])
            got = a.read_joined(g)
            want = b.read(g)
            lo, hi = int(a.bounds[g]), int(a.bounds[g + 1])
            if not want:
                assert got == []
                continue
            assert isinstance(got, joined.Joined)
            # SW6: a column every slice holds in one type is its spill file, mapped (a
            # read-only view, no copy); the counts in two types were copied into the wider
            assert not got.rows.computed.flags.writeable
            # and row numbers spilled as steps in every slice stay steps until a piece is
            # gathered (each piece decodes its own)
            assert (got.steps is not None) == stepped
            assert stepped or whole_rows or rows.row.dtype.itemsize == 2
            assert got.rows.scheduled.flags.writeable == (
                len({c.rows.scheduled.dtype for c in want}) > 1)
            sizes = got.sizes()
            assert sizes.tolist() == sum(np.diff(c.offsets[lo:hi + 1]) for c in want).tolist()
            for k in range(lo, hi):
                piece = partition.gather_piece(want, k)
                assert len(piece) == sizes[k - lo]
                if not len(piece):
                    continue
                # the fallback's chunks (views of the joined rows) gather the same piece
                again = partition.gather_piece(got.scattered(), k)
                _same(again, piece)
                grouped = joined.gather_grouped(got, k)
                if grouped is None:  # (sparse ids over a span too wide for a table)
                    assert kind == "sparse64" and plan.piece_span(k) > 1 << 16
                    continue
                r, grp = grouped
                ref = partition.group_piece(piece, plan.piece_lo(k), plan.piece_span(k))
                _same(r, ref)
                want_g = groups_of_grouped(ref.batch_id)
                assert grp.starts.tolist() == want_g.starts.tolist()
                assert grp.ids.tolist() == want_g.ids.tolist()
                assert grp.inv.tolist() == want_g.inv.tolist()
                seen += len(r)
        assert seen <= n and (seen == n or kind == "sparse64")
        assert not list(a.dir.iterdir()) and not list(b.dir.iterdir())  # (each removed once read)


def _same(a: Rows, b: Rows) -> None:
    """Equal values, every column int64 (bad: bool) or absent in both."""
    for name in ("row", "batch_id", "scheduled", "computed", "bad", "decode_threshold",
                 "sm_budget"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.tolist() == y.tolist(), name
            if name != "bad":
                assert x.dtype == np.int64, name


def test_compiled_loops_off_gather_nothing_grouped(tmp_path: Path) -> None:
    rows = Rows(np.arange(10), np.arange(10) % 3, np.ones(10, np.int64), np.zeros(10, np.int64),
                np.zeros(10, bool))
    plan = _plan(rows.batch_id, 4, False)
    with jit_switched(True):
        files = _spilled(tmp_path, [rows], plan, 1, False)
        got = files.read_joined(0)
    assert isinstance(got, joined.Joined)
    with jit_switched(False):
        assert not joined.grouping_compiled()
        assert joined.gather_grouped(got, 0) is None


def test_a_spill_of_many_groups_raises_the_open_file_limit(tmp_path: Path) -> None:
    """SW6 keeps every group's column files open while it writes: with the soft limit on
    open files lowered under what 60 groups need, the spill raises it (within the hard limit)
    and reads every row back."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # (no skip: a hard limit too low for 60 groups' ~300 files fails here, as a spill would)
    top = 60 * len(spill.COLUMNS) if hard == resource.RLIM_INFINITY else min(
        hard, 60 * len(spill.COLUMNS))
    n = 6_000
    rows = Rows(np.arange(n), np.arange(n) % 600, np.ones(n, np.int64), np.arange(n),
                np.zeros(n, bool), None, np.full(n, 3, np.int64))
    plan = _plan(rows.batch_id, 10, False)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        with jit_switched(True):
            files = _spilled(tmp_path, [rows], plan, 60, False)
            assert files.n == 60 and len(files.files) > 128
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= top
            back = [files.read(g) for g in range(files.n)]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sum(len(c.rows) for chunks in back for c in chunks) == n
