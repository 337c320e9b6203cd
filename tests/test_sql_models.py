"""sql/ files as models: dependencies parsed from the SQL, ordered by them, clear failures."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline import db, sql_models
from pipeline import normalise as nz
from pipeline.resources import sql_dir
from pipeline.sql_models import SqlHeaderError, SqlOrderError, order, parse


def write(tmp: Path, files: dict[str, str]) -> list[sql_models.SqlModel]:
    """Write ``files`` (a header saying ``materialize: false`` added where none is given)."""
    for name, text in files.items():
        header = "" if "materiali" in text else "-- materialize: false\n"
        (tmp / name).write_text(header + text)
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
    ran = order(models, known=[*nz.SCHEMAS, "loaded_documents", *db.PARAMETER_TABLES])
    assert len(ran) == len(models) >= 10
    position = {m.path: i for i, m in enumerate(ran)}
    defined_by = {name: m for m in ran for name in m.defines}
    for m in ran:  # every relation a file reads is defined by a file that runs earlier
        for name in m.reads & defined_by.keys():
            assert position[defined_by[name].path] < position[m.path], (m.path.name, name)


@pytest.mark.parametrize(("text", "message"), [
    ("CREATE OR REPLACE VIEW p AS SELECT 1;", r"bad\.sql: no materialize declaration"),
    ("-- materialize: yes\nCREATE OR REPLACE VIEW p AS SELECT 1;",
     r"bad\.sql: '-- materialize: yes' is not a valid declaration"),
    ("-- materialise: true\nCREATE OR REPLACE VIEW p AS SELECT 1;",
     r"bad\.sql: '-- materialise: true' is not a valid declaration"),
    ("-- materialize: true\n-- materialize: false\nCREATE OR REPLACE VIEW p AS SELECT 1;",
     r"bad\.sql: materialize is declared 2 times"),
    ("CREATE OR REPLACE VIEW p AS SELECT 1;\n-- materialize: true\n",
     r"bad\.sql: the materialize declaration comes after the first statement"),
    ("-- materialize: true\nCREATE OR REPLACE MACRO m(x) AS x;",
     r"bad\.sql: declares 'materialize: true' but creates no view"),
])
def test_a_missing_or_invalid_declaration_names_the_file(tmp_path: Path, text: str,
                                                        message: str) -> None:
    (tmp_path / "bad.sql").write_text(text)
    with pytest.raises(SqlHeaderError, match=message):
        parse(tmp_path / "bad.sql")


def test_the_declaration_is_read(tmp_path: Path) -> None:
    models = write(tmp_path, {
        "1.sql": "-- what this is\n--  materialize:  true \n\nCREATE OR REPLACE VIEW p AS "
                 "SELECT 1 AS one;\nCREATE OR REPLACE VIEW q AS SELECT one FROM p;",
        "2.sql": "-- materialize: false\nCREATE OR REPLACE VIEW r AS SELECT one FROM q;",
    })
    assert [(m.materialize, m.views) for m in models] == [(True, ("p", "q")), (False, ("r",))]


def kinds(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    return dict(con.execute("SELECT table_name, table_type FROM information_schema.tables"
                            ).fetchall())


def test_apply_views_materialises_what_each_file_declares(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, {
        "a.sql": "-- materialize: true\nCREATE OR REPLACE VIEW p AS SELECT k, 2 * k AS v "
                 "FROM base;\nCREATE OR REPLACE VIEW q AS SELECT k, v + 1 AS w FROM p;",
        "b.sql": "-- materialize: false\nCREATE OR REPLACE VIEW r AS SELECT k, w FROM q;",
    })
    monkeypatch.setattr(db, "sql_files", lambda: sorted(tmp_path.glob("*.sql")))
    monkeypatch.setattr(db, "_UDF_INSTALLERS", [lambda con: None])
    con = duckdb.connect()
    con.execute("CREATE TABLE base AS SELECT 1 AS k")
    db.apply_views(con)
    assert {n: kinds(con)[n] for n in "pqr"} == {"p": "BASE TABLE", "q": "BASE TABLE",
                                                 "r": "VIEW"}
    assert con.execute("SELECT * FROM r").fetchall() == [(1, 3)]
    con.execute("INSERT INTO base VALUES (2)")  # a table is a snapshot until applied again
    assert con.execute("SELECT count(*) FROM r").fetchall() == [(1,)]
    db.apply_views(con)
    assert con.execute("SELECT * FROM r ORDER BY k").fetchall() == [(1, 3), (2, 5)]
    db.apply_views(con, materialize=False)  # and back to plain views
    assert {n: kinds(con)[n] for n in "pqr"} == {"p": "VIEW", "q": "VIEW", "r": "VIEW"}
    assert not any(n.startswith("__") for n in kinds(con))


def test_every_repository_file_declares_and_its_views_become_tables() -> None:
    from kernel.pool import sql_laws  # noqa: F401  (installs the laws the views call)

    con = db.open_db()
    have = kinds(con)
    models = [parse(p) for p in sorted(sql_dir().glob("*.sql"))]
    assert any(m.materialize for m in models)
    for m in models:
        want = "BASE TABLE" if m.materialize else "VIEW"
        assert {v: have[v] for v in m.views} == {v: want for v in m.views}, m.path.name


def test_the_repository_sql_runs_with_its_file_names_reversed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefixes are only for reading: renamed so that name order is backwards, the files
    still run (DuckDB binds a view when it is created, so a wrong order fails)."""
    from kernel.pool import sql_laws  # noqa: F401  (installs the laws the views call)

    files = sorted(sql_dir().glob("*.sql"))
    for i, path in enumerate(files):
        (tmp_path / f"{len(files) - i:02d}_{path.stem}.sql").write_text(path.read_text())
    monkeypatch.setattr(db, "sql_files", lambda: sorted(tmp_path.glob("*.sql")))
    con = db.open_db()
    expected = {name for p in files for name in parse(p).views}
    assert expected <= set(kinds(con))


