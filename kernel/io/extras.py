"""Optional dependencies: one place that says which extra to install (issue 30 item 9, CF7).

A plain ``pip install blis-kernel`` prices, runs SQL and the CLI; charts and reports need
matplotlib, which comes with the ``report`` extra. Modules that draw call :func:`require_charts`
before importing matplotlib, so a missing extra is one actionable line, not a traceback."""

from __future__ import annotations

import importlib.util
import sys

CHARTS_MESSAGE = "charts need matplotlib: pip install 'blis-kernel[report]'"


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says what to install."""


def _available(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None  # None: import blocked (as tests do)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_charts() -> None:
    """Raise :class:`MissingExtraError` naming the ``report`` extra unless matplotlib imports."""
    if not _available("matplotlib"):
        raise MissingExtraError(CHARTS_MESSAGE)
