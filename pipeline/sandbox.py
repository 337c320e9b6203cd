"""Read-only SQL: the connection ``blis-kernel sql`` runs a user's query on.

Three locks, each enforced by DuckDB itself where it can be:

* :func:`lock` turns off external access (no file, URL, ATTACH, COPY, INSTALL or LOAD
  reaches the machine) and then locks the configuration, so a query cannot turn it back on.
  Call it once the views are built: building reads the ``sql/`` files and registers tables.
* :func:`open_read_only` opens a database file read-only and locked: nothing in it changes.
* :func:`check_query` admits only reading statements (``SELECT`` in any form, ``EXPLAIN``),
  which keeps an in-memory database unchanged as well.

The Python API keeps its writable path, by name: :func:`pipeline.db.open_db` gives a
writable connection, and nothing here is applied to it.
"""

from __future__ import annotations

import os
import re
from typing import Any

import duckdb

READING = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
_SETTINGS = ("SET autoinstall_known_extensions = false",
             "SET autoload_known_extensions = false",
             "SET enable_external_access = false",
             "SET lock_configuration = true")


class SandboxError(ValueError):
    """A query the sandbox does not run (one line: what, and what is allowed)."""


def lock(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """No external access from here on, and no way to change the configuration back."""
    for statement in _SETTINGS:
        con.execute(statement)
    return con


def open_read_only(path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """A database file opened read-only, external access off, configuration locked."""
    if not os.path.isfile(path):
        raise SandboxError(f"no database file {os.fspath(path)!r}; --db names an existing "
                           "DuckDB file (write one with `blis-kernel price --db`)")
    from . import safe_output

    safe_output.note_read("--db", path)
    con = duckdb.connect(os.fspath(path), read_only=True,
                         config={"enable_external_access": False,
                                 "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    # DuckDB shares one database instance per file within a process: another connection may
    # have locked it already (setting the lock again would then be refused).
    rows = con.execute("SELECT current_setting('lock_configuration')").fetchall()
    if not (rows and rows[0][0]):
        con.execute("SET lock_configuration = true")
    return con


def check_query(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Raise :class:`SandboxError` unless ``query`` is one or more reading statements."""
    if not query.strip():
        raise SandboxError("the query is empty; give a SELECT, e.g. "
                           "\"SELECT * FROM scenarios\"")
    statements = con.extract_statements(query)
    if not statements:
        raise SandboxError("the query holds no statement; give a SELECT")
    for st in statements:
        _check_statement(con, st)
    if len(statements) > 1:
        raise SandboxError(f"the query holds {len(statements)} statements; `blis-kernel sql` "
                           "runs one (its result is one table): run them one at a time")


_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+|\([^)]*\)\s*)*", re.IGNORECASE)


def _check_statement(con: duckdb.DuckDBPyConnection, st: Any, depth: int = 0) -> None:
    if st.type not in READING:
        kind = str(st.type).rsplit(".", 1)[-1]
        raise SandboxError(f"{kind} statements are not allowed: `blis-kernel sql` is "
                           "read-only; give SELECT (WITH, FROM, DESCRIBE, SHOW, SUMMARIZE) "
                           "or EXPLAIN")
    if st.type == duckdb.StatementType.EXPLAIN:
        # EXPLAIN ANALYZE runs what it explains: that statement must read only too (RL7)
        inner = _EXPLAIN.sub("", st.query, count=1)
        try:
            explained = con.extract_statements(inner) if inner != st.query else []
        except duckdb.Error:
            explained = []
        if len(explained) != 1 or depth > 2:
            raise SandboxError("EXPLAIN is allowed of one reading statement (SELECT, WITH, "
                               "FROM, DESCRIBE, SHOW, SUMMARIZE)")
        _check_statement(con, explained[0], depth + 1)
