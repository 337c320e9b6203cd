"""Strict YAML reading with Go yaml.v3 scalar semantics.

PyYAML resolves scalars by YAML 1.1 rules (``7.0e3`` is a string, ``yes`` is a bool). The
reference decodes with Go's yaml.v3, which resolves by the target field's type. So this module
composes the node tree and keeps every scalar as text plus whether it was quoted; the schema
decoder (:mod:`pipeline.decode`) turns text into the type the field declares. Duplicate mapping
keys are an error, as in yaml.v3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

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
# libyaml's composer when available (about 5x faster on the large coefficient sets).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _convert(node: yaml.Node, file: str, path: str) -> Tree:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        quoted = node.style in ("'", '"', "|", ">")
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


def read_documents(path: str | Path, text: str | None = None) -> list[Tree]:
    """Every YAML document in a file, as trees of :class:`Scalar`/:class:`Mapping`/:class:`Sequence`."""
    file = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise DocumentError(Problem(file, "", f"cannot read the file: {exc.strerror}")) from exc
    try:
        nodes = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError(Problem(file, "", f"not valid YAML: {problem}", line=line)) from exc
    docs = [_convert(n, file, "") for n in nodes if n is not None]
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
