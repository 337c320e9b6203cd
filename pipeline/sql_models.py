"""The ``sql/`` files as models: what each defines and reads, and the order to run them in.

Dependencies are derived from DuckDB's own parse of the SQL (its tokens for each CREATE
statement's head, ``json_serialize_sql`` for the query behind it) rather than declared or
implied by file-name prefixes: a file defines the views, tables and macros it creates, and
depends on every other file whose relations it reads or whose macros it calls. ``order`` runs a file after everything it reads and fails
with the file and name on a cycle or on an input that neither a file nor the database holds.

Whether a file's views are materialised is declared, once, in its header: a comment line
``-- materialize: true`` or ``-- materialize: false`` before the first statement. A missing,
repeated or misspelt declaration fails with the file named (:class:`SqlHeaderError`).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

# The declaration line, and anything that looks like an attempt at one (to reject misspellings).
# It is a comment, which the parse tree does not keep, so it is the one thing read as text.
_MATERIALIZE = re.compile(r"^--\s*(materiali[sz]e)\s*:\s*(\S*)\s*$", re.I | re.M)
MATERIALIZE_VALUES = {"true": True, "false": False}
_CREATED_KINDS = ("view", "table", "macro", "function")


class SqlModelError(ValueError):
    """An ``sql/`` file cannot be used as a model (the message names the file)."""


class SqlHeaderError(SqlModelError):
    """A file's header lacks a valid ``-- materialize: true|false`` declaration."""


class SqlOrderError(SqlModelError):
    """The ``sql/`` files cannot be ordered: a cycle, a missing input or a double definition."""


@dataclass(frozen=True)
class SqlModel:
    """One ``sql/*.sql`` file: the names it creates, the relations it reads, every relation and
    function it uses, the views it creates (in file order) and whether its header asks for
    them materialised. All but the header come from DuckDB's own parse of the file."""

    path: Path
    defines: frozenset[str]
    reads: frozenset[str]
    uses: frozenset[str]
    views: tuple[str, ...] = ()
    materialize: bool = False
    source: str = field(default="", repr=False, compare=False)  # the text :func:`parse` read


def parse(path: Path) -> SqlModel:
    """What ``path`` defines and reads (comments and string literals ignored), and its
    ``-- materialize:`` declaration."""
    return _parse(path, path.read_text())


# Every kernel.open runs the sql/ files: their analysis and DuckDB's parse of them are done
# once per file text (together ~25 ms of a ~0.37 s warm open, benchmarks/open_kernel.py).
@functools.lru_cache(maxsize=256)
def _parse(path: Path, raw: str) -> SqlModel:
    creates = [_created(path.name, st.query) for st in _split(path.name, raw)]
    defines = frozenset(c.name for c in creates if c is not None)
    tables: set[str] = set()
    calls: set[str] = set()
    ctes: set[str] = set()
    _walk(_serialised(path.name, [c.body for c in creates if c is not None and c.body]),
          tables, calls, ctes)
    views = tuple(dict.fromkeys(c.name for c in creates if c is not None and c.kind == "view"))
    materialize = _declared_materialize(path.name, raw, views)
    reads = frozenset(tables - ctes - defines)
    return SqlModel(path, defines, reads, frozenset((reads | calls) - defines), views,
                    materialize, raw)


@dataclass(frozen=True)
class _Created:
    """What one CREATE statement makes: its kind, name, where its head ends (after ``AS``) and
    its body as a SELECT DuckDB can serialise (None for a table of column definitions)."""

    kind: str
    name: str
    head_end: int
    or_replace: bool
    temporary: bool
    body: str | None


def _split(name: str, raw: str) -> list[duckdb.Statement]:
    try:
        return list(duckdb.extract_statements(raw))
    except duckdb.Error as exc:
        raise SqlModelError(f"{name}: DuckDB cannot parse it: {exc}") from None


