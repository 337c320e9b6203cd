"""Where the CLI's log goes (issue 30 item 6, CF5): the library only creates module loggers
(``logging.getLogger(__name__)``) and configures no handler; the command line attaches one
stderr handler to the ``kernel`` and ``pipeline`` loggers, at the level ``-v``/``-vv`` or
``BLIS_KERNEL_LOG`` asks for (default: warnings only)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_HANDLER_NAME = "blis-kernel-cli"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (click's test runner swaps it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def level_for(verbose: int, env: str | None) -> int:
    """The log level: each ``-v`` lowers it one step from WARNING; ``BLIS_KERNEL_LOG`` is used
    when no ``-v`` is given. An unknown name is a usage error naming the allowed ones."""
    if verbose:
        return logging.INFO if verbose == 1 else logging.DEBUG
    if env:
        level = _LEVELS.get(env.strip().lower())
        if level is None:
            raise click.UsageError(f"BLIS_KERNEL_LOG={env!r} is not a level; use one of "
                                   f"{', '.join(sorted(_LEVELS))}")
        return level
    return logging.WARNING


def configure(verbose: int) -> None:
    """Attach one stderr handler (idempotent) to the package loggers."""
    level = level_for(verbose, os.environ.get("BLIS_KERNEL_LOG"))
    for name in ("kernel", "pipeline"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
            handler = _Stderr()  # stderr: stdout stays data
            handler.set_name(_HANDLER_NAME)
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
