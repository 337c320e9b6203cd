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


def _memory_limit() -> str:
    """The memory this process may use, as a phrase (the address-space limit, else RAM)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft not in (resource.RLIM_INFINITY, -1):
        return f"the process's address-space limit of {soft / 2**30:.1f} GiB (ulimit -v)"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return f"the machine's {total / 2**30:.1f} GiB of memory"
    except (ValueError, OSError, AttributeError):
        return "the memory available"


# What to change, per command, when memory runs out (RL10).
_MEMORY_OPTIONS = {
    "price": "--chunk-rows (fewer rows per chunk)",
    "sql": "--max-rows, or write a file (-o F.parquet) that streams",
    "sweep": "fewer worker processes (--cluster local:N)",
    "calibrate": "fewer or smaller traces",
    "report": "a smaller priced file",
}


def resource_error(exc: BaseException, command: str | None) -> str | None:
    """One actionable line for an out-of-memory, lock or resource failure from DuckDB, Arrow
    or numpy (None: not one of those)."""
    import duckdb

    text = " ".join(str(exc).split())
    lowered = text.lower()
    is_memory = (isinstance(exc, MemoryError | getattr(duckdb, "OutOfMemoryException", ()))
                 or type(exc).__name__ in ("ArrowMemoryError", "_ArrayMemoryError")
                 or "out of memory" in lowered or "unable to allocate" in lowered
                 or "failed to allocate" in lowered)
    if is_memory:
        option = _MEMORY_OPTIONS.get(command or "", "smaller inputs")
        return (f"out of memory ({type(exc).__name__}) within {_memory_limit()}; use {option}, "
                "or run where more memory is free")
    if isinstance(exc, duckdb.IOException) and "lock" in lowered:
        import re

        held = re.search(r"PID (\d+)", text)
        who = f" by process {held.group(1)}" if held else " by another process"
        name = re.search(r'file "([^"]+)"', text)
        where = f" {name.group(1)!r}" if name else ""
        return (f"the database{where} is locked{who}; wait for it to finish, or give "
                "another --db file")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return ("too many open files (the process's limit: ulimit -n); raise it, or price "
                "fewer files at once")
    return None


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

    from kernel.io.extras import MissingExtraError
    from pipeline.errors import DocumentError, RefusalError

    return (DocumentError, RefusalError, MissingExtraError, OSError, ValueError, ArithmeticError, duckdb.Error,
            pa.ArrowException, pl.exceptions.PolarsError, MemoryError)


class Group(click.Group):
    """The top-level group: the single place exceptions become CLI errors."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["blis.argv"] = ["blis-kernel", *args]  # the command line a stamp records
        return super().parse_args(ctx, args)

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
            sub = ctx.invoked_subcommand
            actionable = resource_error(exc, sub)
            if actionable is not None:
                raise click.ClickException(actionable) from None
            if isinstance(exc, _expected()):
                raise click.ClickException(describe(exc)) from None
            click.echo(f"Error: internal error (a bug, please report it): "
                       f"{type(exc).__name__}: {describe(exc)}; BLIS_DEBUG=1 shows the "
                       "traceback", err=True)
            ctx.exit(INTERNAL_EXIT)
