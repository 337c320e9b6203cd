"""Compiled loops where numba is installed, and the switch that turns them off (decision JIT1).

A few hot loops (a step's column aggregates, a chunk's scatter to its pieces) cost one C-level
pass each when compiled against a handful of numpy calls otherwise. Each call site keeps its
numpy implementation and asks :func:`compiled` for the compiled one, taking the numpy path when
it gets ``None``: numba is not installed (it is a dependency only where it supports the Python
version), or ``BLIS_JIT=0`` is set (read once, at the first request). Both paths give the same
integers; the tests run each site both ways.

numba is imported at the first request, not with :mod:`kernel` (it takes about half a second),
and each function is compiled once per process, its machine code cached on disk by numba
(``cache=True``: the next process loads it in milliseconds).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["compiled", "enabled", "lookup", "reset"]

_state: dict[str, Any] = {}  # "numba": the module, or None when off or missing
_done: dict[Callable[..., Any], Callable[..., Any] | None] = {}
# ``lookup(fn, default)``: what :func:`compiled` gave for ``fn`` (None: off), or ``default`` if it
# was never asked — one dict read, for call sites on a per-call hot path; the table is cleared
# in place by :func:`reset`, so the bound method stays valid.
lookup = _done.get


def _numba() -> Any:
    if "numba" not in _state:
        module = None
        if os.environ.get("BLIS_JIT", "1").strip() not in ("0", "off", "no", "false"):
            try:
                import numba  # (heavy: LLVM, loaded only at the first compiled call)

                module = numba
            except ImportError:  # (not installed: the numpy paths serve)
                module = None
        _state["numba"] = module
    return _state["numba"]


def enabled() -> bool:
    """Whether compiled loops are in use in this process (numba importable, BLIS_JIT not 0)."""
    return _numba() is not None


def compiled(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by numba (nopython, GIL released, cached on disk), or None where
    compiled loops are off. ``fn`` must be a plain function of numpy arrays and scalars."""
    if fn not in _done:
        numba = _numba()
        _done[fn] = None if numba is None else numba.njit(cache=True, nogil=True)(fn)
    return _done[fn]


def reset() -> None:
    """Forget the switch and every compiled function (tests flip ``BLIS_JIT``)."""
    _state.clear()
    _done.clear()
