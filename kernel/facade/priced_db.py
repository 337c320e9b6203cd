"""``--db`` persistence: priced rows stored in DuckDB beside their scenario's provenance.

The library half of ``blis-kernel price --db`` (issue 30 item 2, decision LF4): the command
locks the database and calls :func:`write_db`; Python callers call it directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import db as pdb

from ..io.outputs import read_table
from ..io.stamp import read_stamp

if TYPE_CHECKING:
    from kernel.facade.kernel import Kernel
    from pipeline.load import Repos

__all__ = ["write_db"]


def write_db(db: str | Path, k: Kernel, scenario: str, pool: int, priced: Path, trace: str,
             repos: Repos | None = None, con: Any = None) -> None:
    """Store the priced table in DuckDB beside the scenario's documents and provenance.

    Tables: ``priced_steps`` (scenario key, pool, trace + the priced columns; a re-run of the
    same trace replaces its rows), ``kernel_provenance`` (the typed ``provenance`` rows of
    this scenario and pool, docs/tables.md), and the scenario's document tables and
    resolution views, so plain DuckDB can join prices with their provenance.
    """
    from kernel.pool import sql_laws  # noqa: F401  (installs the cost laws the views call)

    con = pdb.open_db(db) if con is None else con
    pdb.load_scenarios([scenario], repos=repos, con=con)
    key = str(k.resolved_pool.scenario)
    try:
        cols = {r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'kernel_provenance'").fetchall()}
        if cols and "scope_kind" not in cols:  # a file from before provenance was typed
            con.execute("DROP TABLE kernel_provenance")
        con.execute("CREATE TABLE IF NOT EXISTS kernel_provenance AS "
                    "SELECT * FROM provenance WHERE false")
        con.execute("DELETE FROM kernel_provenance WHERE scenario = ? AND pool = ?", [key, pool])
        con.execute("INSERT INTO kernel_provenance BY NAME SELECT * FROM provenance "
                    "WHERE scenario = ? AND pool = ?", [key, pool])
        src = str(priced).replace("'", "''")
        if priced.suffix.lower() not in (".parquet", ".pq"):  # another table format (RL3)
            con.register("blis_priced_src", read_table(priced))
            src_sql = "blis_priced_src"
        else:
            src_sql = f"read_parquet('{src}')"
        exists = con.execute("SELECT count(*) FROM information_schema.tables "
                             "WHERE table_name = 'priced_steps'").fetchone()
        if not (exists and exists[0]):
            con.execute("CREATE TABLE priced_steps AS SELECT CAST(? AS VARCHAR) AS scenario, "
                        "CAST(? AS BIGINT) AS pool, CAST(? AS VARCHAR) AS trace, * "
                        f"FROM {src_sql}", [key, pool, trace])
        else:
            con.execute("DELETE FROM priced_steps WHERE scenario = ? AND pool = ? AND trace = ?",
                        [key, pool, trace])
            con.execute("INSERT INTO priced_steps SELECT CAST(? AS VARCHAR), CAST(? AS BIGINT), "
                        f"CAST(? AS VARCHAR), * FROM {src_sql}",
                        [key, pool, trace])
        # what made these rows: the priced file's stamp, one row per (scenario, pool, trace)
        made = (read_stamp(priced) if priced.suffix.lower() not in (".csv", ".jsonl", ".ndjson")
                else None)
        con.execute("CREATE TABLE IF NOT EXISTS priced_stamps (scenario VARCHAR, pool BIGINT, "
                    "trace VARCHAR, stamp JSON)")
        con.execute("DELETE FROM priced_stamps WHERE scenario = ? AND pool = ? AND trace = ?",
                    [key, pool, trace])
        if made is not None:
            con.execute("INSERT INTO priced_stamps VALUES (?, ?, ?, ?)",
                        [key, pool, trace, json.dumps(made.to_metadata())])
    finally:
        con.close()
