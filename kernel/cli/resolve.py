"""``blis-kernel resolved|provenance|evidence SCENARIO`` and ``blis-kernel sql QUERY``.

Each loads the named scenarios into a DuckDB database (in memory unless ``--db`` names a
file), runs the ``sql/`` views and prints the rows as a table, or writes them as parquet,
Arrow IPC, CSV or JSON (:mod:`kernel.cli.output`), with DuckDB's column types. ``sql --db F``
on an existing resolved file queries it as it is.
"""

from __future__ import annotations

from typing import Any

import click
import duckdb
import pyarrow as pa
from rich.console import Console

from kernel.cli.common import FiniteFloatRange, make_repos, with_repos
from kernel.cli.output import emit, format_options, resolve_format
from kernel.io.stamp import for_database
from kernel.pool import sql_laws  # noqa: F401  (installs the cost laws the views call)
from pipeline import db, safe_output
from pipeline.errors import DocumentError
from pipeline.load import Repos

from .dialect import DialectCommand, complete_scenario
from .sql_run import DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_S  # noqa: E402

PROVENANCE_COLUMNS = ("position, name, set, method, value, units, value_text, scope_kind, "
                      "scope_values, reason")


def _arrow(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None
           ) -> pa.Table:
    """A query's rows through Arrow, with DuckDB's types (TINYINT, DECIMAL, ENUM, LIST) and the
    column types of an empty result kept."""
    rel = con.sql(query, params=params) if params else con.sql(query)
    return rel.to_arrow_table() if rel is not None else pa.table({})


def _load(scenarios: list[str], repos: Repos, db_path: str | None) -> duckdb.DuckDBPyConnection:
    try:
        con = db.open_db(db_path, apply=False) if db_path else None
        return db.load_scenarios(scenarios or None, repos, con)
    except DocumentError as exc:
        from kernel.cli.errors import describe

        raise click.ClickException(describe(exc)) from None


