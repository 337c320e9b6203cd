"""A fixture that runs a test once with compiled loops and once without (decision JIT1): the
call sites' numpy/builtin code must give the same bits as their compiled loops."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel.model import jit


@pytest.fixture(params=["compiled", "interpreted"])
def jit_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``compiled``: numba's loops (skipped where numba is not installed for this Python);
    ``interpreted``: ``BLIS_JIT=0``, the code every site keeps for that case."""
    if request.param == "compiled":
        pytest.importorskip("numba", reason="numba is not installed for this Python")
        monkeypatch.delenv("BLIS_JIT", raising=False)
    else:
        monkeypatch.setenv("BLIS_JIT", "0")
    jit.reset()
    assert jit.enabled() == (request.param == "compiled")
    yield request.param
    jit.reset()
