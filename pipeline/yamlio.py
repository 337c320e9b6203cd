"""Strict YAML reading with Go yaml.v3 scalar semantics.

PyYAML resolves scalars by YAML 1.1 rules (``7.0e3`` is a string, ``yes`` is a bool). The
reference decodes with Go's yaml.v3, which resolves by the target field's type. So this module
composes the node tree and keeps every scalar as text plus whether it was quoted; the schema
decoder (:mod:`pipeline.decode`) turns text into the type the field declares. Duplicate mapping
keys are an error, as in yaml.v3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import safe_output
from .errors import DocumentError, Problem


@dataclass(frozen=True)
class Scalar:
    """A YAML scalar as written: its text, whether it was quoted, and where it stands."""

    text: str
    quoted: bool
    line: int
    is_null: bool = False


@dataclass
class Mapping:
    """A YAML mapping with its keys in order and the line of each key."""

    items: dict[str, Tree]
    key_lines: dict[str, int]
    line: int


@dataclass
class Sequence:
    items: list[Tree]
    line: int


Tree = Scalar | Mapping | Sequence

_NULLS = {"", "~", "null", "Null", "NULL"}
_QUOTED = {"'", '"', "|", ">"}
# libyaml's composer when available (about 5x faster on the large coefficient sets).
_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):
    """The composer without YAML 1.1 tag resolution: a scalar's type comes from the field it
    fills (:mod:`pipeline.decode`), so the resolver's regular expressions, run on every node,
    decided nothing (they were a seventh of reading a scenario's documents)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        return ""

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None


_LOADER = _Loader
# Aliases may add at most this many nodes to a document once expanded (the embedded data
# uses none; a billion-laughs document would add ~10^9), and no document nests deeper.
MAX_ALIAS_NODES = 100_000
MAX_DEPTH = 200
# Size bounds (docs/decisions.md RL4): a document's bytes are checked before it is read, a
# scalar's once libyaml has composed the nodes (linear, milliseconds per MB) and before
# anything decodes, copies or resolves it. The largest embedded document is 0.24 MB, its
# longest scalar under 1 KB; a scalar copied into every resolution row is what made a 4 MB
# name cost gigabytes. Raise them with --max-document-bytes / --max-scalar-bytes or
# :func:`set_limits`.
DEFAULT_MAX_DOCUMENT_BYTES = 16 << 20
DEFAULT_MAX_SCALAR_BYTES = 64 << 10
_LIMITS = {"document": DEFAULT_MAX_DOCUMENT_BYTES, "scalar": DEFAULT_MAX_SCALAR_BYTES}


def set_limits(max_document_bytes: int | None = None, max_scalar_bytes: int | None = None
               ) -> tuple[int, int]:
    """Set the document and scalar size limits (None keeps one); returns the previous pair."""
    before = (_LIMITS["document"], _LIMITS["scalar"])
    for key, value in (("document", max_document_bytes), ("scalar", max_scalar_bytes)):
        if value is not None:
            if int(value) < 1:
                raise ValueError(f"the {key} size limit must be at least 1 byte, got {value}")
            _LIMITS[key] = int(value)
    return before


def limits() -> tuple[int, int]:
    """The (document, scalar) size limits in bytes."""
    return _LIMITS["document"], _LIMITS["scalar"]


def _too_big(file: str, what: str, size: int, limit: int, option: str, line: int = 0
             ) -> DocumentError:
    return DocumentError(Problem(file, "", f"{what} is {size:,} bytes, over the limit of "
                                 f"{limit:,} bytes ({option} N raises it)", line=line))


def _check_scalars(node: yaml.Node, file: str, limit: int) -> None:
    """Refuse a scalar (or mapping key) longer than ``limit`` characters, by the nodes."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            size = len(n.value)
            if size > limit and len(n.value.encode("utf-8", "surrogatepass")) > limit:
                raise _too_big(file, "a YAML scalar", len(n.value.encode("utf-8",
                                                                          "surrogatepass")),
                               limit, "--max-scalar-bytes", n.start_mark.line + 1)
        else:
            stack.extend(_children(n))


class _Unusual(Exception):
    """Raised by :func:`_convert_fast` at anything :func:`_convert` would refuse."""


_SCALAR, _SEQUENCE, _MAPPING = yaml.ScalarNode, yaml.SequenceNode, yaml.MappingNode


def _convert_fast(node: Any) -> Tree:
    """:func:`_convert` of a well-formed tree, without building the key path of every node
    (only a message needs it): anything unusual raises :class:`_Unusual`, and the caller
    converts again with :func:`_convert`, which says what is wrong and where."""
    kind = type(node)
    if kind is _SCALAR:
        text = node.value
        quoted = node.style in _QUOTED
        return Scalar(text, quoted, node.start_mark.line + 1, (not quoted) and text in _NULLS)
    if kind is _SEQUENCE:
        return Sequence([_convert_fast(n) for n in node.value], node.start_mark.line + 1)
    if kind is _MAPPING:
        items: dict[str, Tree] = {}
        key_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if type(key_node) is not _SCALAR:
                raise _Unusual
            key = key_node.value
            if key == "<<" or key in items:
                raise _Unusual
            items[key] = _convert_fast(value_node)
            key_lines[key] = key_node.start_mark.line + 1
        return Mapping(items, key_lines, node.start_mark.line + 1)
    raise _Unusual


def _convert_document(node: yaml.Node, file: str) -> Tree:
    try:
        return _convert_fast(node)
    except _Unusual:
        return _convert(node, file, "")


def _convert(node: yaml.Node, file: str, path: str) -> Tree:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        quoted = node.style in _QUOTED
        is_null = (not quoted) and node.value in _NULLS
        return Scalar(node.value, quoted, line, is_null)
    if isinstance(node, yaml.SequenceNode):
        return Sequence(
            [_convert(n, file, f"{path}[{i}]") for i, n in enumerate(node.value)], line
        )
    if isinstance(node, yaml.MappingNode):
        items: dict[str, Tree] = {}
        key_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise DocumentError(
                    Problem(file, path, "a mapping key must be a plain scalar", line=line)
                )
            key = key_node.value
            key_path = f"{path}.{key}" if path else key
            if key == "<<":
                raise DocumentError(
                    Problem(file, key_path, "YAML merge keys are not accepted; write the keys out",
                            line=key_node.start_mark.line + 1)
                )
            if key in items:
                raise DocumentError(
                    Problem(file, key_path,
                            f"duplicate key {key!r} (first at line {key_lines[key]})",
                            line=key_node.start_mark.line + 1)
                )
            items[key] = _convert(value_node, file, key_path)
            key_lines[key] = key_node.start_mark.line + 1
        return Mapping(items, key_lines, line)
    raise DocumentError(Problem(file, path, f"unsupported YAML node {type(node).__name__}"))


def _expanded_size(root: yaml.Node, file: str) -> int:
    """Nodes the tree has once every alias is expanded, counted without expanding (each
    distinct node once, memoised); an alias that contains itself is an error."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: a deep document must not exhaust Python's stack here.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise DocumentError(Problem(file, "", "a YAML alias refers to a node that contains "
                                        "it (a recursive document)",
                                        line=node.start_mark.line + 1))
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise DocumentError(Problem(file, "", "a YAML alias refers to a node that "
                                            "contains it (a recursive document)",
                                            line=child.start_mark.line + 1))
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _depth(node: yaml.Node) -> int:
    best, stack = 0, [(node, 1)]
    seen: set[int] = set()
    while stack:
        n, d = stack.pop()
        best = max(best, d)
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend((c, d + 1) for c in _children(n))
    return best


