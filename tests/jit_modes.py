"""A fixture that runs a test once with compiled loops and once without (decision JIT1): the
call sites' numpy/builtin code must give the same bits as their compiled loops; and a context
manager that does the same inside a hypothesis test (where a function-scoped fixture cannot)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def jit_switched(on: bool) -> Iterator[None]:
    """Compiled loops on or off inside the block (``BLIS_JIT``, read afresh), as before after."""
    before = os.environ.get("BLIS_JIT")
    os.environ["BLIS_JIT"] = "1" if on else "0"
    jit.reset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("BLIS_JIT", None)
        else:
            os.environ["BLIS_JIT"] = before
        jit.reset()
