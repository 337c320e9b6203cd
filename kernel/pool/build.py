"""Construction: documents → DuckDB → ``sql/`` views → one frozen :class:`ResolvedPool`.

``new(inputs)`` registers the documents in a database (a reused scratch one,
:mod:`pipeline.scratch`, unless a connection is given), runs every view, raises
:class:`RefusalError` for the first refusal row of the pool (the order of the Go constructor,
model.md §9.1), and reads the resolved rows into the frozen record pricing reads. Nothing in
the returned kernel refers to ``inputs`` or the database, so later changes to either do not
affect it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import duckdb

from pipeline import db, unstated
from pipeline.constants import KERNEL_ASSUMPTION_SET
from pipeline.errors import DocumentError, RefusalError
from pipeline.load import Inputs
from pipeline.scratch import scratch_db
from pipeline.validate import validate_bundle
from pipeline.validate_limits import other_pools

from ..model import caches as cache_model
from ..model.resolved import (
    Coefficients,
    CollectiveKey,
    Layout,
    MemoryMagnitudes,
    Origin,
    Override,
    Plan,
    PlannedAttention,
    PlannedCollective,
    PlannedGemm,
    PlannedLayer,
    ResolvedPool,
    StorageTier,
)
from ..model.types import Resolution
from . import sql_laws  # noqa: F401  (installs the cost laws the views call)
from .origins import catalog_origins
from .rows import from_row

__all__ = ["resolve", "refusals"]


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _check_inputs(inputs: Inputs) -> None:
    """Steps 1–4 of model.md §9.1: required documents, pool index, rules, field validation."""
    if (inputs is None or inputs.scenario is None or inputs.deployment is None
            or inputs.model is None or inputs.chip is None):
        raise RefusalError("inputs", None, "a kernel needs a scenario, a deployment, a model "
                           "graph and a chip")
    pools = inputs.deployment.pools
    if not 0 <= inputs.pool_index < len(pools):
        raise RefusalError("pool_index", inputs.pool_index,
                           f"pool index {inputs.pool_index} is outside the deployment's "
                           f"{len(pools)} pool(s)")
    if inputs.rules is None:
        raise RefusalError("engine_version", inputs.scenario.engine_version,
                           f"a kernel needs engine rules for version "
                           f"{inputs.scenario.engine_version!r}")
    # model.md §9.1 step 4: only field-layer problems refuse; rules-layer findings (which the
    # kernel's own resolution reports as refusals with its v0.31.0 reasons) and warnings are
    # ignored.
    report = validate_bundle(inputs)
    skip = {id(p) for p in other_pools(report.field, inputs.pool_index)}
    errors = [p for p in report.field if p.severity == "error" and id(p) not in skip]
    if errors:
        raise DocumentError(errors)


def refusals(con: duckdb.DuckDBPyConnection, scenario: str, pool: int) -> list[dict[str, Any]]:
    """The pool's refusal rows in constructor order (empty when it can be priced)."""
    return _rows(con, "SELECT step, setting, value, reason FROM refusals "
                 "WHERE scenario = ? AND pool = ? ORDER BY step, setting, value",
                 [scenario, pool])


# Resolutions of identical inputs (frozen documents compare by value), most recent last.
# A resolution is a pure function of the inputs, so a repeated open() of one scenario reuses
# it; refusals are not cached (they are recomputed and raised again).
_RESOLVED: dict[Inputs, tuple[ResolvedPool, Resolution]] = {}
_RESOLVED_MAX = 32


def resolve(inputs: Inputs, con: duckdb.DuckDBPyConnection | None = None
            ) -> tuple[ResolvedPool, Resolution]:
    """Resolve one pool without building a kernel (raises :class:`RefusalError`)."""
    if con is None:
        try:
            hit = _RESOLVED.get(inputs)
        except TypeError:  # an unhashable document (a caller-built list): no memo
            return _resolve(inputs, None)
        if hit is not None:
            return hit
        result = _resolve(inputs, None)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.pop(next(iter(_RESOLVED)))
        _RESOLVED[inputs] = result
        return result
    return _resolve(inputs, con)


