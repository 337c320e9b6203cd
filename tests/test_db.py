"""The resolution database: tables, idempotent loading, many scenarios at once, the CLI."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kernel.cli import cli
from kernel.facade import factory
from pipeline import db
from pipeline.errors import DocumentError
from pipeline.load import Repos
from pipeline.normalise import SCHEMAS
from tests.resolution_support import DS3, GLM5, KIMI, inputs, query

DOCUMENT_TABLES = sorted(SCHEMAS)
DERIVED = ["pool_layout", "plan_layers", "collective_keys", "resolved_pools", "provenance",
           "evidence", "refusals", "pool_overrides", "pool_assumptions"]


def snapshot(con, tables):
    return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall()))
            for t in tables}


@functools.cache
def everything():
    """Every embedded scenario in one database."""
    return db.load_scenarios()


def test_loading_twice_gives_identical_tables():
    con = db.open_db(apply=False)
    for name in (DS3, GLM5):
        db.register(con, inputs(name))
    db.apply_views(con)
    first = snapshot(con, DOCUMENT_TABLES + DERIVED)
    for name in (GLM5, DS3):
        db.register(con, inputs(name))
    db.apply_views(con)
    assert snapshot(con, DOCUMENT_TABLES + DERIVED) == first
    other = db.load_scenarios([DS3, GLM5])  # a fresh database, loaded from files
    assert snapshot(other, DOCUMENT_TABLES + DERIVED) == first


def test_many_scenarios_share_catalog_rows():
    con = db.load_scenarios([DS3, GLM5, KIMI])
    assert [r[0] for r in con.execute("SELECT scenario FROM scenarios ORDER BY 1").fetchall()] \
        == sorted([DS3, GLM5, KIMI])
    chips = con.execute("SELECT chip, count(*) FROM chips GROUP BY chip ORDER BY chip").fetchall()
    assert chips == [("h100", 1), ("h200", 1)]  # one row per chip, though two use h200
    sets = con.execute("SELECT count(DISTINCT set), count(*) FROM coefficients").fetchall()[0]
    one = con.execute("SELECT count(*) FROM coefficients WHERE set = 'cost-model-collectives'"
                      ).fetchall()[0][0]
    # the scenarios' six sets, plus the measured layer's four families for each of the two
    # chips (decisions AC1, AC4, AC9, MO1); the reference's pricing loads the six alone
    assert sets[0] == 6 + 4 * 2 and one == 480
    ref = db.load_scenarios([DS3, GLM5, KIMI], Repos(pricing="reference"))
    assert ref.execute("SELECT count(DISTINCT set) FROM coefficients").fetchall()[0][0] == 6
    pools = con.execute("SELECT scenario, pool FROM resolved_pools ORDER BY 1").fetchall()
    assert pools == [(n, 0) for n in sorted([DS3, GLM5, KIMI])]


def test_conflicting_document_under_one_name():
    con = db.open_db(apply=False)
    db.register(con, inputs(DS3))
    changed = replace(inputs(GLM5), chip=replace(inputs(GLM5).chip, sm_count=1))
    with pytest.raises(DocumentError, match="chip 'h200' is already in the database"):
        db.register(con, changed)


def test_every_embedded_scenario_at_once():
    con = everything()
    scenarios = {r[0] for r in con.execute("SELECT scenario FROM scenarios").fetchall()}
    assert len(scenarios) == len(db.embedded_scenarios()) >= 10
    pools = con.execute("SELECT count(*) FROM pools").fetchall()[0][0]
    # every pool is either resolved cleanly or refused with a reason, never neither
    refused = {tuple(r) for r in con.execute("SELECT DISTINCT scenario, pool FROM refusals")
               .fetchall()}
    resolved = {tuple(r) for r in con.execute("SELECT scenario, pool FROM resolved_pools")
                .fetchall()}
    assert len(resolved) == pools and refused <= resolved
    # cross-scenario query: registry coefficients whose method is `assumed`, per chip
    rows = query(con, """
        SELECT l.chip, count(DISTINCT p.name) AS assumed
        FROM provenance p JOIN pool_layout l USING (scenario, pool)
        WHERE p.method = 'assumed' AND p.set <> 'blis-latency-kernel'
        GROUP BY l.chip ORDER BY l.chip""")
    assert rows and all(r["assumed"] > 0 for r in rows)
    assert {"h100", "h200"} <= {r["chip"] for r in rows}
    # every scenario names engine 0.29.0, so each pool records the engine_version assumption
    n = con.execute("SELECT count(*) FROM provenance WHERE name = 'engine_version'").fetchall()
    assert n[0][0] == pools


def test_views_match_new_for_each_embedded_pool():
    con = everything()
    for key, in con.execute("SELECT DISTINCT scenario FROM resolved_pools WHERE scenario IN "
                            "(?, ?) ORDER BY 1", [DS3, GLM5]).fetchall():
        kernel = factory.new(inputs(key))
        (row,) = query(con, "SELECT kv_bytes_per_token, capture_tokens, block_size FROM "
                       "resolved_pools WHERE scenario = ?", key)
        r = kernel.resolved_pool
        assert (r.kv_bytes_per_token, r.capture_tokens, r.block_size) == (
            row["kv_bytes_per_token"], row["capture_tokens"], row["block_size"])


def test_apply_views_is_idempotent():
    con = db.load_scenarios([DS3])
    before = snapshot(con, DERIVED)
    db.apply_views(con)
    assert snapshot(con, DERIVED) == before


def test_cli_sql_and_exports(tmp_path):
    runner = CliRunner()
    path = tmp_path / "r.db"
    out = tmp_path / "q.json"
    db.load_scenarios([DS3], con=db.open_db(path)).close()  # the Python API's writable path
    res = runner.invoke(cli, ["sql", "SELECT scenario, tp FROM pool_layout",
                              "--db", str(path), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == [{"scenario": DS3, "tp": 8}]
    again = runner.invoke(cli, ["sql", "SELECT count(*) AS n FROM scenarios", "--db", str(path)])
    assert again.exit_code == 0 and "1" in again.output  # the file as it is: one scenario
    for cmd, fmt in (("resolved", "parquet"), ("provenance", "csv"), ("evidence", "json")):
        target = tmp_path / f"{cmd}.{fmt}"
        res = runner.invoke(cli, [cmd, "-s", DS3, "--format", fmt, "-o", str(target)])
        assert res.exit_code == 0, res.output
        assert target.stat().st_size > 0
    table = runner.invoke(cli, ["provenance", "-s", GLM5])
    assert table.exit_code == 0 and "blis-latency-kernel" in table.output
    bad = runner.invoke(cli, ["sql", "SELECT nope FROM nowhere", "--scenario", DS3])
    assert bad.exit_code != 0
    refused = runner.invoke(cli, ["resolved", "-s", "minimax-m25-h200-ep16", "--no-assumed-widths"])
    assert refused.exit_code == 1 and "no 16-rank all_reduce measurement" in refused.output
