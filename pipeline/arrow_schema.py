"""Arrow columns derived from the document dataclasses: one definition of each table's shape.

A document table is a list of *parts*: key columns the caller supplies (the scenario key, a
position), and the columns of a record, found by walking a dataclass's fields. A field's type
hint gives the Arrow type (``str`` → string, ``int`` → int64, ``float`` → float64, ``bool`` →
bool, ``X | None`` → X's type, ``tuple[T, ...]`` → list of T); a nested record is flattened
into its parent's row. The few fields tabled another way say so in their metadata with
:func:`column` (a different column name, a prefix, rows in a child table, a count, JSON text, a
field no table holds and why). So a field added to a document class is a column with no other
edit. Type hints come from the YAML decoder's per-type cache (``decode.type_hints``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from .decode import type_hints, type_shape

_META = "table"  # the field-metadata key this module reads
_UNSET: Any = object()

_SCALARS: dict[Any, pa.DataType] = {str: pa.string(), int: pa.int64(), float: pa.float64(),
                                    bool: pa.bool_()}


def column(name: str | None = None, *, prefix: str | None = None, rows: str | None = None,
           count: str | None = None, item: str | None = None, present: str | None = None,
           split: tuple[str, ...] = (), as_json: bool = False, skip: str | None = None,
           null_if_empty: bool = False, absent: Any = _UNSET) -> dict[str, Any]:
    """Field metadata saying how a document field is tabled (merge with ``decode.key`` by ``|``).

    ``name``: the column's name when it is not the field's (used as written, no prefix).
    ``prefix``: a nested record's columns are named ``prefix + field name``.
    ``rows``: the items are rows of that table (built by ``normalise``), with ``count`` naming
    a column of this row holding their number and ``item`` the child table's value column for
    a tuple of scalars. ``present``: a bool column, whether the optional field is stated (its
    contents are not tabled). ``split``: a fixed-length tuple as one column per element,
    ``name_suffix``. ``as_json``: a tuple of records as JSON text (NULL when empty). ``skip``:
    no table holds the field; say why. ``null_if_empty``: '' is stored as NULL. ``absent``:
    the value when the enclosing optional record is not stated (default: the record's own
    default).
    """
    meta: dict[str, Any] = {"name": name, "prefix": prefix, "rows": rows, "count": count,
                            "item": item, "present": present, "split": split,
                            "as_json": as_json, "skip": skip, "null_if_empty": null_if_empty}
    if absent is not _UNSET:
        meta["absent"] = absent
    return {_META: meta}


def _meta(f: dataclasses.Field[Any]) -> dict[str, Any]:
    return f.metadata.get(_META, {})


def column_name(f: dataclasses.Field[Any]) -> str:
    """The column a field is read from or written to: its declared name, else its own (a
    nested record's prefix applies only to the latter)."""
    return _meta(f).get("name") or f.name


def arrow_type(tp: Any) -> pa.DataType:
    """The Arrow type of a scalar or tuple-of-scalars field type."""
    origin, args = type_shape(tp)
    if origin in (typing.Union, types.UnionType):
        stated = [a for a in args if a is not type(None)]
        if len(stated) == 1:
            return arrow_type(stated[0])
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return pa.list_(arrow_type(args[0]))
    elif tp in _SCALARS:
        return _SCALARS[tp]
    raise TypeError(f"no Arrow column type for {tp!r}: give the field a pipeline.arrow_schema."
                    "column(...) declaration (rows=, as_json=, skip=...)")


def _record_type(tp: Any) -> Any:
    """The dataclass of a record-valued field (``R`` or ``R | None``), else None."""
    origin, args = type_shape(tp)
    if origin in (typing.Union, types.UnionType):
        stated = [a for a in args if a is not type(None)]
        return stated[0] if len(stated) == 1 and dataclasses.is_dataclass(stated[0]) else None
    return tp if dataclasses.is_dataclass(tp) else None


def _item_type(tp: Any) -> Any:
    """T of ``tuple[T, ...]`` (optionally ``| None``)."""
    origin, args = type_shape(tp)
    if origin in (typing.Union, types.UnionType):
        return _item_type(next(a for a in args if a is not type(None)))
    if origin is tuple:
        return args[0]
    raise TypeError(f"{tp!r} is not a tuple type")


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its name, Arrow type, how to read it from the row's value, and where it
    comes from (``Class.field`` of the class declaring the field, or ``key`` for a column the
    caller supplies)."""

    name: str
    type: pa.DataType
    get: Callable[[Any], Any]
    source: str


@dataclasses.dataclass(frozen=True)
class Key:
    """A column the caller supplies in each row mapping under ``name``."""

    name: str
    type: pa.DataType


@dataclasses.dataclass(frozen=True)
class Fields:
    """The columns of the ``cls`` record found under the class's name in each row mapping;
    ``start``/``stop`` (field names) take a slice of its fields, for a table that interleaves
    records."""

    cls: type
    start: str | None = None
    stop: str | None = None


@dataclasses.dataclass(frozen=True)
class Item:
    """The value column of a child table holding ``cls.field``'s scalar items (found under
    ``"Class.field"`` in each row mapping), named by the field's ``item``."""

    cls: type
    field: str


