"""The kernel's cost laws as DuckDB scalar functions, for the ``sql/`` views.

The laws are defined once, in :mod:`kernel.laws`; this module registers them with the
pipeline's view loader (``pipeline.db.add_udf_installer``), so the import direction stays
pipeline <- kernel. Importing it is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb

from pipeline import db

from . import laws

# Cost laws the views call, so that SQL and Python share one definition:
# SQL name -> (law, argument types, result type).
_LAWS: dict[str, tuple[Callable[..., Any], list[str], str]] = {
    "span_law": (laws.span, ["BIGINT", "BIGINT", "DOUBLE"], "DOUBLE"),
    "flat_span": (laws.flat_span, ["BIGINT", "BIGINT", "DOUBLE"], "DOUBLE"),
    "ring_span": (laws.ring_span, ["BIGINT", "BIGINT", "DOUBLE"], "DOUBLE"),
    "all2all_span": (laws.all2all_span, ["BIGINT", "BIGINT", "DOUBLE"], "DOUBLE"),
    "us_to_ns": (laws.us_to_duration_ns, ["DOUBLE"], "BIGINT"),
    "assumed_collective_figure": (laws.assumed_collective_figure,
                                  ["VARCHAR", "BIGINT", "BIGINT", "DOUBLE", "BIGINT", "DOUBLE"],
                                  "DOUBLE"),
    "mla_context_chunk": (laws.mla_context_chunk,
                          ["BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT"], "BIGINT"),
}


def _capture_sizes(seqs: int, q: int, budget: int, stated_max: int | None,
                   stated_sizes: list[int] | None, blackwell: bool,
                   decode_full: bool) -> list[int]:
    """``laws.capture_sizes`` for SQL: [] where vLLM refuses (90_refusals.sql says why).

    A stated ceiling only matters for its conflict with stated sizes, which the view checks
    itself, so it is not passed on when sizes are stated.
    """
    try:
        return laws.capture_sizes(seqs, q, budget,
                                  stated_max if stated_sizes is None else None, stated_sizes,
                                  blackwell, decode_full)
    except ValueError:
        return []


def _dtype_bytes(dtype: str | None) -> float:
    """``laws.dtype_bytes`` for SQL: 0.0 for an absent or unknown dtype (views test ``> 0``)."""
    try:
        return laws.dtype_bytes(dtype) if dtype is not None else 0.0
    except ValueError:
        return 0.0


def _cache_dtype_bytes(declared: str | None, fallback: float | None) -> float | None:
    """``laws.cache_dtype_bytes`` for SQL: NULL for a name it does not know (90_refusals.sql
    refuses it) or an auto cache over an unknown fallback; NULL declared means auto."""
    declared = declared or ""
    if not laws.known_cache_dtype(declared) or (declared in ("", "auto") and fallback is None):
        return None
    return laws.cache_dtype_bytes(declared, 0.0 if fallback is None else fallback)


# Laws whose SQL form gives an absent argument a meaning: SQL name -> (law, args, result).
_NULL_AWARE: dict[str, tuple[Callable[..., Any], list[str], str]] = {
    "dtype_bytes": (_dtype_bytes, ["VARCHAR"], "DOUBLE"),
    "cache_dtype_bytes": (_cache_dtype_bytes, ["VARCHAR", "DOUBLE"], "DOUBLE"),
}


def register_laws(con: duckdb.DuckDBPyConnection) -> None:
    """Make the kernel's cost laws callable from SQL on this connection (idempotent)."""
    have = {row[0] for row in con.execute(
        "SELECT function_name FROM duckdb_functions() WHERE function_type = 'scalar'").fetchall()}
    for name, (law, args, result) in _LAWS.items():
        if name not in have:
            con.create_function(name, law, args, result)  # type: ignore[arg-type]
    for name, (law, args, result) in _NULL_AWARE.items():
        if name not in have:
            con.create_function(name, law, args, result,  # type: ignore[call-overload]
                                null_handling="special")
    if "capture_sizes" not in have:  # its ceiling and stated sizes may be NULL
        con.create_function("capture_sizes", _capture_sizes,  # type: ignore[call-overload]
                            ["BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT[]", "BOOLEAN",
                             "BOOLEAN"], "BIGINT[]", null_handling="special")


db.add_udf_installer(register_laws)
