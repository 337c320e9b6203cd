"""Resolved rows → the frozen records of :mod:`kernel.model.resolved`, one rule for every field.

A record field is read from the row column of the same name (or the one its
``pipeline.arrow_schema.column(name)`` metadata names) and converted to the field's declared
type (``int``, ``float``, ``bool``, ``str``); the fields a caller builds itself (nested
records, dicts) are passed in. So a field added to a resolved record and to the SQL row needs
no edit here. A NULL is an error naming the column: a column that may be NULL ("unstated")
is declared once, with the value the records hold instead, and replaced before the row is read
here (``kernel.pool.build`` does that for ``resolved_pools``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pipeline.arrow_schema import column_name

T = TypeVar("T")

# The annotation text of a scalar field (resolved.py uses postponed annotations) → conversion.
_CONVERT: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool,
                                             "str": lambda v: v}


@functools.cache
def _plan(cls: Any) -> tuple[tuple[str, str, str, Callable[[Any], Any] | None], ...]:
    """(field, column, annotation, conversion or None when the caller must supply it)."""
    out = []
    for f in dataclasses.fields(cls):
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        out.append((f.name, column_name(f), annotation, _CONVERT.get(annotation)))
    return tuple(out)


def from_row(cls: type[T], row: Mapping[str, Any], **given: Any) -> T:
    """A ``cls`` record from ``row``: each scalar field not in ``given`` is read from its
    column; every other field must be in ``given``."""
    kwargs = dict(given)
    plan: Any = _plan  # functools.cache wants a Hashable; a class is one
    for name, column, annotation, convert in plan(cls):
        if name in given:
            continue
        if convert is None:
            raise TypeError(f"{cls.__name__}.{name} ({annotation}) is not a scalar column: "
                            "pass it to from_row")
        if column not in row:
            raise KeyError(f"{cls.__name__}.{name}: the row has no column {column!r}")
        value = row[column]
        if value is None:
            raise ValueError(f"{cls.__name__}.{name}: column {column!r} is NULL, but a "
                             f"resolved {annotation} is needed")
        kwargs[name] = convert(value)
    return cls(**kwargs)
