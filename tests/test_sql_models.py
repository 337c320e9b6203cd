"""sql/ files as models: dependencies parsed from the SQL, ordered by them, clear failures."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline import normalise as nz
from pipeline import sql_models
from pipeline.resources import sql_dir
from pipeline.sql_models import SqlOrderError, order, parse


def write(tmp: Path, files: dict[str, str]) -> list[sql_models.SqlModel]:
    for name, text in files.items():
        (tmp / name).write_text(text)
    return [parse(p) for p in sorted(tmp.glob("*.sql"))]


def test_order_follows_reads_not_file_names(tmp_path: Path) -> None:
    models = write(tmp_path, {
        "a_top.sql": "-- reads mid and a macro from z\n"
                     "CREATE OR REPLACE VIEW top AS SELECT twice(x) AS y FROM mid;",
        "b_mid.sql": "CREATE OR REPLACE VIEW mid AS\n"
                     "WITH w AS (SELECT x FROM base) SELECT x FROM w JOIN base USING (x);",
        "z_macros.sql": "CREATE OR REPLACE MACRO twice(v) AS 2 * v;",
    })
    assert models[0].reads == {"mid"} and models[1].reads == {"base"}  # the CTE is not read
    ran = [m.path.name for m in order(models, known=["base"])]
    assert ran.index("z_macros.sql") < ran.index("a_top.sql")
    assert ran.index("b_mid.sql") < ran.index("a_top.sql")
    con = duckdb.connect()  # and the order really runs
    con.execute("CREATE TABLE base AS SELECT 21 AS x")
    for m in order(models, known=["base"]):
        con.execute(m.path.read_text())
    assert con.execute("SELECT y FROM top").fetchall() == [(42,)]


def test_a_cycle_names_its_files(tmp_path: Path) -> None:
    models = write(tmp_path, {
        "1.sql": "CREATE OR REPLACE VIEW p AS SELECT * FROM q;",
        "2.sql": "CREATE OR REPLACE VIEW q AS SELECT * FROM r;",
        "3.sql": "CREATE OR REPLACE VIEW r AS SELECT * FROM p;",
        "4.sql": "CREATE OR REPLACE VIEW s AS SELECT 1 AS one;",
    })
    with pytest.raises(SqlOrderError, match=r"cycle: 1\.sql, 2\.sql, 3\.sql, 1\.sql"):
        order(models)


def test_a_missing_input_names_file_and_relation(tmp_path: Path) -> None:
    models = write(tmp_path, {
        "1.sql": "CREATE OR REPLACE VIEW p AS SELECT * FROM nowhere JOIN t USING (k);",
    })
    with pytest.raises(SqlOrderError, match=r"1\.sql: reads nowhere, which no sql file"):
        order(models, known=["t"])
    assert [m.path.name for m in order(models, known=["t", "nowhere"])] == ["1.sql"]


def test_two_definitions_of_one_name_fail(tmp_path: Path) -> None:
    models = write(tmp_path, {"1.sql": "CREATE OR REPLACE VIEW p AS SELECT 1;",
                              "2.sql": "CREATE OR REPLACE TABLE p AS SELECT 2;"})
    with pytest.raises(SqlOrderError, match=r"2\.sql: defines 'p', which 1\.sql"):
        order(models)


def test_comments_strings_and_call_syntax_are_not_reads(tmp_path: Path) -> None:
    models = write(tmp_path, {"1.sql": (
        "-- FROM ghost\nCREATE OR REPLACE VIEW p AS SELECT 'FROM spook' AS s,\n"
        "extract(year FROM ts) AS y FROM t, unnest([1, 2]) AS u(v), range(3);")})
    assert models[0].reads == {"t"}


def test_the_repository_sql_orders_with_only_document_tables_known() -> None:
    models = [parse(p) for p in sorted(sql_dir().glob("*.sql"))]
    ran = order(models, known=[*nz.SCHEMAS, "loaded_documents", "kernel_constants"])
    assert len(ran) == len(models) >= 10
    position = {m.path: i for i, m in enumerate(ran)}
    defined_by = {name: m for m in ran for name in m.defines}
    for m in ran:  # every relation a file reads is defined by a file that runs earlier
        for name in m.reads & defined_by.keys():
            assert position[defined_by[name].path] < position[m.path], (m.path.name, name)
