"""The partition's scatter and gather by compiled loops (kernel/bulk/row_loops.py, decision
SJ1) against the numpy/Arrow path and against a stable argsort, on random chunks: empty, one
piece, many pieces, every narrow column type, bad rows or none, row numbers with gaps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.bulk import partition as part
from kernel.bulk.spill import spill_plan
from kernel.io.trace import Rows

from .jit_modes import jit_mode, jit_switched  # noqa: F401  (a fixture)

pytest.importorskip("numba", reason="numba is not installed for this Python")

NARROW = [np.uint16, np.int32, np.int64]
FIELDS = ("row", "batch_id", "scheduled", "computed", "bad", "decode_threshold", "sm_budget")


def _chunk(rng: np.random.Generator, n: int, kind: str, dtypes: list[type],
           per_batch: bool, bad: float, gaps: bool) -> Rows:
    ids = {"dense": rng.integers(-50, 5_000, n),
           "wraps": rng.choice([-3, 1, 5]) * 2**16 + rng.integers(-40, 40, n),
           "sparse64": rng.choice(rng.integers(-2**63, 2**63 - 1, 7, dtype=np.int64), n),
           "one": np.full(n, 12_345)}[kind].astype(np.int64)
    first = int(rng.integers(0, 60_000))
    row = first + (np.sort(rng.choice(3 * n + 1, n, replace=False)) if gaps else np.arange(n))

    def col(dtype: type, hi: int) -> np.ndarray:
        top = min(hi, int(np.iinfo(dtype).max))
        return rng.integers(0, top + 1, n).astype(dtype)

    return Rows(row.astype(dtypes[0]) if dtypes[0] != np.uint16 or row.max(initial=0) < 2**16
                else row, ids, col(dtypes[1], 2**20), col(dtypes[2], 2**40),
                rng.random(n) < bad if bad else np.broadcast_to(np.False_, (n,)),
                col(dtypes[3], 2**33) if per_batch else None,
                col(dtypes[1], 500) if per_batch else None)


def _plan(ids: np.ndarray, piece_rows: int, from_ranges: bool) -> part.Partition:
    lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
    if from_ranges:
        planned = part.plan_from_ranges([(lo, hi, max(ids.size, 1))], piece_rows)
        assert planned is not None
        return planned
    shift = part.cell_shift(lo, hi)
    return part.plan(lo, shift, part.histogram(ids, lo, shift), piece_rows)


def _equal(a: Rows, b: Rows) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name


@settings(max_examples=120, deadline=None)
@given(n=st.sampled_from([0, 1, 2, 7, 64, 300, 1_000]), seed=st.integers(0, 10**6),
       kind=st.sampled_from(["dense", "wraps", "sparse64", "one"]),
       dtypes=st.lists(st.sampled_from(NARROW), min_size=4, max_size=4),
       per_batch=st.booleans(), bad=st.sampled_from([0.0, 0.2]), gaps=st.booleans(),
       piece_rows=st.sampled_from([1, 3, 50, 10**6]), from_ranges=st.booleans())
def test_the_compiled_scatter_and_gather_equal_numpys(
        n: int, seed: int, kind: str, dtypes: list[type], per_batch: bool, bad: float,
        gaps: bool, piece_rows: int, from_ranges: bool) -> None:
    rng = np.random.default_rng(seed)
    rows = _chunk(rng, n, kind, dtypes, per_batch, bad, gaps)
    plan = _plan(rows.batch_id, piece_rows, from_ranges)
    fresh = not gaps
    halves = [rows.slice(0, n // 2), rows.slice(n // 2, n)]
    out = {}
    for on in (True, False):
        with jit_switched(on):
            assert (part._compiled() is not None) == on
            scattered = [part.scatter(h, plan, fresh=fresh) for h in halves]
            out[on] = (scattered, [part.gather_piece(scattered, k) for k in range(plan.n)])
    for a, b in zip(out[True][0], out[False][0], strict=True):
        assert np.array_equal(a.offsets, b.offsets)
        assert a.offsets.dtype == b.offsets.dtype == np.int64
        _equal(a.rows, b.rows)  # every column, narrow as it came (ids: uint16 when local)
    for a, b in zip(out[True][1], out[False][1], strict=True):
        _equal(a, b)
    with jit_switched(True):  # the Arrow path asked for where loops are on (CS1): the same
        arrow = [part.scatter(h, plan, fresh=fresh, compiled=False) for h in halves]
        for a, b in zip(arrow, out[True][0], strict=True):
            assert np.array_equal(a.offsets, b.offsets)
            _equal(a.rows, b.rows)
        for k, b in enumerate(out[True][1]):
            _equal(part.gather_piece(arrow, k, compiled=False), b)
    # and both are a stable sort by piece (an oracle of their own): every piece's rows in
    # input order, their ids restored
    key = plan.piece_of_cell[plan.cells(rows.batch_id)]
    order = np.argsort(key, kind="stable")
    got = Rows.concat(out[True][1], wide=True)
    assert got.batch_id.tolist() == rows.batch_id[order].tolist()
    assert got.row.tolist() == rows.row[order].tolist()
    assert got.scheduled.tolist() == rows.scheduled[order].tolist()
    assert got.computed.tolist() == rows.computed[order].tolist()
    assert got.bad.tolist() == rows.bad[order].tolist()
    if per_batch and n:  # (no rows: gather_piece gives Rows.empty(), no such column)
        assert got.sm_budget is not None and rows.sm_budget is not None
        assert got.sm_budget.tolist() == rows.sm_budget[order].tolist()


@settings(max_examples=120, deadline=None)
@given(n=st.sampled_from([0, 1, 2, 7, 64, 300]), seed=st.integers(0, 10**6),
       kind=st.sampled_from(["dense", "wraps", "sparse64", "one"]),
       dtypes=st.lists(st.sampled_from(NARROW), min_size=4, max_size=4),
       per_batch=st.booleans(), bad=st.sampled_from([0.0, 0.2]), gaps=st.booleans(),
       top=st.sampled_from([None, 2**16 - 1, 2**16, 2**31 - 1, 2**31]),
       piece_rows=st.sampled_from([1, 3, 50, 10**6]))
def test_scattering_narrowed_takes_each_column_straight_into_its_narrow_type(
        n: int, seed: int, kind: str, dtypes: list[type], per_batch: bool, bad: float,
        gaps: bool, top: int | None, piece_rows: int) -> None:
    """SW3: ``scatter(..., narrow=True)`` of wide rows gives what narrowing them first and
    scattering the narrowed rows gives (values and types), compiled or not; row numbers and
    counts near the uint16 and int32 limits so that every narrow type comes out."""
    rng = np.random.default_rng(seed)
    rows = _chunk(rng, n, kind, dtypes, per_batch, bad, gaps)
    if top is not None and n:  # (the greatest row number and count exactly at a limit)
        rows.row = rows.row.astype(np.int64) + (top - int(rows.row.max()))
        rows.computed = rows.computed.astype(np.int64)
        rows.computed[rng.integers(0, n)] = top
    plan = _plan(rows.batch_id, piece_rows, False)
    fresh = not gaps

    def copy() -> Rows:
        return rows.take(np.arange(n))

    want = part.scatter(copy().narrowed(), plan, fresh=fresh)
    for on in (True, False):
        with jit_switched(on):
            got = part.scatter(copy(), plan, fresh=fresh, narrow=True)
            assert np.array_equal(got.offsets, want.offsets)
            _equal(got.rows, want.rows)


@pytest.mark.usefixtures("jit_mode")
def test_a_chunk_scatters_to_its_pieces_in_input_order() -> None:
    """Both ways (fixture ``jit_mode``): a hand-made chunk over three pieces, one empty."""
    ids = np.array([70, 3, 71, 5, 3, 140, 70, 4], np.int64)
    rows = Rows(np.arange(10, 18, dtype=np.int32), ids, np.arange(8, dtype=np.uint16),
                np.arange(100, 108, dtype=np.int64), np.zeros(8, bool))
    # cells of one id (shift 0), pieces [0, 60) [60, 100) [100, 130) [130, ...)
    lut = np.zeros(part.CELLS, np.uint8)
    lut[60:] = 1
    lut[100:] = 2
    lut[130:] = 3
    plan = part.Partition(0, 200, 0, lut, np.array([0, 60, 100, 130], np.int64))
    s = part.scatter(rows, plan, fresh=True)
    assert s.offsets.tolist() == [0, 4, 7, 7, 8]
    assert s.rows.row.tolist() == [11, 13, 14, 17, 10, 12, 16, 15]
    assert s.rows.batch_id.dtype == np.uint16  # every piece spans < 2**16 ids
    assert part.gather_piece([s], 1).batch_id.tolist() == [70, 71, 70]
    assert part.gather_piece([s], 0).scheduled.tolist() == [1, 3, 4, 7]
    assert part.gather_piece([s], 2).batch_id.size == 0


def test_the_last_piece_ends_at_the_largest_planned_id() -> None:
    """A plan from statistics of 10 M batch ids in 306 pieces: the last one used to span
    the cells' whole range (6.8 M ids) and made every piece's ids int64; it ends at ``hi``."""
    ranges = [(0, 9_999_999, 320_000_000)]
    plan = spill_plan(ranges, 1 << 30)
    assert plan is not None and plan.n > 300
    spans = [plan.piece_span(j) for j in range(plan.n)]
    ends = [plan.piece_lo(j) + w for j, w in enumerate(spans) if w]
    # (up to the end of the last id's cell; a piece starting beyond the last id spans none)
    assert 10_000_000 <= max(ends) < 10_000_000 + (1 << plan.shift)
    assert max(spans) <= 1 << 16 and plan.local
    ids = np.array([0, 9_999_999, 5_000_000, 9_999_998], np.int64)
    s = part.scatter(Rows(np.arange(4), ids, ids % 7, ids % 5, np.zeros(4, bool)), plan)
    assert s.rows.batch_id.dtype == np.uint16
    assert sorted(s.absolute().batch_id.tolist()) == sorted(ids.tolist())



@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), pieces=st.integers(1, 12), n=st.integers(0, 400),
       dtype=st.sampled_from([np.int32, np.int64]), wide=st.sampled_from([0, 2**16 - 1, 2**16]),
       start=st.sampled_from([0, 2**31 - 2**20, 2**40]))
def test_spilled_row_numbers_as_steps_round_trip_both_ways(
        seed: int, pieces: int, n: int, dtype: type, wide: int, start: int) -> None:
    """SW2: a slice's row numbers (rising within each piece, as a scatter leaves them) go to
    disk as uint16 steps plus each piece's first number, and come back equal, type included,
    compiled or not; a step beyond 16 bits (or a fall) refuses the encoding, both ways."""
    from kernel.bulk import spill

    if dtype == np.int32 and start > 2**31 - 2**21:
        start = 0
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(n, np.ones(pieces) / pieces)
    seg = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    row = np.empty(n, np.int64)
    for a, b in zip(seg[:-1], seg[1:], strict=True):  # (each piece's numbers rise)
        gaps = rng.integers(1, 40, b - a)
        if wide and b - a > 1:
            gaps[rng.integers(1, b - a)] = wide
        row[a:b] = start + rng.integers(0, 1_000) + np.cumsum(gaps)
    row = row.astype(dtype)
    fits = wide < 2**16 or not any(b - a > 1 for a, b in zip(seg[:-1], seg[1:], strict=True))
    got = []
    for on in (True, False):
        with jit_switched(on):
            enc = spill.row_steps(row, seg)
            assert (enc is not None) == fits
            if enc is not None:
                steps, firsts = enc
                assert steps.dtype == np.uint16 and firsts.size == pieces
                back = spill.rows_from_steps(steps, seg, firsts, row.dtype)
                assert back.dtype == row.dtype and np.array_equal(back, row)
                got.append((steps, firsts))
    if fits:  # (the same bytes on disk either way)
        assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
    if n > 1 and fits:  # a fall within a piece is refused too
        k = int(np.argmax(np.diff(seg)))
        if seg[k + 1] - seg[k] > 1:
            bad = row.copy()
            bad[seg[k] + 1] = bad[seg[k]] - 1
            for on in (True, False):
                with jit_switched(on):
                    assert spill.row_steps(bad, seg) is None
