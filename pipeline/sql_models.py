"""The ``sql/`` files as models: what each defines and reads, and the order to run them in.

Dependencies are derived from the SQL text rather than declared or implied by file-name
prefixes: a file defines the views, tables and macros it creates, and depends on every other
file whose definitions it mentions. ``order`` runs a file after everything it reads and fails
with the file and name on a cycle or on an input that neither a file nor the database holds.

Whether a file's views are materialised is declared, once, in its header: a comment line
``-- materialize: true`` or ``-- materialize: false`` before the first statement. A missing,
repeated or misspelt declaration fails with the file named (:class:`SqlHeaderError`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

_COMMENT = re.compile(r"--[^\n]*")
_STRING = re.compile(r"'(?:[^']|'')*'")
_DEFINE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?"
                     r"(?:VIEW|TABLE|MACRO|FUNCTION)\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.I)
# A relation read: FROM/JOIN followed by a name that is not a function call.
_READ = re.compile(r"\b(?:FROM|JOIN)\s+\"?([A-Za-z_]\w*)\"?(?!\s*\()", re.I)
# Common table expressions: `WITH name AS (`, `, name AS (`, `name(col, ...) AS (`.
_CTE = re.compile(r"(?:\bWITH\s+(?:RECURSIVE\s+)?|,\s*)([A-Za-z_]\w*)\s*(?:\([^()]*\))?\s+AS\s+"
                  r"(?:NOT\s+)?(?:MATERIALIZED\s+)?\(", re.I)
# `FROM` inside these calls is part of the call, not a relation read.
_CALL_FROM = re.compile(r"\b(?:EXTRACT|TRIM|SUBSTRING|OVERLAY|POSITION)\s*\([^()]*\)", re.I)
_WORD = re.compile(r"[A-Za-z_]\w*")
_VIEW = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\s+"
                   r"(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.I)
# A view statement's head, after any leading comments: what a materialised file turns into a
# table filled from the same query.
_VIEW_HEAD = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z))*CREATE\s+OR\s+REPLACE\s+VIEW\s+"
                        r"\"?(\w+)\"?\s+AS\b", re.I)
# The declaration line, and anything that looks like an attempt at one (to reject misspellings).
_MATERIALIZE = re.compile(r"^--\s*(materiali[sz]e)\s*:\s*(\S*)\s*$", re.I | re.M)
MATERIALIZE_VALUES = {"true": True, "false": False}


class SqlModelError(ValueError):
    """An ``sql/`` file cannot be used as a model (the message names the file)."""


class SqlHeaderError(SqlModelError):
    """A file's header lacks a valid ``-- materialize: true|false`` declaration."""


class SqlOrderError(SqlModelError):
    """The ``sql/`` files cannot be ordered: a cycle, a missing input or a double definition."""


@dataclass(frozen=True)
class SqlModel:
    """One ``sql/*.sql`` file: the names it creates, the relations it reads, every word used,
    the views it creates (in file order) and whether its header asks for them materialised."""

    path: Path
    defines: frozenset[str]
    reads: frozenset[str]
    words: frozenset[str]
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
    text = _STRING.sub("''", _COMMENT.sub("", raw))
    defines = frozenset(n.lower() for n in _DEFINE.findall(text))
    ctes = {n.lower() for n in _CTE.findall(text)}
    reads = {n.lower() for n in _READ.findall(_CALL_FROM.sub("", text))}
    words = frozenset(w.lower() for w in _WORD.findall(text))
    views = tuple(dict.fromkeys(n.lower() for n in _VIEW.findall(text)))
    materialize = _declared_materialize(path.name, raw, views)
    return SqlModel(path, defines, frozenset(reads - ctes - defines), words - defines,
                    views, materialize, raw)


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
    for statement in duckdb.extract_statements(source):
        text = statement.query
        head = _VIEW_HEAD.match(text)
        if materialize and head:
            done.add(head.group(1).lower())
            text = f'CREATE OR REPLACE TABLE "{head.group(1)}" AS' + text[head.end():]
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
    deps = {m.path: {owner[w].path for w in m.words if w in owner} - {m.path} for m in models}
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
