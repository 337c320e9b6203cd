"""Decode YAML trees into frozen dataclasses, strictly, the way Go's yaml.v3 does.

The dataclass is the schema: each field's type hint says what a key must hold, and field
metadata adds the few rules that live in the decoder (a YAML key name that differs from the
field name, a key that must be present even when false, a list that must not be empty when
stated, a fixed-length pair). Every problem found is collected with its key path and source
line, so a user sees all of them at once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from typing import Any, TypeVar

from .errors import DocumentError, Problem
from .yamlio import Mapping, Scalar, Sequence, Tree

T = TypeVar("T")

_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_INT_BASED = re.compile(r"^[-+]?0(x[0-9a-fA-F_]+|o[0-7_]+|b[01_]+)$")
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INF = {".inf": math.inf, ".Inf": math.inf, ".INF": math.inf, "+.inf": math.inf,
        "+.Inf": math.inf, "+.INF": math.inf, "-.inf": -math.inf, "-.Inf": -math.inf,
        "-.INF": -math.inf}
_NAN = {".nan", ".NaN", ".NAN"}
_TRUE = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y"}
_FALSE = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N"}


def key(name: str, **meta: Any) -> dict[str, Any]:
    """Field metadata: ``yaml`` key name and decoder rules (required_present, nonempty, length)."""
    return {"yaml": name, **meta}


class _Decoder:
    def __init__(self, file: str):
        self.file = file
        self.problems: list[Problem] = []
        self.lines: dict[str, int] = {}

    def fail(self, path: str, message: str, line: int) -> None:
        self.problems.append(Problem(self.file, path, message, line=line))

    # -- scalars -------------------------------------------------------------------------
    def scalar(self, tree: Tree, path: str, what: str) -> Scalar | None:
        if isinstance(tree, Scalar):
            return tree
        kind = "a mapping" if isinstance(tree, Mapping) else "a list"
        self.fail(path, f"expected {what}, got {kind}", tree.line)
        return None

    def as_str(self, tree: Tree, path: str) -> str:
        s = self.scalar(tree, path, "a string")
        if s is None or s.is_null:
            return ""
        return s.text

    def as_int(self, tree: Tree, path: str) -> int:
        s = self.scalar(tree, path, "an integer")
        if s is None or s.is_null:
            return 0
        text = s.text.strip()
        value: int | None = None
        if not s.quoted:
            if _INT.match(text):
                value = int(text.replace("_", ""))
            elif _INT_BASED.match(text):
                value = int(text.replace("_", ""), 0)
            elif _FLOAT.match(text):
                number = float(text.replace("_", ""))
                if number.is_integer():
                    value = int(number)
        if value is None:
            self.fail(path, f"expected an integer, got {_show(s)}", s.line)
            return 0
        if not INT64_MIN <= value <= INT64_MAX:  # yaml.v3 decodes into Go's int64
            self.fail(path, f"{_show(s)} is out of range: an integer must lie within "
                      f"[-2^63, 2^63-1]", s.line)
            return 0
        return value

    def as_float(self, tree: Tree, path: str) -> float:
        s = self.scalar(tree, path, "a number")
        if s is None or s.is_null:
            return 0.0
        text = s.text.strip()
        if not s.quoted:
            if _INT.match(text) or _FLOAT.match(text):
                return float(text.replace("_", ""))
            if _INT_BASED.match(text):
                return float(int(text.replace("_", ""), 0))
            if text in _INF:
                return _INF[text]
            if text in _NAN:
                return math.nan
        self.fail(path, f"expected a number, got {_show(s)}", s.line)
        return 0.0

    def as_bool(self, tree: Tree, path: str) -> bool:
        s = self.scalar(tree, path, "true or false")
        if s is None or s.is_null:
            return False
        if not s.quoted and s.text in _TRUE:
            return True
        if not s.quoted and s.text in _FALSE:
            return False
        self.fail(path, f"expected true or false, got {_show(s)}", s.line)
        return False

    # -- structure -----------------------------------------------------------------------
    def value(self, tp: Any, tree: Tree, path: str, meta: dict[str, Any]) -> Any:
        origin, type_args = _shape(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in type_args if a is not type(None)]
            if isinstance(tree, Scalar) and tree.is_null:
                return None
            if len(args) == 1:
                return self.value(args[0], tree, path, meta)
            # str | tuple[str, ...]: a metric name or a list of them.
            if isinstance(tree, Sequence):
                seq = next(a for a in args if _shape(a)[0] is tuple)
                return self.value(seq, tree, path, meta)
            return (self.as_str(tree, path),)
        if tp is str:
            return self.as_str(tree, path)
        if tp is bool:
            return self.as_bool(tree, path)
        if tp is int:
            return self.as_int(tree, path)
        if tp is float:
            return self.as_float(tree, path)
        if origin is tuple:
            item_tp = type_args[0]
            if isinstance(tree, Scalar) and tree.is_null:
                return ()
            if not isinstance(tree, Sequence):
                self.fail(path, "expected a list", tree.line)
                return ()
            if meta.get("nonempty") and not tree.items:
                self.fail(path, "when present, must be a non-empty list", tree.line)
            if "length" in meta and len(tree.items) != meta["length"]:
                self.fail(path, f"must have exactly {meta['length']} elements, got "
                          f"{len(tree.items)}", tree.line)
            if meta.get("single_key_map"):
                return tuple(self.named_entry(item_tp, t, f"{path}[{i}]")
                             for i, t in enumerate(tree.items))
            return tuple(self.value(item_tp, t, f"{path}[{i}]", {})
                         for i, t in enumerate(tree.items))
        if origin is dict:
            item_tp = type_args[1]
            if isinstance(tree, Scalar) and tree.is_null:
                return {}
            if not isinstance(tree, Mapping):
                self.fail(path, "expected a mapping", tree.line)
                return {}
            return {k: self.value(item_tp, v, f"{path}.{k}" if path else k, {})
                    for k, v in tree.items.items()}
        if dataclasses.is_dataclass(tp):
            return self.record(tp, tree, path)
        raise TypeError(f"no decoder for {tp!r}")

    def named_entry(self, tp: Any, tree: Tree, path: str) -> Any:
        if not isinstance(tree, Mapping) or len(tree.items) != 1:
            line = tree.line
            self.fail(path, "each entry is a single-key map naming the entry", line)
            return None
        (name, body), = tree.items.items()
        return self.record(tp, body, f"{path}.{name}", name=name)

    def record(self, tp: Any, tree: Tree, path: str, name: str | None = None) -> Any:
        if isinstance(tree, Scalar) and tree.is_null:
            tree = Mapping({}, {}, tree.line)
        if not isinstance(tree, Mapping):
            self.fail(path, "expected a mapping", tree.line)
            return tp()
        hints, fields, metas, required, allow_comments, tolerate_name = _record_plan(tp)
        kwargs: dict[str, Any] = {}
        unknown = []
        for k, sub in tree.items.items():
            sub_path = f"{path}.{k}" if path else k
            self.lines[sub_path] = tree.key_lines[k]
            if allow_comments and (k == "_comment" or k.startswith("_comment_")):
                continue
            if tolerate_name and k == "name" and "name" not in fields:
                continue
            f = fields.get(k)
            if f is None:
                unknown.append(k)
                continue
            kwargs[f.name] = self.value(hints[f.name], sub, sub_path, metas[f.name])
        if unknown:
            allowed = sorted(fields)
            for k in unknown:
                self.fail(f"{path}.{k}" if path else k,
                          f"unknown key {k!r}; this document accepts {allowed}",
                          tree.key_lines[k])
        for yaml_name in required:
            if yaml_name not in tree.items:
                self.fail(f"{path}.{yaml_name}" if path else yaml_name,
                          f"missing required key {yaml_name!r}", tree.line)
        if name is not None:
            kwargs["name"] = name
        return tp(**kwargs)


# The decoder's per-type work, done once per type: resolving a dataclass's string annotations
# (typing.get_type_hints) was most of the time of loading a scenario, called once per record.


@functools.cache
def _shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """typing.get_origin and get_args of a field type."""
    return typing.get_origin(tp), typing.get_args(tp)


@functools.cache
def _record_plan(tp: Any) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]],
                                   dict[str, Any], tuple[str, ...], bool, bool]:
    """(type hints, fields by YAML key, metadata by field name, keys that must be present,
    whether ``_comment`` keys are allowed, whether a ``name`` key is tolerated) of a record."""
    hints = typing.get_type_hints(tp)
    fields = {f.metadata.get("yaml", f.name): f for f in dataclasses.fields(tp)
              if f.init and not f.metadata.get("computed")}
    metas = {f.name: dict(f.metadata) for f in fields.values()}
    required = tuple(k for k, f in fields.items() if f.metadata.get("required_present"))
    return (hints, fields, metas, required, bool(getattr(tp, "_allow_comments", False)),
            bool(getattr(tp, "_tolerate_name", False)))


def type_hints(tp: Any) -> dict[str, Any]:
    """A dataclass's resolved field types, from the decoder's per-type cache."""
    return _record_plan(tp)[0]


def type_shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(typing.get_origin(tp), typing.get_args(tp))``, cached."""
    return _shape(tp)