def _resolved_db(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the database holds loaded documents and the materialised resolution."""
    rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name IN "
                       "('loaded_documents', 'scenarios', 'resolved_pools')").fetchall()
    return bool(rows and rows[0][0] == 3)


def _key(con: duckdb.DuckDBPyConnection, scenario: str) -> str:
    """The scenario key for a name or path argument (the only scenario loaded)."""
    rows = con.execute("SELECT scenario FROM scenarios WHERE scenario = ? OR file = ? "
                       "OR file LIKE ?", [scenario, scenario, f"%/{scenario}"]).fetchall()
    if rows:
        return str(rows[0][0])
    rows = con.execute("SELECT scenario FROM scenarios").fetchall()
    return str(rows[-1][0]) if rows else scenario


def _check_pool(con: duckdb.DuckDBPyConnection, key: str, pool: int) -> None:
    """A pool index the deployment does not have is an error, not an empty table."""
    rows = con.execute("SELECT count(*) FROM pools WHERE scenario = ?", [key]).fetchall()
    n = int(rows[0][0]) if rows else 0
    if not 0 <= pool < n:
        raise click.BadParameter(f"{key} has {n} pool(s): the index is 0..{n - 1}, got {pool}",
                                 param_hint="--pool")


def _refusal_note(con: duckdb.DuckDBPyConnection, key: str, pool: int) -> bool:
    """Print the pool's refusals to stderr; True when there are any."""
    rows = con.execute("SELECT setting, value, reason FROM refusals WHERE scenario = ? AND "
                       "pool = ? ORDER BY step", [key, pool]).fetchall()
    if rows:
        console = Console(stderr=True, width=200)
        console.print(f"[bold red]{key} pool {pool} is refused:[/]")
        for setting, value, reason in rows:
            console.print(f"  {setting} = {value!r}: {reason}")
    return bool(rows)


def register(group: click.Group) -> None:
    @group.command("resolved", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @format_options()
    @with_repos
    def resolved_cmd(scenario: str, pool: int, fmt: str | None, out: str | None,
                     scenarios_root: str | None, catalog_root: str | None,
                     registry_root: str | None) -> None:
        """The resolved configuration of one pool (every field pricing reads).

        A refused pool prints its refusals and the partial resolution, and exits 1."""
        safe_output.check_outputs([("SCENARIO", scenario)], [("-o", out)])
        con = _load([scenario], make_repos(scenarios_root, catalog_root, registry_root), None)
        key = _key(con, scenario)
        _check_pool(con, key, pool)
        refused = _refusal_note(con, key, pool)
        table = _arrow(con, "SELECT * FROM resolved_pools WHERE scenario = ? AND pool = ?",
                       [key, pool])
        emit(table, fmt, out, title=f"{key} pool {pool}: resolved", transpose=True,
             stamp=for_database(con, scenarios=[key], pool=pool))
        overrides = _arrow(con, "SELECT field, requested, resolved, reason FROM pool_overrides "
                           "WHERE scenario = ? AND pool = ? ORDER BY seq", [key, pool])
        if resolve_format(fmt, out) == "table" and not out and overrides.num_rows:
            emit(overrides, "table", None, title="overrides")
        if refused:
            raise SystemExit(1)

    @group.command("provenance", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @format_options()
    @with_repos
    def provenance_cmd(scenario: str, pool: int, fmt: str | None, out: str | None,
                       scenarios_root: str | None, catalog_root: str | None,
                       registry_root: str | None) -> None:
        """Every coefficient in scope (name order), then the kernel's assumptions."""
        safe_output.check_outputs([("SCENARIO", scenario)], [("-o", out)])
        con = _load([scenario], make_repos(scenarios_root, catalog_root, registry_root), None)
        key = _key(con, scenario)
        _check_pool(con, key, pool)
        _refusal_note(con, key, pool)
        table = _arrow(con, f"SELECT {PROVENANCE_COLUMNS} FROM provenance "
                       "WHERE scenario = ? AND pool = ? ORDER BY position", [key, pool])
        emit(table, fmt, out, title=f"{key} pool {pool}: provenance", key="name",
             stamp=for_database(con, scenarios=[key], pool=pool))

    @group.command("evidence", cls=DialectCommand, positional="--scenario")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @format_options()
    @with_repos
    def evidence_cmd(scenario: str, pool: int, fmt: str | None, out: str | None,
                     scenarios_root: str | None, catalog_root: str | None,
                     registry_root: str | None) -> None:
        """How many provenance entries rest on evidence, of how many, and which are assumed."""
        safe_output.check_outputs([("SCENARIO", scenario)], [("-o", out)])
        con = _load([scenario], make_repos(scenarios_root, catalog_root, registry_root), None)
        key = _key(con, scenario)
        _check_pool(con, key, pool)
        table = _arrow(con, "SELECT evidenced, total, assumed_names FROM evidence "
                       "WHERE scenario = ? AND pool = ?", [key, pool])
        emit(table, fmt, out, title=f"{key} pool {pool}: evidence", transpose=True,
             stamp=for_database(con, scenarios=[key], pool=pool))

    @group.command("sql", cls=DialectCommand)
    @click.argument("query")
    @click.option("-s", "--scenario", "scenarios", multiple=True, shell_complete=complete_scenario,
                  help="Scenario to load (repeatable; default: every embedded scenario).")
    @click.option("--db", "db_path", type=click.Path(dir_okay=False),
                  help="Query this DuckDB file (e.g. from `price --db`) as it is, read-only, "
                       "instead of loading scenarios.")
    @click.option("--timeout", default=DEFAULT_TIMEOUT_S, show_default=True,
                  type=FiniteFloatRange(0, 7 * 24 * 3600),
                  help="Seconds the query may run (0: no limit).")
    @click.option("--max-rows", "max_rows", default=None, type=click.IntRange(0),
                  help=f"Most rows the result may have (0: no limit; default {DEFAULT_MAX_ROWS:,} "
                       "for a table or JSON array, which hold every row, and no limit for "
                       "parquet, arrow, csv and jsonl, which stream).")
    @format_options()
    @with_repos
    def sql_cmd(query: str, scenarios: tuple[str, ...], db_path: str | None, timeout: float,
                max_rows: int | None, fmt: str, out: str | None, scenarios_root: str | None,
                catalog_root: str | None, registry_root: str | None) -> None:
        """Run one read-only SQL statement over the document tables and resolution views
        (docs/tables.md). No file, network, extension or write is reachable from it; it stops
        at --timeout seconds and --max-rows rows."""
        from pipeline import sandbox

        from .sql_run import run_query

        if db_path and scenarios:
            raise click.UsageError("--db queries a database as it is; --scenario loads "
                                   "scenarios into a fresh one: give one of them")
        resolve_format(fmt, out)  # a bad suffix before anything is loaded
        safe_output.check_outputs([("--db", db_path)], [("-o", None if out == "-" else out)])
        if db_path:
            con = sandbox.open_read_only(db_path)
        else:
            con = sandbox.lock(_load(list(scenarios), make_repos(scenarios_root, catalog_root,
                                                                 registry_root), None))
        try:
            sandbox.check_query(con, query)
            run_query(con, query, fmt, out, timeout=timeout, max_rows=max_rows,
                      stamp=for_database(con) if _resolved_db(con) else None)
        except duckdb.Error as exc:  # the first line says what; the rest draws a caret
            from kernel.cli.errors import resource_error

            actionable = resource_error(exc, "sql")
            raise click.ClickException(actionable or f"SQL: {str(exc).splitlines()[0]}") \
                from None
