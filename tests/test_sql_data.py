"""Data tests over every embedded scenario: keys are unique, enumerations hold accepted
values, and required columns are never NULL in the resolved views."""

from __future__ import annotations

import functools

import duckdb
import pytest

from kernel import sql_laws  # noqa: F401  (installs the cost laws the views call)
from pipeline import db
from pipeline.validate_common import METHODS, ROLES

# view -> its key columns
UNIQUE = {
    "resolved_pools": ("scenario", "pool"),
    "pool_layout": ("scenario", "pool"),
    "pool_dtypes": ("scenario", "pool"),
    "pool_engine": ("scenario", "pool"),
    "pool_kv": ("scenario", "pool"),
    "evidence": ("scenario", "pool"),
    "provenance": ("scenario", "pool", "position"),
}
# view -> columns that must hold a value on every row
REQUIRED = {
    "resolved_pools": ("scenario", "pool", "role", "chip", "model", "tp", "pp", "dp"),
    "provenance": ("scenario", "pool", "name", "set", "method", "kind", "scope"),
    "evidence": ("scenario", "pool", "evidenced", "total"),
    "refusals": ("scenario", "setting", "reason"),
}
# view -> column -> accepted values ("fitted" marks a measured coefficient fitted by
# calibration, 70_provenance.sql)
ACCEPTED = {
    "provenance": {"method": {*METHODS, "fitted"}},
    "resolved_pools": {"role": set(ROLES)},
    "pools": {"role": set(ROLES)},
}


@functools.cache
def everything() -> duckdb.DuckDBPyConnection:
    con = db.load_scenarios()
    assert con.execute("SELECT count(*) FROM scenarios").fetchone()[0] == len(  # type: ignore[index]
        db.embedded_scenarios())
    return con


@pytest.mark.parametrize("view", sorted(UNIQUE))
def test_keys_are_unique(view: str) -> None:
    keys = ", ".join(UNIQUE[view])
    dupes = everything().execute(
        f"SELECT {keys}, count(*) FROM {view} GROUP BY ALL HAVING count(*) > 1").fetchall()
    assert everything().execute(f"SELECT count(*) FROM {view}").fetchone()[0] > 0  # type: ignore[index]
    assert not dupes, f"{view}: duplicate ({keys}): {dupes[:5]}"


@pytest.mark.parametrize("view", sorted(REQUIRED))
def test_required_values_are_present(view: str) -> None:
    for column in REQUIRED[view]:
        nulls = everything().execute(
            f'SELECT count(*) FROM {view} WHERE "{column}" IS NULL').fetchone()[0]  # type: ignore[index]
        assert nulls == 0, f"{view}.{column}: {nulls} NULL rows"


@pytest.mark.parametrize("view", sorted(ACCEPTED))
def test_enumerations_hold_accepted_values(view: str) -> None:
    for column, allowed in ACCEPTED[view].items():
        seen = {r[0] for r in everything().execute(
            f'SELECT DISTINCT "{column}"::VARCHAR FROM {view}').fetchall()}
        assert seen, f"{view}.{column}: no rows"
        assert seen <= allowed, f"{view}.{column}: unexpected {sorted(seen - allowed)}"


def test_every_pool_resolves_or_is_refused() -> None:
    missing = everything().execute(
        "SELECT scenario, pool FROM pools EXCEPT (SELECT scenario, pool FROM resolved_pools "
        "UNION SELECT scenario, pool FROM refusals)").fetchall()
    assert not missing, f"pools neither resolved nor refused: {missing}"