def _created(name: str, query: str) -> _Created | None:
    """The CREATE statement's kind, name and body, read from DuckDB's tokens; None for any
    other statement (it defines nothing)."""
    data = query.encode()  # DuckDB's token positions count bytes, not characters
    tokens = duckdb.tokenize(query)
    ends = [pos for pos, _ in tokens[1:]] + [len(data)]
    words = [(pos, kind, data[pos:end].decode().strip())
             for (pos, kind), end in zip(tokens, ends, strict=True)
             if kind != duckdb.token_type.comment]
    keywords = [w.lower() for _, kind, w in words if kind == duckdb.token_type.keyword]
    if not keywords or keywords[0] != "create":
        return None
    i = 1
    or_replace = keywords[1:3] == ["or", "replace"]
    i += 2 * or_replace
    temporary = i < len(words) and words[i][2].lower() in ("temp", "temporary")
    i += temporary
    kind = words[i][2].lower() if i < len(words) else ""
    if kind not in _CREATED_KINDS:
        raise SqlModelError(f"{name}: CREATE {kind.upper() or '?'} is not a model statement; "
                            f"a sql file creates only {', '.join(k.upper() for k in _CREATED_KINDS)}")
    i += 1
    if [w.lower() for _, _, w in words[i:i + 3]] == ["if", "not", "exists"]:
        i += 3
    created = words[i][2].strip('"').lower()
    depth, j = 0, i + 1
    while j < len(words):  # the AS that ends the head, outside any parameter list
        text = words[j][2]
        depth += text.count("(") - text.count(")")
        if depth == 0 and words[j][1] == duckdb.token_type.keyword and text.lower() == "as":
            break
        j += 1
    if j == len(words):  # CREATE TABLE t (col type, ...): reads nothing
        return _Created(kind, created, len(query), or_replace, temporary, None)
    head_end = len(data[:words[j][0] + 2].decode())
    body = query[head_end:].strip().rstrip(";")
    if kind in ("macro", "function"):
        rest = body.lstrip()
        body = rest[5:] if rest[:5].lower() == "table" else f"SELECT ({body})"
    return _Created(kind, created, head_end, or_replace, temporary, body)


_PARSER_LOCK = threading.Lock()


@functools.cache
def _parser() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()


def _serialised(name: str, selects: list[str]) -> list[Any]:
    """DuckDB's parse trees of some SELECTs, as JSON (one query for the whole file)."""
    if not selects:
        return []
    with _PARSER_LOCK:
        rows = _parser().execute("SELECT json_serialize_sql(unnest(?))", [selects]).fetchall()
    trees = [json.loads(text) for text, in rows]
    for tree in trees:
        if tree.get("error"):
            raise SqlModelError(f"{name}: DuckDB cannot parse a statement: "
                                f"{tree.get('error_message', tree)}")
    return [tree["statements"] for tree in trees]


def _walk(node: Any, tables: set[str], calls: set[str], ctes: set[str]) -> None:
    """Collect base-table references, function calls and CTE names anywhere in ``node``."""
    if isinstance(node, dict):
        if node.get("type") == "BASE_TABLE" and not node.get("schema_name"):
            tables.add(str(node["table_name"]).lower())
        if node.get("class") == "FUNCTION" and not node.get("schema"):
            calls.add(str(node["function_name"]).lower())
        for entry in node.get("cte_map", {}).get("map", ()) if isinstance(
                node.get("cte_map"), dict) else ():
            ctes.add(str(entry["key"]).lower())
        for value in node.values():
            _walk(value, tables, calls, ctes)
    elif isinstance(node, list):
        for value in node:
            _walk(value, tables, calls, ctes)


def _declared_materialize(name: str, raw: str, views: tuple[str, ...]) -> bool:
    """The header's ``-- materialize: true|false``; a clear error when it is not usable."""
    found = list(_MATERIALIZE.finditer(raw))
    allowed = "write '-- materialize: true' or '-- materialize: false' in the file's header"
    if not found:
        raise SqlHeaderError(f"{name}: no materialize declaration; {allowed}")
    if len(found) > 1:
        raise SqlHeaderError(f"{name}: materialize is declared {len(found)} times; {allowed} "
                             "once")
    m = found[0]
    header = raw[:m.start()]
    if any(line.strip() and not line.lstrip().startswith("--")
           for line in header.splitlines()):
        raise SqlHeaderError(f"{name}: the materialize declaration comes after the first "
                             f"statement; {allowed}")
    if m.group(1).lower() != "materialize" or m.group(2) not in MATERIALIZE_VALUES:
        raise SqlHeaderError(f"{name}: {m.group(0).strip()!r} is not a valid declaration; "
                             f"{allowed}")
    if MATERIALIZE_VALUES[m.group(2)] and not views:
        raise SqlHeaderError(f"{name}: declares 'materialize: true' but creates no view")
    return MATERIALIZE_VALUES[m.group(2)]