def test_a_view_the_loader_cannot_materialise_is_named(tmp_path: Path) -> None:
    (model,) = write(tmp_path, {"m.sql": "-- materialize: true\nCREATE OR REPLACE VIEW p AS "
                                         "SELECT 1 AS one;\nCREATE VIEW q AS SELECT 2 AS two;"})
    assert sql_models.statements(model, materialize=False)[1].strip().startswith("CREATE VIEW q")
    with pytest.raises(SqlHeaderError, match=r"m\.sql: cannot materialise q"):
        sql_models.statements(model)


def test_reads_and_calls_come_from_duckdbs_parse_tree(tmp_path: Path) -> None:
    """What a text scan would get wrong: a quoted identifier that says FROM, a read inside a
    scalar subquery, a macro body that is a table query, a table of column definitions, and a
    multi-byte character before the statement (DuckDB's token positions count bytes)."""
    models = write(tmp_path, {
        "1.sql": "-- § μ\nCREATE OR REPLACE VIEW p AS SELECT 1 AS \"from ghost\", "
                 "(SELECT max(k) FROM inner_t) AS m FROM outer_t WHERE k IN (SELECT k FROM s);",
        "2.sql": "CREATE OR REPLACE MACRO rows_of(n) AS TABLE SELECT * FROM p LIMIT n;",
        "3.sql": "CREATE TABLE IF NOT EXISTS params (k INTEGER, v DOUBLE);",
        "4.sql": "CREATE OR REPLACE VIEW q AS SELECT * FROM rows_of(2) JOIN params USING (k);",
    })
    assert models[0].defines == {"p"} and models[0].reads == {"inner_t", "outer_t", "s"}
    assert models[1].defines == {"rows_of"} and models[1].reads == {"p"}
    assert models[2].defines == {"params"} and models[2].reads == frozenset()
    assert models[3].reads == {"params"} and "rows_of" in models[3].uses
    ran = [m.path.name for m in order(models, known=["inner_t", "outer_t", "s"])]
    assert ran.index("1.sql") < ran.index("2.sql") < ran.index("4.sql")
    assert ran.index("3.sql") < ran.index("4.sql")


@pytest.mark.parametrize(("text", "message"), [
    ("CREATE OR REPLACE VIEW p AS SELEC 1;", r"bad\.sql: DuckDB cannot parse"),
    ("CREATE SEQUENCE s;", r"bad\.sql: CREATE SEQUENCE is not a model statement"),
])
def test_unparsable_or_foreign_statements_name_the_file(tmp_path: Path, text: str,
                                                        message: str) -> None:
    (tmp_path / "bad.sql").write_text("-- materialize: false\n" + text)
    with pytest.raises(sql_models.SqlModelError, match=message):
        parse(tmp_path / "bad.sql")
