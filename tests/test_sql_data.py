"""Data tests over every embedded scenario: keys are unique, enumerations hold accepted
values, required columns are never NULL in the views users query (a column is optional only
where pipeline/unstated.py says so), and "unstated" is NULL there, never ''."""

from __future__ import annotations

import functools

import duckdb
import pytest

from kernel.facade import factory
from pipeline import db
from pipeline.unstated import OPTIONAL
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


def columns(view: str) -> dict[str, str]:
    return dict(everything().execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?",
        [view]).fetchall())


@pytest.mark.parametrize("view", sorted(OPTIONAL))
def test_required_values_are_present(view: str) -> None:
    """Every column not declared optional holds a value on every row of a pool that resolves
    (a refused pool may lack what it was refused for)."""
    have = columns(view)
    assert have and set(OPTIONAL[view]) <= set(have), f"{view}: optional columns it lacks"
    resolved = ("" if view == "refusals" or "pool" not in have else
                " WHERE (scenario, pool) NOT IN (SELECT scenario, pool FROM refusals)")
    for column in sorted(set(have) - set(OPTIONAL[view])):
        nulls = everything().execute(
            f'SELECT count(*) FROM {view}{resolved} AND "{column}" IS NULL' if resolved else
            f'SELECT count(*) FROM {view} WHERE "{column}" IS NULL').fetchone()[0]  # type: ignore[index]
        assert nulls == 0, f"{view}.{column}: {nulls} NULL rows, and it is not optional"


@pytest.mark.parametrize("view", sorted(OPTIONAL))
def test_unstated_text_is_null_not_empty(view: str) -> None:
    for column, kind in columns(view).items():
        if kind == "VARCHAR":
            empty = everything().execute(
                f'SELECT count(*) FROM {view} WHERE "{column}" = \'\'').fetchone()[0]  # type: ignore[index]
            assert empty == 0, f"{view}.{column}: {empty} rows hold '' (write NULL)"


def test_unstated_is_null_in_sql_and_the_kernels_none_in_python() -> None:
    """A pool stating no max_model_len, no all2all backend and no rack reads NULL in
    resolved_pools; the kernel's dataclass holds its own none (0, '') for each."""
    rows = everything().execute(
        "SELECT scenario, pool FROM resolved_pools WHERE max_model_len IS NULL "
        "AND all2all_backend IS NULL AND gpus_per_rack IS NULL AND n_half IS NULL "
        "ORDER BY ALL LIMIT 1").fetchall()
    assert rows, "no embedded pool leaves these unstated"
    scenario, pool = rows[0]
    r = factory.open_pool(scenario, None, pool).resolved_pool
    assert (r.max_model_len, r.layout.all2all_backend, r.layout.gpus_per_rack,
            r.coefficients.n_half) == (0, "", 0, 0.0)
    stated = everything().execute("SELECT count(*) FROM resolved_pools WHERE max_model_len > 0 "
                                  "AND gpus_per_rack > 0").fetchone()[0]  # type: ignore[index]
    assert stated > 0  # and a stated value stays a value


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