def _tree_depth(node: yaml.Node) -> int:
    """Depth of a document without aliases (no node is reached twice), level by level."""
    depth, level = 0, [node]
    while level and depth <= MAX_DEPTH:
        depth += 1
        below: list[yaml.Node] = []
        for n in level:
            if isinstance(n, yaml.SequenceNode):
                below.extend(n.value)
            elif isinstance(n, yaml.MappingNode):
                for pair in n.value:
                    below.extend(pair)
        level = below
    return depth


def _check_size(node: yaml.Node, file: str, aliases: bool = True) -> None:
    """Bound what aliases may add (a billion-laughs document is refused before expanding).

    ``aliases=False`` (the text has no ``&``, so no anchor and no alias) skips the two walks
    that only aliases can make differ: they were most of the time of loading a scenario."""
    if (_depth(node) if aliases else _tree_depth(node)) > MAX_DEPTH:
        raise DocumentError(Problem(file, "", f"the document nests deeper than {MAX_DEPTH} "
                                    "levels; documents are at most that deep",
                                    line=node.start_mark.line + 1))
    if not aliases:
        return
    distinct = len({id(n) for n in _walk_distinct(node)})
    expanded = _expanded_size(node, file)
    if expanded - distinct > MAX_ALIAS_NODES:
        raise DocumentError(Problem(file, "", f"YAML aliases expand the document to {expanded:,} "
                                    f"nodes from {distinct:,} written; aliases may add at most "
                                    f"{MAX_ALIAS_NODES:,} nodes", line=node.start_mark.line + 1))


