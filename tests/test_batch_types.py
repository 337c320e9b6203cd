"""Batch and Request take counts of any integral type and refuse floats and bools (issue 18)."""

from __future__ import annotations

import pickle
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.model.types import Batch, Request
from tests.fixtures_pools import tiny_dense


class Index:
    """Any object with __index__ (what operator.index accepts) is an integer."""

    def __init__(self, v: int):
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __repr__(self) -> str:  # test ids use repr: the default one holds a memory address
        return f"Index({self.v})"


INTEGRAL = [np.int64, np.int32, np.int8, np.uint16, np.uint64, int, Index]


@pytest.mark.parametrize("kind", INTEGRAL, ids=lambda k: k.__name__)
def test_integral_counts_are_accepted_and_stored_as_int(kind: Any) -> None:
    b = Batch([(kind(1), kind(100)), Request(kind(3), kind(7), kind(10), kind(2))],
              decode_threshold=kind(8), sm_budget=kind(66))
    assert b.requests == (Request(1, 100), Request(3, 7, 10, 2))
    for r in b.requests:
        assert all(type(v) is int for v in r)
    assert type(b.decode_threshold) is int and b.decode_threshold == 8
    assert type(b.sm_budget) is int and b.sm_budget == 66


def test_numpy_columns_price_as_python_ints() -> None:
    k = kernel.Kernel(tiny_dense(), None, None)  # type: ignore[arg-type]
    sched = np.array([1, 1, 512], dtype=np.int64)
    comp = np.array([4095, 100, 0], dtype=np.int32)
    from_numpy = Batch(list(zip(sched, comp, strict=True)), decode_threshold=np.int64(8))
    from_int = Batch([(1, 4095), (1, 100), (512, 0)], decode_threshold=8)
    assert from_numpy == from_int
    assert k.step_time(from_numpy) == k.step_time(from_int)
    decode = Batch([Request(np.int64(1), c) for c in comp], decode_threshold=8)
    assert k.step_time(decode) == k.step_time(Batch([(1, int(c)) for c in comp], 8))


BAD = [1.0, np.float64(1.0), np.float32(2.0), True, False, np.bool_(True), "1", None,
       Fraction(1, 1), 1 + 0j]


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("where", range(4))
def test_floats_bools_and_others_are_refused(bad: Any, where: int) -> None:
    fields = [1, 2, 3, 4]
    fields[where] = bad
    name = ("scheduled", "computed", "prompt_len", "cached_tokens")[where]
    with pytest.raises(ValueError, match=name):
        Request(*fields)
    with pytest.raises(ValueError, match=rf"requests\[1\]\.{name}"):
        Batch([(1, 1), tuple(fields)])


@pytest.mark.parametrize("bad", [1.5, True, np.float64(8.0), "8"], ids=repr)
def test_threshold_and_budget_refuse_non_integers(bad: Any) -> None:
    with pytest.raises(ValueError, match="decode_threshold"):
        Batch([(1, 1)], decode_threshold=bad)
    with pytest.raises(ValueError, match="sm_budget"):
        Batch([(1, 1)], sm_budget=bad)


@pytest.mark.parametrize("neg", [-1, np.int64(-5), Index(-2)], ids=repr)
def test_negative_counts_are_refused(neg: Any) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        Request(neg, 0)
    with pytest.raises(ValueError, match=r"requests\[0\]\.computed must be a non-negative"):
        Batch([(1, neg)])
    with pytest.raises(ValueError, match="sm_budget"):
        Batch([], sm_budget=neg)


def test_malformed_entries_say_which() -> None:
    with pytest.raises(ValueError, match=r"requests\[0\] must be a Request or a tuple"):
        Batch([(1,)])
    with pytest.raises(ValueError, match=r"requests\[2\]"):
        Batch([(1, 1), (1, 1), 5])


def test_request_stays_a_checked_named_tuple() -> None:
    r = Request(np.int64(2), 30)
    assert r == (2, 30, 0, 0) and r.scheduled == 2 and r._fields[0] == "scheduled"
    assert pickle.loads(pickle.dumps(r)) == r
    assert type(Request._make([1, 2, 3, 4])) is Request
    with pytest.raises(ValueError):
        Request._make([1.0, 2])
    with pytest.raises(ValueError):
        r._replace(computed=-1)
    assert r._replace(computed=np.int16(5)) == Request(2, 5)
    assert repr(r) == "Request(scheduled=2, computed=30, prompt_len=0, cached_tokens=0)"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40),
                          st.sampled_from([np.int64, np.uint32, int, Index])), max_size=20))
def test_any_integral_mix_equals_plain_ints(rows: list[tuple[int, int, Any]]) -> None:
    def conv(kind: Any, v: int) -> Any:
        return kind(min(v, 2**32 - 1)) if kind is np.uint32 else kind(v)

    mixed = Batch([(conv(kind, s), conv(kind, c)) for s, c, kind in rows])
    plain = Batch([(int(conv(kind, s)), int(conv(kind, c))) for s, c, kind in rows])
    assert mixed == plain
    assert all(type(v) is int for r in mixed.requests for v in r)
