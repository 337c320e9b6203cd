"""The one CLI error path: every expected failure becomes ``Error: <what>, <where>, <what is
allowed>`` on one line and exit 1 (usage errors exit 2), never a traceback.

:class:`Group` is the command group class: its ``invoke`` turns the exceptions a user can
cause (bad documents, refusals, unreadable or unwritable files, bad traces, SQL errors) into
:class:`click.ClickException`, and folds any message onto one line. Anything else is a bug:
one line saying so, exit 70 (``EX_SOFTWARE``); ``BLIS_DEBUG=1`` re-raises it with its traceback.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import click

INTERNAL_EXIT = 70


class OutputError(click.ClickException):
    """An output that would destroy an input, or a target that cannot be a file."""


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) folded to one space."""
    return " ".join(str(text).split())


def _os_error(exc: OSError) -> str:
    what = exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)
    where = exc.filename if exc.filename is not None else ""
    where = os.fsdecode(where) if isinstance(where, bytes) else str(where)
    if len(where) > 120:
        where = where[:117] + "..."
    hint = {errno.ENOENT: "the file or directory must exist",
            errno.EACCES: "the path must be readable (inputs) or writable (outputs)",
            errno.EPERM: "the path must be writable",
            errno.ENAMETOOLONG: "each path component is at most 255 bytes",
            errno.EISDIR: "give a file, not a directory",
            errno.ENOTDIR: "every parent of the path must be a directory",
            errno.ENOSPC: "free some space on the device",
            errno.EROFS: "the file system is read-only: write elsewhere"}.get(exc.errno or -1)
    parts = [what.rstrip(".")]
    if where:
        parts.append(repr(where))
    if hint:
        parts.append(hint)
    return ", ".join(parts)


def describe(exc: BaseException) -> str:
    """One line for an expected failure (no ``error:`` tag: click adds ``Error:``)."""
    from pipeline.errors import DocumentError

    if isinstance(exc, DocumentError):
        first = exc.problems[0]
        where = first.file + (f":{first.line}" if first.line else "")
        more = len(exc.problems) - 1
        tail = f" (+{more} more problem{'s' if more > 1 else ''}; `blis-kernel validate` " \
               "lists them all)" if more else ""
        return one_line(f"{where}: {first.path or '(document)'}: {first.message}{tail}")
    if isinstance(exc, OSError) and exc.errno is not None:
        return one_line(_os_error(exc))
    if isinstance(exc, UnicodeDecodeError):
        return one_line(f"not UTF-8 text (byte offset {exc.start}); give a UTF-8 text file")
    text = one_line(str(exc)) or type(exc).__name__
    return text[:1000]


def _expected() -> tuple[type[BaseException], ...]:
    import duckdb
    import polars as pl
    import pyarrow as pa

    from pipeline.errors import DocumentError, RefusalError

    return (DocumentError, RefusalError, OSError, ValueError, ArithmeticError, duckdb.Error,
            pa.ArrowException, pl.exceptions.PolarsError, MemoryError)


class Group(click.Group):
    """The top-level group: the single place exceptions become CLI errors."""

    def invoke(self, ctx: click.Context) -> Any:
        from pipeline.safe_output import command_scope
        from pipeline.yamlio import DEFAULT_MAX_DOCUMENT_BYTES, DEFAULT_MAX_SCALAR_BYTES, set_limits

        try:
            # every output is checked against what the command read (RL1); each command
            # starts from the default size limits (RL4), which its options may raise
            before = set_limits(DEFAULT_MAX_DOCUMENT_BYTES, DEFAULT_MAX_SCALAR_BYTES)
            try:
                with command_scope():
                    return super().invoke(ctx)
            finally:
                set_limits(*before)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            if "\n" in exc.message and not isinstance(exc, click.UsageError):
                raise click.ClickException(one_line(exc.message)) from None
            raise
        except (click.exceptions.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            if os.environ.get("BLIS_DEBUG"):
                raise
            if isinstance(exc, _expected()):
                raise click.ClickException(describe(exc)) from None
            click.echo(f"Error: internal error (a bug, please report it): "
                       f"{type(exc).__name__}: {describe(exc)}; BLIS_DEBUG=1 shows the "
                       "traceback", err=True)
            ctx.exit(INTERNAL_EXIT)