def _resolve(inputs: Inputs, con: duckdb.DuckDBPyConnection | None
             ) -> tuple[ResolvedPool, Resolution]:
    _check_inputs(inputs)
    if con is not None:
        db.prepare(con)
        return _resolve_in(con, inputs)
    with scratch_db() as scratch:  # a reused database, left as it was found
        return _resolve_in(scratch, inputs)


def _resolve_in(con: duckdb.DuckDBPyConnection, inputs: Inputs
                ) -> tuple[ResolvedPool, Resolution]:
    key = db.register(con, inputs)
    db.run_views(con)
    pool = inputs.pool_index
    found = refusals(con, key, pool)
    if found:
        first = found[0]
        raise RefusalError(first["setting"], first["value"], first["reason"])
    return _read(con, key, pool, inputs)


def _read(con: duckdb.DuckDBPyConnection, key: str, pool: int, inputs: Inputs
          ) -> tuple[ResolvedPool, Resolution]:
    args = [key, pool]
    rows = _rows(con, "SELECT * FROM resolved_pools WHERE scenario = ? AND pool = ?", args)
    if not rows:  # pragma: no cover - a join lost the pool: a view bug, not a user error
        raise RuntimeError(f"resolution produced no row for {key!r} pool {pool}")
    r = unstated.kernel_row("resolved_pools", rows[0])  # NULL (unstated) -> the kernel's none

    layout = from_row(Layout, r)

    attention_floor_ns = int(r["attention_floor_ns"])
    by_kind: dict[str, tuple[int, float]] = {}
    for kind in ("swa", "mla", "sparse_mla"):
        rate = r[f"attn_rate_{kind}"]
        if rate is not None and rate > 0:
            floor = r[f"attn_floor_{kind}_ns"]
            by_kind[kind] = (int(floor) if floor is not None and floor > 0
                             else attention_floor_ns, float(rate))
    recurrent: dict[str, tuple[int, float]] = {}
    for kind in ("mamba2", "kda", "gdn"):
        floor, rate = r[f"rec_floor_{kind}"], r[f"rec_rate_{kind}"]
        if floor is not None and rate is not None and floor > 0 and rate > 0:
            recurrent[kind] = (int(floor), float(rate))
    coefficients = from_row(Coefficients, r, attention_by_kind=by_kind, recurrent=recurrent)

    collectives = {(c["op"], c["group"]): from_row(
                       CollectiveKey, c, knot_bytes=tuple(float(b) for b in c["knot_bytes"] or ()),
                       knot_ns=tuple(int(n) for n in c["knot_ns"] or ()))
                   for c in _rows(con, "SELECT * FROM collective_keys WHERE scenario = ? "
                                  "AND pool = ? ORDER BY key_order", args)}

    plan = _plan(con, args, r)

    memory = from_row(MemoryMagnitudes, r)

    wanted = {d.name for d in inputs.devices if d is not None}
    tiers = {
        t["device"]: StorageTier(name=t["device"], read_bps=t["read_bandwidth_mb_s"] * 1e6,
                                 write_bps=t["write_bandwidth_mb_s"] * 1e6,
                                 latency_s=t["base_latency_us"] * 1e-6)
        for t in _rows(con, "SELECT * FROM storage_devices ORDER BY device", [])
        if t["device"] in wanted}

    provenance = tuple(
        from_row(Origin, p) for p in _rows(con, "SELECT name, set, method, scope FROM "
                                           "provenance WHERE scenario = ? AND pool = ? "
                                           "ORDER BY position", args)
    ) + catalog_origins(inputs)
    assumptions = tuple(o for o in provenance if o.set == KERNEL_ASSUMPTION_SET)
    overrides = tuple(
        from_row(Override, o) for o in _rows(con, "SELECT * FROM pool_overrides WHERE "
                                             "scenario = ? AND pool = ? ORDER BY seq", args))

    resolved = from_row(
        ResolvedPool, r, tables=_typed_tables(con, args), layout=layout,
        coefficients=coefficients, collectives=collectives, plan=plan, memory=memory,
        tiers=tiers, provenance=provenance, overrides=overrides, assumptions=assumptions,
        caches=None)
    if inputs.stated_caches:
        resolved = replace(resolved, caches=cache_model.state_caches(
            plan, resolved.kv_bytes_per_token, resolved.kv_layers, resolved.block_size,
            resolved.recurrent_cache_mode, layout.tp, resolved.cache_bytes))

    resolution = Resolution(
        tensor_parallel_width=max(layout.tp, 1), data_parallel_width=max(layout.dp, 1),
        expert_parallel_width=max(layout.expert_width, 1),
        all_reduce_backend="custom" if layout.custom_all_reduce else "nccl",
        async_scheduling=resolved.async_scheduling,
        cascade_attention=resolved.cascade_attention,
        sequence_parallel_moe=layout.sequence_parallel_moe, overrides=overrides)
    return resolved, resolution


