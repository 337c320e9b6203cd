"""Reusable databases for resolving one scenario at a time (``kernel.open``'s path).

Setting up a database (every document table, the cost-law functions, the constants and unit
tables) costs about a sixth of a warm ``kernel.open``. A scratch database is set up once and
lent out: each loan runs inside a transaction that is rolled back when it ends, so the next
borrower finds the same empty, prepared database. Loans are exclusive (one thread each; a
second concurrent borrower gets a database of its own), and a forked child never borrows its
parent's.

A scratch database holds one scenario's tens of rows, so it runs DuckDB without worker
threads and without its query optimiser: both cost more than they save at that size, and
neither changes a result (``tests/test_scratch.py`` checks every embedded scenario against a
fresh, optimised database).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import duckdb

from . import db

# Databases kept for reuse; more than this many concurrent borrowers get fresh ones.
_KEEP = 4
_lock = threading.Lock()
_free: list[tuple[duckdb.DuckDBPyConnection, tuple[db.UdfInstaller, ...]]] = []
_pid = os.getpid()
# A forked child's copies of its parent's databases: kept, never closed or collected, since
# tearing one down in the child could wait on state that only the parent has.
_inherited: list[object] = []


def _fresh() -> duckdb.DuckDBPyConnection:
    con = db.open_db(apply=False)
    con.execute("SET threads = 1")
    con.execute("PRAGMA disable_optimizer")
    db.prepare(con)
    return con


def _take() -> duckdb.DuckDBPyConnection:
    global _pid
    installers = db.udf_installers()
    with _lock:
        if _pid != os.getpid():  # a forked child: the parent's databases are not its own
            _inherited.extend(_free)
            _free.clear()
            _pid = os.getpid()
        while _free:
            con, prepared_with = _free.pop()
            if prepared_with == installers:
                return con
            con.close()  # a cost law was installed since: set up anew
    return _fresh()


def _give_back(con: duckdb.DuckDBPyConnection, pid: int) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:  # the loan left it unusable: drop it
        con.close()
        return
    with _lock:
        if pid == _pid == os.getpid() and len(_free) < _KEEP:
            _free.append((con, db.udf_installers()))
            return
    con.close()


@contextlib.contextmanager
def scratch_db() -> Iterator[duckdb.DuckDBPyConnection]:
    """A prepared database with every document table empty, for this block alone: register
    documents, :func:`pipeline.db.run_views`, read; everything written is undone on exit."""
    con = _take()
    pid = os.getpid()
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    finally:
        _give_back(con, pid)
