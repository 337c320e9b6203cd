"""Helpers for the resolution tests: embedded inputs, variants, one-database batches."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import duckdb

from kernel.pool import build
from pipeline import db
from pipeline.documents import CoefficientEntry, CoefficientSet, Scope
from pipeline.load import Inputs, open_inputs

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
GLM5 = "glm5-h200-tp8"
MM25 = "minimax-m25-h200-tp8"
MM25_EP16 = "minimax-m25-h200-ep16"
GPTOSS = "gpt-oss-120b-h200-fp4-vllm-tp8"
KIMI = "kimi-k3-h100-nospec"
NEMOTRON = "nemotron3-ultra-h100-agg"
DSV4 = "deepseek-v4-pro-b200-fp4-vllm-tp8"
PD = "deepseek-v3-h200-1p1d"


@functools.cache
def inputs(name: str, pool: int = 0) -> Inputs:
    """The embedded scenario's inputs (loaded once per test session; documents are frozen)."""
    return open_inputs(name, None, pool)


def variant(base: Inputs, name: str | None = None, *, engine: dict[str, Any] | None = None,
            parallel: dict[str, Any] | None = None, pool: dict[str, Any] | None = None,
            cluster: dict[str, Any] | None = None, deployment: dict[str, Any] | None = None,
            scenario: dict[str, Any] | None = None, **fields: Any) -> Inputs:
    """``base`` with its pool / engine / parallel / cluster / scenario fields replaced."""
    dep = base.deployment
    pools = list(dep.pools)
    p = pools[base.pool_index]
    if engine:
        p = replace(p, engine=replace(p.engine, **engine))
    if parallel:
        p = replace(p, parallel=replace(p.parallel, **parallel))
    if pool:
        p = replace(p, **pool)
    pools[base.pool_index] = p
    dep = replace(dep, pools=tuple(pools), **(deployment or {}))
    scen = base.scenario
    if cluster:
        scen = replace(scen, cluster=replace(scen.cluster, **cluster))
    if scenario:
        scen = replace(scen, **scenario)
    if name:
        scen = replace(scen, name=name)
    return replace(base, scenario=scen, deployment=dep, **fields)


def nodes(base: Inputs, n: int) -> Inputs:
    """``base`` spread over ``n`` nodes of the pool and cluster (with an IB fabric if n > 1)."""
    if n <= 1:
        return base
    fabric = base.fabric or inputs(MM25_EP16).fabric
    out = variant(base, pool={"nodes": n}, cluster={"nodes": n, "fabric": fabric.name})
    return replace(out, fabric=fabric)


def with_entries(base: Inputs, entries: list[CoefficientEntry], set_name: str = "test-extra"
                 ) -> Inputs:
    """``base`` with one more coefficient set (applied last, so it wins)."""
    extra = CoefficientSet(kind="CoefficientSet", name=set_name, coefficients=tuple(entries))
    scen = replace(base.scenario, coefficients=(*base.scenario.coefficients, set_name))
    return replace(base, scenario=scen, coefficients=(*base.coefficients, extra))


def entry(name: str, value: float, method: str = "measured", hardware: tuple[str, ...] = (),
          units: str = "dimensionless") -> CoefficientEntry:
    return CoefficientEntry(name=name, value=value, units=units, method=method,
                            scope=Scope(hardware=hardware),
                            rationale="test entry" if method != "measured" else "")


def widened_collectives(base: Inputs, width: int = 16, chip: str = "h200",
                        from_width: int = 8) -> Inputs:
    """Add a ``width``-rank copy of every ``from_width``-rank collective triple for ``chip``."""
    suffix = f"_fp16_{from_width}rank_{chip.replace('-', '_')}"
    extra = []
    for cset in base.coefficients:
        for e in cset.coefficients:
            if e.name.startswith("collective_") and e.name.endswith(suffix):
                extra.append(replace(e, name=e.name.replace(f"_{from_width}rank_",
                                                            f"_{width}rank_")))
    return with_entries(base, extra, f"test-collectives-{width}")


def without(base: Inputs, predicate: Any) -> Inputs:
    """``base`` with every coefficient entry for which ``predicate(entry)`` holds removed."""
    sets = tuple(replace(s, coefficients=tuple(e for e in s.coefficients if not predicate(e)))
                 for s in base.coefficients)
    return replace(base, coefficients=sets)


def refusal(inp: Inputs) -> dict[str, Any] | None:
    """The first refusal row for the pool, computed without field validation."""
    con = db.open_db(apply=False)
    key = db.register(con, inp)
    db.apply_views(con)
    rows = build.refusals(con, key, inp.pool_index)
    return rows[0] if rows else None


def batch(variants: dict[str, Inputs]) -> duckdb.DuckDBPyConnection:
    """Register every variant (named by its key) in one database and apply the views once."""
    con = db.open_db(apply=False)
    for key, inp in variants.items():
        db.register(con, variant(inp, key))
    db.apply_views(con)
    return con


def query(con: duckdb.DuckDBPyConnection, sql: str, *params: Any) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def first_refusals(variants: dict[str, Inputs]) -> dict[str, dict[str, Any] | None]:
    """Resolve every variant in one database; the first refusal row of each (None: starts).

    Variants sharing a catalog document name must share its content (one name, one
    document); resolve variants of a changed chip in a separate batch.
    """
    con = batch(variants)
    out: dict[str, dict[str, Any] | None] = {}
    for key, inp in variants.items():
        rows = build.refusals(con, key, inp.pool_index)
        out[key] = rows[0] if rows else None
    return out


def unstated(base: Inputs, *engine_keys: str) -> Inputs:
    """``base`` with ``engine_keys`` left out of its pool's engine block, as a document that
    never states them reads: the zero value, and no source line saying where they were stated
    (a *stated* 0 is refused, decision RL9)."""
    zero = {k: type(getattr(base.pool.engine, k))() for k in engine_keys}
    out = variant(base, engine=zero)
    ends = tuple(f"engine.{k}" for k in engine_keys)
    sources = {name: replace(loaded, lines={path: n for path, n in loaded.lines.items()
                                            if not path.endswith(ends)})
               for name, loaded in out.sources.items()}
    return replace(out, sources=sources)

