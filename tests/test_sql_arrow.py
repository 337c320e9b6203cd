"""SQL leaves DuckDB through Arrow with its types; exports are stamped; provenance is typed;
``sql --db`` reuses an existing resolved file (issue 14, items 1 and 3)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kernel.cli import cli
from kernel.io.stamp import read_stamp
from kernel.pool import sql_laws  # noqa: F401  (installs the cost laws the views call)
from pipeline import db

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"


@pytest.fixture(scope="module")
def db_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "r.duckdb"
    db.load_scenarios([DS3], con=db.open_db(path, apply=False)).close()
    return path


def _sql(*args: str) -> bytes:
    res = CliRunner().invoke(cli, ["sql", *args])
    assert res.exit_code == 0, res.output
    return res.stdout_bytes


def test_sql_parquet_keeps_tinyint_decimal_and_empty_result_types(db_file: Path) -> None:
    typed = ("SELECT 7::TINYINT AS t, 1.25::DECIMAL(7, 2) AS d, 'x' AS s, [1, 2] AS l "
             "FROM scenarios")
    for where, rows in (("", 1), (" WHERE false", 0)):
        raw = _sql(typed + where, "--db", str(db_file), "--format", "parquet")
        table = pq.read_table(io.BytesIO(raw))
        assert table.num_rows == rows
        assert table.schema.field("t").type == pa.int8()
        assert table.schema.field("d").type == pa.decimal128(7, 2)
        assert table.schema.field("s").type == pa.string()
        assert table.schema.field("l").type == pa.list_(pa.int32())
        if rows:
            assert table.to_pylist()[0]["t"] == 7 and str(table.to_pylist()[0]["d"]) == "1.25"


def test_sql_db_reuses_an_existing_file_without_resolving(db_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("re-resolved an existing --db file")

    monkeypatch.setattr(db, "load_scenarios", refuse)
    monkeypatch.setattr(db, "apply_views", refuse)
    out = json.loads(_sql("SELECT scenario, tp FROM pool_layout", "--db", str(db_file),
                          "--format", "json"))
    assert out == [{"scenario": DS3, "tp": 8}]


def test_output_format_from_suffix_and_stdout(db_file: Path, tmp_path: Path) -> None:
    q = "SELECT scenario, 3::SMALLINT AS k FROM scenarios"
    for suffix in ("parquet", "arrow", "csv", "json"):
        target = tmp_path / f"q.{suffix}"
        res = CliRunner().invoke(cli, ["sql", q, "--db", str(db_file), "-o", str(target)])
        assert res.exit_code == 0, res.output
        if suffix == "parquet":
            assert pq.read_schema(target).field("k").type == pa.int16()
            assert read_stamp(target) is not None and read_stamp(target).scenario == DS3
        elif suffix == "arrow":
            with pa.memory_map(str(target)) as mm:
                assert pa.ipc.open_file(mm).schema.field("k").type == pa.int16()
            assert read_stamp(target) is not None
        elif suffix == "csv":
            assert target.read_text().splitlines() == ['"scenario","k"', f'"{DS3}",3']
        else:
            assert json.loads(target.read_text()) == [{"scenario": DS3, "k": 3}]
    assert _sql(q, "--db", str(db_file), "--format", "csv").decode().splitlines()[1] == \
        f'"{DS3}",3'
    ipc = _sql(q, "--db", str(db_file), "--format", "arrow")
    assert pa.ipc.open_file(pa.BufferReader(ipc)).read_all().num_rows == 1
    bad = CliRunner().invoke(cli, ["sql", q, "--db", str(db_file), "-o", str(tmp_path / "q.x")])
    assert bad.exit_code != 0 and "cannot tell the format" in bad.output


def test_provenance_is_typed_and_scope_lists_every_value() -> None:
    con = db.load_scenarios([DS3])
    schema = con.sql("SELECT * FROM provenance").to_arrow_table().schema
    assert schema.field("value").type == pa.float64()
    assert pa.types.is_dictionary(schema.field("method").type)
    assert schema.field("scope_values").type == pa.list_(pa.string())
    rows = con.sql("SELECT name, kind, value, value_text, units, scope, scope_kind, "
                   "scope_values, reason FROM provenance WHERE scenario = ?",
                   params=[DS3]).fetchall()
    hardware = [r for r in rows if r[6] == "hardware"]
    assert hardware and all("h200" in [v.lower() for v in r[7]] for r in hardware)
    assert any(len(r[7]) > 1 for r in hardware)  # more than the first chip is kept
    for _name, kind, value, text, units, scope, scope_kind, values, reason in rows:
        if kind == "coefficient":
            assert value == float(text) and units and reason is None
            assert scope == ("unscoped" if scope_kind == "unscoped"
                             else f"{scope_kind}: {values[0]}")
        else:
            assert scope_kind == "assumption" and scope == f"{text}: {reason}"
    con.close()


def test_cli_exports_are_stamped_and_typed(tmp_path: Path) -> None:
    target = tmp_path / "prov.parquet"
    res = CliRunner().invoke(cli, ["provenance", "-s", DS3, "-o", str(target)])
    assert res.exit_code == 0, res.output
    table = pq.read_table(target)
    assert table.schema.field("value").type == pa.float64()
    stamp = read_stamp(target)
    assert stamp is not None and (stamp.kind, stamp.scenario, stamp.pool) == ("export", DS3, 0)
    assert any(k.startswith("chip:") for k in stamp.documents)
    js = CliRunner().invoke(cli, ["evidence", "-s", DS3, "--format", "json"])
    assert js.exit_code == 0
    assert json.loads(js.stdout)[0]["total"] == table.num_rows


def test_duckdb_joins_priced_steps_with_typed_provenance(tmp_path: Path) -> None:
    runner = CliRunner()
    trace, out, dbf = tmp_path / "t.parquet", tmp_path / "p.parquet", tmp_path / "p.duckdb"
    assert runner.invoke(cli, ["trace", "synth", "--batches", "200", "-o", str(trace)]
                         ).exit_code == 0
    res = runner.invoke(cli, ["price", str(trace), "--scenario", DS3, "-o", str(out),
                              "--db", str(dbf), "--no-progress"])
    assert res.exit_code == 0, res.output
    con = duckdb.connect(str(dbf), read_only=True)  # plain duckdb, no blis code
    rows = con.execute("""
        SELECT s.scenario, count(DISTINCT s.batch_id) AS batches,
               max(p.value) FILTER (WHERE p.name = 'hbm_derate') AS derate,
               any_value(p.scope_values) FILTER (WHERE p.name = 'hbm_derate') AS chips,
               count(*) FILTER (WHERE p.method = 'assumed') > 0 AS has_assumed
        FROM priced_steps s JOIN provenance p USING (scenario, pool)
        GROUP BY 1""").fetchall()
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'kernel_provenance'").fetchall())
    con.close()
    assert len(rows) == 1
    scenario, batches, derate, chips, has_assumed = rows[0]
    assert (scenario, batches, has_assumed) == (DS3, 200, True)
    assert isinstance(derate, float) and 0 < derate <= 1 and "h200" in chips
    assert types["value"] == "DOUBLE" and types["method"].startswith("ENUM")
    assert types["scope_values"] == "VARCHAR[]"
    con = duckdb.connect(str(dbf), read_only=True)
    (made,) = con.execute("SELECT stamp->>'$.\"blis.scenario\"', "
                          "(stamp->>'$.\"blis.counts\"')::JSON->>'$.batches_priced' "
                          "FROM priced_stamps").fetchall()
    con.close()
    assert made == (DS3, "200")
