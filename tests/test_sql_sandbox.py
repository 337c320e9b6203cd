"""``blis-kernel sql`` cannot escape: no file, network, extension, write or setting reaches out.

Each escape attempt runs on both connections the command uses (scenarios loaded into memory,
and a ``--db`` file opened read-only) and must fail with one line, leaving the machine and
the database as they were. The Python API's writable path stays writable.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from kernel.cli import cli
from pipeline import db, sandbox

S = "llama-3.1-8b-h100-tp1"

ESCAPES = [
    "COPY scenarios TO '{d}/leak.csv'",
    "COPY (SELECT * FROM scenarios) TO '{d}/leak.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{d}/leak'",
    "ATTACH '{d}/other.db' AS o",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM '{d}/secret.csv'",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET lock_configuration",
    "PRAGMA enable_profiling",
    "DROP TABLE scenarios",
    "DELETE FROM scenarios",
    "INSERT INTO scenarios SELECT * FROM scenarios",
    "UPDATE scenarios SET scenario = 'x'",
    "CREATE TABLE x AS SELECT 1",
    "CREATE MACRO m(x) AS x",
    "SELECT 1; DROP TABLE scenarios",
    "CHECKPOINT",
    "CALL duckdb_settings()",
]


@pytest.fixture(scope="module")
def dbfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sandbox")
    db.load_scenarios([S], con=db.open_db(d / "r.db")).close()  # the writable Python path
    (d / "secret.csv").write_text("password\nhunter2\n")
    return d / "r.db"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("query", ESCAPES)
def test_escape_attempts_fail_on_a_db_file(query: str, dbfile: Path) -> None:
    d = dbfile.parent
    before = (_digest(dbfile), sorted(p.name for p in d.iterdir()))
    result = CliRunner().invoke(cli, ["sql", query.format(d=d), "--db", str(dbfile)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "Traceback" not in result.output
    assert "hunter2" not in result.output
    assert (_digest(dbfile), sorted(p.name for p in d.iterdir())) == before


def test_escape_attempts_fail_in_memory(tmp_path: Path) -> None:
    """The in-memory connection: views built, then locked (one load, every attempt)."""
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    con = sandbox.lock(db.load_scenarios([S]))
    for query in ESCAPES:
        q = query.format(d=tmp_path)
        with pytest.raises((sandbox.SandboxError, duckdb.Error)):
            sandbox.check_query(con, q)
            con.execute(q).fetchall()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv"]
    assert con.execute("SELECT count(*) FROM scenarios").fetchall() == [(1,)]


def test_reading_still_works(dbfile: Path) -> None:
    for query in ("SELECT scenario FROM scenarios", "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
                  "DESCRIBE scenarios", "SHOW TABLES", "FROM scenarios", "EXPLAIN SELECT 1"):
        result = CliRunner().invoke(cli, ["sql", query, "--db", str(dbfile)])
        assert result.exit_code == 0, (query, result.output)


def test_the_python_api_keeps_a_writable_path(dbfile: Path) -> None:
    con = db.open_db(dbfile.with_name("w.db"))
    con.execute("CREATE TABLE mine AS SELECT 42 AS answer")
    con.execute("COPY mine TO '" + str(dbfile.with_name("mine.csv")) + "'")
    con.close()
    assert dbfile.with_name("mine.csv").read_text().splitlines() == ["answer", "42"]
    ro = sandbox.open_read_only(dbfile.with_name("w.db"))
    assert ro.execute("SELECT answer FROM mine").fetchall() == [(42,)]
    with pytest.raises(duckdb.Error):
        ro.execute("INSERT INTO mine VALUES (1)")
    ro.close()