def _typed_tables(con: duckdb.DuckDBPyConnection, args: list[Any]) -> dict[str, Any]:
    """The pool's typed provenance, resolved row and evidence as Arrow tables (kept on the
    kernel for ``provenance_frame()`` / ``resolved_frame()`` / ``evidence()``, so a saved
    kernel answers too; pricing never reads them)."""
    def table(sql: str) -> Any:
        return con.sql(sql, params=args).to_arrow_table()

    return {
        "provenance": table("SELECT * EXCLUDE (scenario, pool) FROM provenance "
                            "WHERE scenario = ? AND pool = ? ORDER BY position"),
        "resolved": table("SELECT * FROM resolved_pools WHERE scenario = ? AND pool = ?"),
        "evidence": table("SELECT evidenced, total, assumed_names FROM evidence "
                          "WHERE scenario = ? AND pool = ?"),
        "overrides": table("SELECT * EXCLUDE (scenario, pool) FROM pool_overrides "
                           "WHERE scenario = ? AND pool = ? ORDER BY seq"),
    }


def _plan(con: duckdb.DuckDBPyConnection, args: list[Any], r: dict[str, Any]) -> Plan:
    gemms: dict[str, list[PlannedGemm]] = {}
    for g in _rows(con, "SELECT * FROM plan_gemms WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, gemm_index", args):
        gemms.setdefault(g["layer_kind"], []).append(from_row(PlannedGemm, g))
    attentions: dict[str, list[PlannedAttention]] = {}
    for a in _rows(con, "SELECT * FROM plan_attentions WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, attention_index", args):
        attentions.setdefault(a["layer_kind"], []).append(from_row(PlannedAttention, a))
    collectives: dict[str, list[PlannedCollective]] = {}
    for c in _rows(con, "SELECT * FROM plan_collectives WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, collective_index", args):
        collectives.setdefault(c["layer_kind"], []).append(from_row(PlannedCollective, c))
    layers: list[PlannedLayer] = []
    head: PlannedLayer | None = None
    for p in _rows(con, "SELECT * FROM plan_layers WHERE scenario = ? AND pool = ? "
                   "ORDER BY position", args):
        kind = p["layer_kind"]
        layer = from_row(PlannedLayer, p, dense_gemms=tuple(gemms.get(kind, ())),
                         attentions=tuple(attentions.get(kind, ())),
                         collectives=tuple(collectives.get(kind, ())))
        if p["is_head"]:
            head = layer
        else:
            layers.append(layer)
    if head is None:  # pragma: no cover - plan_layers always has a head row
        head = PlannedLayer(kind_id="__head__", count=1)
    return from_row(Plan, r, layers=tuple(layers), head=head)