def statements(model: SqlModel, materialize: bool = True) -> list[str]:
    """The file's statements as they run (split by DuckDB's own parser).

    When the file's header declares ``materialize: true`` (and ``materialize`` is on), each
    ``CREATE OR REPLACE VIEW name AS query`` runs as ``CREATE OR REPLACE TABLE name AS query``:
    a table filled once from the view's own query, bound once. Every other statement runs as
    written. A view of a materialised file written any other way is an error naming it.
    """
    return list(_statements(model.path, model.source, model.materialize and materialize,
                            model.views))


def parsed(model: SqlModel, materialize: bool = True) -> tuple[duckdb.Statement, ...]:
    """:func:`statements`, parsed by DuckDB once per file text (a connection executes a
    parsed statement without parsing it again)."""
    return _parsed(model.path, model.source, model.materialize and materialize, model.views)


@functools.lru_cache(maxsize=256)
def _statements(path: Path, source: str, materialize: bool, views: tuple[str, ...]
                ) -> tuple[str, ...]:
    out = []
    done: set[str] = set()
    for statement in _split(path.name, source):
        text = statement.query
        c = _created(path.name, text)
        if materialize and c is not None and c.kind == "view" and c.or_replace and not (
                c.temporary):
            done.add(c.name)
            text = f'CREATE OR REPLACE TABLE "{c.name}" AS' + text[c.head_end:]
        out.append(text)
    if materialize and done != set(views):
        raise SqlHeaderError(f"{path.name}: cannot materialise "
                             f"{', '.join(sorted(set(views) - done))}: write each view as "
                             "'CREATE OR REPLACE VIEW name AS query'")
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _parsed(path: Path, source: str, materialize: bool, views: tuple[str, ...]
            ) -> tuple[duckdb.Statement, ...]:
    return tuple(parsed for text in _statements(path, source, materialize, views)
                 for parsed in duckdb.extract_statements(text))


def order(models: Iterable[SqlModel], known: Iterable[str] = ()) -> list[SqlModel]:
    """``models`` in dependency order (ties by file name).

    ``known`` names relations the database already holds (the document tables). Raises
    :class:`SqlOrderError` on a name defined by two files, a read of a relation nothing
    defines, or a cycle (the files on it are named).
    """
    models = sorted(models, key=lambda m: m.path.name)
    owner: dict[str, SqlModel] = {}
    for m in models:
        for name in m.defines:
            if name in owner:
                raise SqlOrderError(f"{m.path.name}: defines {name!r}, which "
                                    f"{owner[name].path.name} already defines")
            owner[name] = m
    have = {k.lower() for k in known}
    for m in models:
        missing = sorted(n for n in m.reads if n not in owner and n not in have)
        if missing:
            raise SqlOrderError(f"{m.path.name}: reads {', '.join(missing)}, which no sql "
                                "file defines and the database does not hold")
    deps = {m.path: {owner[w].path for w in m.uses if w in owner} - {m.path} for m in models}
    done: list[SqlModel] = []
    placed: set[Path] = set()
    pending = list(models)
    while pending:
        ready = [m for m in pending if deps[m.path] <= placed]
        if not ready:
            raise SqlOrderError("sql files depend on each other in a cycle: "
                                + ", ".join(_cycle(pending, deps)))
        m = ready[0]
        done.append(m)
        placed.add(m.path)
        pending.remove(m)
    return done


def _cycle(pending: list[SqlModel], deps: dict[Path, set[Path]]) -> list[str]:
    """One cycle among ``pending`` files, as file names, first repeated at the end."""
    left = {m.path for m in pending}
    path = [pending[0].path]
    while True:
        nxt = min(d for d in deps[path[-1]] if d in left)
        if nxt in path:
            loop = path[path.index(nxt):] + [nxt]
            return [p.name for p in loop]
        path.append(nxt)