def _show(s: Scalar) -> str:
    return f'"{s.text}"' if s.quoted else repr(s.text)


def decode(tp: type[T], tree: Tree, file: str, path: str = "") -> tuple[T, dict[str, int]]:
    """Decode ``tree`` into ``tp``; raise :class:`DocumentError` listing every problem."""
    d = _Decoder(file)
    obj = d.record(tp, tree, path)
    if d.problems:
        raise DocumentError(d.problems)
    return obj, d.lines


def decode_map(tp: type[T], tree: Tree, file: str) -> tuple[dict[str, T], dict[str, int]]:
    """Decode a top-level mapping of name → ``tp`` (the storage-classes file)."""
    d = _Decoder(file)
    out: dict[str, T] = {}
    if not isinstance(tree, Mapping):
        raise DocumentError(Problem(file, "", "expected a mapping of storage-class names",
                                    line=tree.line))
    if not tree.items:
        raise DocumentError(Problem(file, "", "declares no storage tier", line=tree.line))
    for name, body in tree.items.items():
        if isinstance(body, Scalar) and body.is_null:
            d.fail(name, f"tier {name!r} has no device facts", tree.key_lines[name])
            continue
        d.lines[name] = tree.key_lines[name]
        out[name] = d.record(tp, body, name, name=name)
    if d.problems:
        raise DocumentError(d.problems)
    return dict(sorted(out.items())), d.lines