def _walk_distinct(node: yaml.Node) -> list[yaml.Node]:
    out, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(_children(n))
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def read_documents(path: str | Path, text: str | None = None) -> list[Tree]:
    """Every YAML document in a file, as trees of :class:`Scalar`/:class:`Mapping`/:class:`Sequence`."""
    file = str(path)
    safe_output.note_read("the document", path)
    max_doc, max_scalar = limits()
    if text is None:
        try:  # the size first: a huge file is refused before a byte of it is read
            size = os.stat(path).st_size
        except OSError:
            size = 0
        if size > max_doc:
            raise _too_big(file, "the document file", size, max_doc, "--max-document-bytes")
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise DocumentError(Problem(file, "", f"cannot read the file: "
                                        f"{exc.strerror or exc}")) from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(Problem(file, "", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                        f"at offset {exc.start}); a document is UTF-8 YAML"
                                        )) from None
    if len(text) > max_doc and len(text.encode("utf-8", "surrogatepass")) > max_doc:
        raise _too_big(file, "the document text", len(text.encode("utf-8", "surrogatepass")),
                       max_doc, "--max-document-bytes")
    if "\x00" in text:
        raise DocumentError(Problem(file, "", "a binary file (it holds NUL bytes); a document "
                                    "is UTF-8 YAML text"))
    try:
        nodes = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError(Problem(file, "", f"not valid YAML: {_one_line(problem)}",
                                    line=line)) from None
    except RecursionError:
        raise DocumentError(Problem(file, "", f"the document nests too deeply; documents are "
                                    f"at most {MAX_DEPTH} levels deep")) from None
    for n in nodes:
        if n is not None:
            _check_size(n, file, aliases="&" in text)
            if len(text) > max_scalar // 4:  # (no scalar can be longer than its text)
                _check_scalars(n, file, max_scalar)
    docs = [_convert_document(n, file) for n in nodes if n is not None]
    if not docs:
        raise DocumentError(Problem(file, "", "the file holds no YAML document"))
    return docs


def to_plain(tree: object) -> object:
    """The tree as plain Python values, scalars as their text (for messages and tests)."""
    if isinstance(tree, Scalar):
        return None if tree.is_null else tree.text
    if isinstance(tree, Mapping):
        return {k: to_plain(v) for k, v in tree.items.items()}
    if isinstance(tree, Sequence):
        return [to_plain(v) for v in tree.items]
    return tree