Part = Key | Fields | Item


def _chain(outer: Callable[[Any], Any], inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda obj: inner(outer(obj))


def _sub(get: Callable[[Any], Any], default: Any, absent: Any) -> Callable[[Any], Any]:
    """Read a nested record's column; when the record is None, ``absent`` or the default's."""
    if absent is _UNSET:
        return lambda rec: get(default if rec is None else rec)
    return lambda rec: absent if rec is None else get(rec)


def _walk(cls: type, prefix: str, start: str | None, stop: str | None
          ) -> list[tuple[Column, Any]]:
    """(column, the value when an enclosing optional record is absent) of ``cls``'s fields."""
    hints = type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    lo = names.index(start) if start else 0
    hi = names.index(stop) if stop else len(names)
    out: list[tuple[Column, Any]] = []
    for f in dataclasses.fields(cls)[lo:hi]:
        meta, tp = _meta(f), hints[f.name]
        get: Callable[[Any], Any] = operator.attrgetter(f.name)
        src = f"{cls.__name__}.{f.name}"
        absent = meta.get("absent", _UNSET)
        if meta.get("skip"):
            continue
        if meta.get("rows"):
            if meta.get("count"):
                out.append((Column(meta["count"], pa.int64(), _chain(get, len), src), _UNSET))
            continue
        if meta.get("present"):
            out.append((Column(meta["present"], pa.bool_(), _chain(get, _is_stated), src),
                        _UNSET))
            continue
        name = meta.get("name") or prefix + f.name
        if meta.get("split"):
            for i, suffix in enumerate(meta["split"]):
                out.append((Column(f"{name}_{suffix}", arrow_type(_item_type(tp)),
                                   _chain(get, _element(i)), src), absent))
            continue
        if meta.get("as_json"):
            out.append((Column(name, pa.string(), _chain(get, _json), src), absent))
            continue
        record = _record_type(tp)
        if record is not None:
            default, optional = record(), record is not tp
            for col, inner_absent in _walk(record, prefix + (meta.get("prefix") or ""),
                                           None, None):
                if not optional and isinstance(col.get, operator.attrgetter):
                    # a plain read through a record that is always there: one dotted getter
                    path = f"{f.name}.{_attr_path(col.get)}"
                    out.append((Column(col.name, col.type, operator.attrgetter(path),
                                       col.source), _UNSET))
                    continue
                inner = _sub(col.get, default, inner_absent)
                out.append((Column(col.name, col.type, _chain(get, inner), col.source),
                            _UNSET))
            continue
        arrow = arrow_type(tp)  # a tuple is a list value as it is
        if meta.get("null_if_empty"):
            get = _chain(get, _or_none)
        out.append((Column(name, arrow, get, src), absent))
    if stop is None:  # columns a method computes, declared by the class, after its fields
        for suffix, method in getattr(cls, "_derived_columns", ()):
            returns = typing.get_type_hints(getattr(cls, method))["return"]
            out.append((Column(prefix + suffix, arrow_type(returns),
                               operator.methodcaller(method), f"{cls.__name__}.{method}()"),
                        _UNSET))
    return out


def _attr_path(get: operator.attrgetter[Any]) -> str:
    """The dotted path of a single-attribute ``operator.attrgetter``."""
    return typing.cast(str, get.__reduce__()[1][0])


def _is_stated(value: Any) -> bool:
    return value is not None


def _element(i: int) -> Callable[[Sequence[Any] | None], Any]:
    return lambda values: None if values is None else values[i]


def _json(records: Sequence[Any] | None) -> str | None:
    """Records of scalars as a JSON list of objects (dataclasses.asdict is 10x slower)."""
    if not records:
        return None
    return json.dumps([{n: getattr(r, n) for n in _field_names(r)} for r in records])


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(record: Any) -> tuple[str, ...]:
    cls = type(record)
    if cls not in _FIELD_NAMES:
        _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(record))
    return _FIELD_NAMES[cls]


