"""The kernel's cost laws as DuckDB scalar functions, for the ``sql/`` views.

The laws are defined once, in :mod:`kernel.model.laws`; this module registers them with the
pipeline's view loader (``pipeline.db.add_udf_installer``), so the import direction stays
pipeline <- kernel. Importing it is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb

from pipeline import db, rules

from ..model import laws

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
    "platform_capture_cap": (laws.platform_capture_cap, ["BOOLEAN"], "BIGINT"),
    "go_int_list": (laws.go_int_list, ["BIGINT[]"], "VARCHAR"),
    "latent_kind": (laws.is_latent, ["VARCHAR"], "BOOLEAN"),
    "dcp_shards_kind": (laws.dcp_shards_kv, ["VARCHAR"], "BOOLEAN"),
    "fabric_ratio": (laws.fabric_ratio, ["DOUBLE", "DOUBLE"], "DOUBLE"),
    "default_max_num_batched_tokens": (laws.default_max_num_batched_tokens,
                                       ["DOUBLE", "VARCHAR"], "BIGINT"),
    "default_max_num_seqs": (laws.default_max_num_seqs, ["DOUBLE", "VARCHAR"], "BIGINT"),
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


def _gemm_fit(served: str | None, bf16: float | None, fp8: float | None,
              nvfp4: float | None) -> dict[str, Any]:
    """``laws.dtype_fit`` for SQL as {suffix, peak}: an unknown served dtype (NULL) runs at
    bf16, an unstated peak (NULL) is no such unit, and the peak it picks stays NULL."""
    suffix, peak = laws.dtype_fit(served or "", bf16 or 0.0, fp8 or 0.0, nvfp4 or 0.0)
    stated = {"bf16": bf16, "fp8": fp8, "nvfp4": nvfp4}[suffix]
    return {"suffix": suffix, "peak": None if stated is None else peak}


def _kv_bytes_per_token(n_kv: int | None, tp: int | None, head_dim: int | None,
                        layers: int | None, cache_bytes: float | None, latent: bool | None,
                        layout: str | None) -> float | None:
    """``laws.kv_bytes_per_token`` for SQL: an unknown cache width (NULL, refused by
    90_refusals.sql) holds nothing; a missing geometry stays NULL."""
    if n_kv is None or tp is None or head_dim is None or layers is None:
        return None
    return laws.kv_bytes_per_token(n_kv, tp, head_dim, layers, cache_bytes or 0.0,
                                   bool(latent), layout or "")


def _snap_collective_width(width: int | None, measured: list[int] | None) -> int | None:
    """``laws.snap_collective_width`` for SQL: NULL where it refuses (55_collectives.sql
    says why, or prices the assumed extension)."""
    if width is None:
        return None
    try:
        return laws.snap_collective_width(width, measured or [])
    except ValueError:
        return None


def _measured_collective_widths(names: list[str] | None, op: str, chip: str) -> list[int]:
    """``laws.measured_collective_widths`` for SQL, at the registry's fp16 figures (no names:
    nothing measured)."""
    return laws.measured_collective_widths(names or [], op, chip)


def _experts_per_rank(n_experts: int, ep: int) -> dict[str, int]:
    """``laws.experts_per_rank`` for SQL as {base, heaviest}."""
    base, heaviest = laws.experts_per_rank(n_experts, ep)
    return {"base": base, "heaviest": heaviest}


def _snap_declared(width: int, declared: list[int] | None) -> int:
    """``laws.snap_declared`` for SQL: no declared width (NULL) leaves ``width`` as it is."""
    return laws.snap_declared(width, declared or [])


def _sequence_parallel_moe(backend: str | None, expert_parallel: bool | None, tp: int, dp: int,
                           sp_moe_backends: list[str] | None) -> bool:
    """``RulesPack.sequence_parallel_moe`` over the pack's ``rules`` rows (none: no backend)."""
    return rules.sequence_parallel_moe(backend or "", bool(expert_parallel), tp, dp,
                                       frozenset(sp_moe_backends or ()))


def _custom_allreduce_supports_width(tp: int, world_sizes: list[int] | None) -> bool:
    """``RulesPack.custom_allreduce_supports_width`` over the pack's ``rules`` rows."""
    return rules.custom_allreduce_supports_width(tp, frozenset(world_sizes or ()))


# Laws whose SQL form gives an absent argument a meaning: SQL name -> (law, args, result).
_NULL_AWARE: dict[str, tuple[Callable[..., Any], list[str], str]] = {
    "dtype_bytes": (_dtype_bytes, ["VARCHAR"], "DOUBLE"),
    "cache_dtype_bytes": (_cache_dtype_bytes, ["VARCHAR", "DOUBLE"], "DOUBLE"),
    "gemm_fit": (_gemm_fit, ["VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE"],
                 "STRUCT(suffix VARCHAR, peak DOUBLE)"),
    "kv_bytes_per_token": (_kv_bytes_per_token,
                           ["BIGINT", "BIGINT", "BIGINT", "BIGINT", "DOUBLE", "BOOLEAN",
                            "VARCHAR"], "DOUBLE"),
    "measured_collective_widths": (_measured_collective_widths,
                                   ["VARCHAR[]", "VARCHAR", "VARCHAR"], "BIGINT[]"),
    "experts_per_rank": (_experts_per_rank, ["BIGINT", "BIGINT"],
                         "STRUCT(base BIGINT, heaviest BIGINT)"),
    "snap_declared": (_snap_declared, ["BIGINT", "BIGINT[]"], "BIGINT"),
    "snap_collective_width": (_snap_collective_width, ["BIGINT", "BIGINT[]"], "BIGINT"),
    "sequence_parallel_moe": (_sequence_parallel_moe,
                              ["VARCHAR", "BOOLEAN", "BIGINT", "BIGINT", "VARCHAR[]"], "BOOLEAN"),
    "custom_allreduce_supports_width": (_custom_allreduce_supports_width,
                                        ["BIGINT", "BIGINT[]"], "BOOLEAN"),
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
    # the laws' constants the views name, as macros made from the Python values
    con.execute(f"CREATE OR REPLACE MACRO mla_context_chunk_max() AS "
                f"{int(laws.MLA_CONTEXT_CHUNK_MAX)}")
    con.execute("CREATE OR REPLACE MACRO declared_widths() AS "
                f"[{', '.join(str(int(w)) for w in laws.DECLARED_WIDTHS)}]")
    if "capture_sizes" not in have:  # its ceiling and stated sizes may be NULL
        con.create_function("capture_sizes", _capture_sizes,  # type: ignore[call-overload]
                            ["BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT[]", "BOOLEAN",
                             "BOOLEAN"], "BIGINT[]", null_handling="special")


db.add_udf_installer(register_laws)
