"""kernel/model/jit.py: the switch (BLIS_JIT), the fallback, and compiled = interpreted."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernel.model import jit


def _weighted_sum(a: np.ndarray, w: np.ndarray) -> int:
    total = 0
    for i in range(a.shape[0]):
        total += a[i] * w[i]
    return total


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    jit.reset()
    yield monkeypatch
    jit.reset()


@pytest.mark.parametrize("value", ["0", "off", "no", "false", " 0 "])
def test_blis_jit_off_gives_no_compiled_function(fresh: pytest.MonkeyPatch, value: str) -> None:
    fresh.setenv("BLIS_JIT", value)
    assert not jit.enabled()
    assert jit.compiled(_weighted_sum) is None


def test_without_numba_the_numpy_paths_serve(fresh: pytest.MonkeyPatch) -> None:
    import sys

    fresh.delenv("BLIS_JIT", raising=False)
    fresh.setitem(sys.modules, "numba", None)  # (import numba raises ImportError)
    assert not jit.enabled()
    assert jit.compiled(_weighted_sum) is None


def test_compiled_once_per_function(fresh: pytest.MonkeyPatch) -> None:
    fresh.delenv("BLIS_JIT", raising=False)
    pytest.importorskip("numba", reason="numba is not installed for this Python")
    first = jit.compiled(_weighted_sum)
    assert first is not None and first is not _weighted_sum
    assert jit.compiled(_weighted_sum) is first


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.int64, st.integers(0, 64), elements=st.integers(-(2**20), 2**20)),
       st.data())
def test_compiled_equals_interpreted(a: np.ndarray, data: st.DataObject) -> None:
    pytest.importorskip("numba", reason="numba is not installed for this Python")
    w = data.draw(hnp.arrays(np.int64, a.shape, elements=st.integers(-1000, 1000)))
    fn = jit.compiled(_weighted_sum)
    if fn is None:  # (BLIS_JIT=0 in the environment: nothing compiled to compare)
        assert not jit.enabled()
        return
    assert fn(a, w) == _weighted_sum(a, w)