def _or_none(value: Any) -> Any:
    return value or None


@functools.cache
def record_columns(cls: type, start: str | None = None, stop: str | None = None
                   ) -> tuple[Column, ...]:
    """The columns a record of ``cls`` contributes to its row, in field order."""
    return tuple(col for col, _absent in _walk(cls, "", start, stop))


def item_column(cls: type, field: str) -> Column:
    """The value column of the child table that holds ``cls.field``'s scalar items."""
    f = next(x for x in dataclasses.fields(cls) if x.name == field)
    name = _meta(f).get("item")
    if not name:
        raise TypeError(f"{cls.__name__}.{field} declares no item column")
    return Column(name, arrow_type(_item_type(type_hints(cls)[field])), _identity,
                  f"{cls.__name__}.{field}")


def _identity(value: Any) -> Any:
    return value


@functools.cache
def part_columns(parts: tuple[Part, ...]) -> tuple[tuple[Column, ...], tuple[str, ...]]:
    """Every column of a table and, for each, the row-mapping key its value is read from."""
    cols: list[Column] = []
    roles: list[str] = []
    for part in parts:
        if isinstance(part, Key):
            cols.append(Column(part.name, part.type, _identity, "key"))
            roles.append(part.name)
        elif isinstance(part, Fields):
            found = record_columns(part.cls, part.start, part.stop)
            cols.extend(found)
            roles.extend([part.cls.__name__] * len(found))
        else:
            cols.append(item_column(part.cls, part.field))
            roles.append(f"{part.cls.__name__}.{part.field}")
    names = [c.name for c in cols]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise TypeError(f"columns {doubled} are derived twice; rename one with column(name=...)")
    return tuple(cols), tuple(roles)


def schema(parts: tuple[Part, ...]) -> pa.Schema:
    """The Arrow schema of a table made of ``parts``."""
    cols, _roles = part_columns(parts)
    return pa.schema([(c.name, c.type) for c in cols])


def table(parts: tuple[Part, ...], rows: Sequence[Mapping[str, Any]],
          arrow_schema: pa.Schema | None = None) -> pa.Table:
    """The table of ``rows``: each maps key names to values, class names to records (and
    ``"Class.field"`` to an item)."""
    cols, roles = part_columns(parts)
    values = {role: [row[role] for row in rows] for role in set(roles)}
    data = {c.name: list(map(c.get, values[role])) for c, role in zip(cols, roles, strict=True)}
    return pa.Table.from_pydict(data, schema=arrow_schema or schema(parts))
