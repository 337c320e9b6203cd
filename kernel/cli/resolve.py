"""``blis-kernel resolved|provenance|evidence SCENARIO`` and ``blis-kernel sql QUERY``.

Each loads the named scenarios into a DuckDB database (in memory unless ``--db`` names a
file), runs the ``sql/`` views and prints the rows as a table, or writes them with
``--format parquet|csv|json -o FILE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from kernel import safe_output
from kernel.cli.common import make_repos, with_repos
from pipeline import db
from pipeline.errors import DocumentError
from pipeline.load import Repos

FORMATS = ("table", "parquet", "csv", "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Integral values (byte counts, widths) in full; others as the shortest exact repr.
        return f"{int(value):,}" if value.is_integer() and abs(value) < 2**53 else repr(value)
    return str(value)


def _arrow(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None
           ) -> pa.Table:
    cur = con.execute(query, params or [])
    names = [d[0] for d in cur.description or ()]
    rows = cur.fetchall()
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows]) if rows \
        else pa.table({n: pa.array([], pa.null()) for n in names})


def write_table(table: pa.Table, fmt: str, out: str | None, title: str = "",
                transpose: bool = False) -> None:
    """Print ``table`` with rich, or write it as parquet/csv/json to ``out``."""
    if fmt == "table" and out:
        fmt = SUFFIX_FORMATS.get(Path(out).suffix.lower(), "")
        if not fmt:
            raise click.UsageError(f"-o {out}: give --format parquet|csv|json, or a file "
                                   f"ending in {', '.join(SUFFIX_FORMATS)}")
    if fmt == "table":
        console = Console(width=200)
        rich = Table(title=title or None, show_lines=False)
        rows = table.to_pylist()
        if transpose and len(rows) == 1:
            rich.add_column("field", no_wrap=True)
            rich.add_column("value", overflow="fold", max_width=120)
            for k, v in rows[0].items():
                rich.add_row(k, _cell(v))
        else:
            for name in table.column_names:
                rich.add_column(name)
            for row in rows:
                rich.add_row(*(_cell(v) for v in row.values()))
        console.print(rich)
        return
    if not out:
        raise click.UsageError(f"--format {fmt} needs -o FILE")
    path = Path(out)
    with safe_output.atomic(path, "-o") as tmp:
        if fmt == "parquet":
            pq.write_table(table, tmp)
        elif fmt == "csv":
            flat = pa.table({n: pa.array([_cell(v) if isinstance(v, list | dict) else v
                                          for v in table.column(n).to_pylist()])
                             for n in table.column_names}) if table.num_rows else table
            pacsv.write_csv(flat, tmp)
        else:
            tmp.write_text(json.dumps(table.to_pylist(), indent=2, default=str) + "\n")
    click.echo(f"wrote {table.num_rows} row(s) to {path}")


def _load(scenarios: list[str], repos: Repos, db_path: str | None) -> duckdb.DuckDBPyConnection:
    try:
        con = db.open_db(db_path, apply=False) if db_path else None
        return db.load_scenarios(scenarios or None, repos, con)
    except DocumentError as exc:
        from kernel.cli.errors import describe

        raise click.ClickException(describe(exc)) from None


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
    row = con.execute("SELECT count(*) FROM pools WHERE scenario = ?", [key]).fetchone()
    n = int(row[0]) if row else 0
    if not 0 <= pool < n:
        raise click.BadParameter(f"{key} has {n} pool(s): the index is 0..{n - 1}, got {pool}",
                                 param_hint="--pool")


# -o without --format: the suffix says the format.
SUFFIX_FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json"}


def _format_options(func: Any) -> Any:
    func = click.option("-o", "--output", "out", type=click.Path(dir_okay=False),
                        help="File to write (with --format parquet|csv|json).")(func)
    func = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
                        show_default=True, help="Print a table or export the rows.")(func)
    return func


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
    @group.command("resolved")
    @click.argument("scenario")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @_format_options
    @with_repos
    def resolved_cmd(scenario: str, pool: int, fmt: str, out: str | None,
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
        write_table(table, fmt, out, f"{key} pool {pool}: resolved", transpose=True)
        overrides = _arrow(con, "SELECT field, requested, resolved, reason FROM pool_overrides "
                           "WHERE scenario = ? AND pool = ? ORDER BY seq", [key, pool])
        if fmt == "table" and overrides.num_rows:
            write_table(overrides, fmt, None, "overrides")
        if refused:
            raise SystemExit(1)

    @group.command("provenance")
    @click.argument("scenario")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @_format_options
    @with_repos
    def provenance_cmd(scenario: str, pool: int, fmt: str, out: str | None,
                       scenarios_root: str | None, catalog_root: str | None,
                       registry_root: str | None) -> None:
        """Every coefficient in scope (name order), then the kernel's assumptions."""
        safe_output.check_outputs([("SCENARIO", scenario)], [("-o", out)])
        con = _load([scenario], make_repos(scenarios_root, catalog_root, registry_root), None)
        key = _key(con, scenario)
        _check_pool(con, key, pool)
        _refusal_note(con, key, pool)
        table = _arrow(con, "SELECT position, name, set, method, scope FROM provenance "
                       "WHERE scenario = ? AND pool = ? ORDER BY position", [key, pool])
        write_table(table, fmt, out, f"{key} pool {pool}: provenance")

    @group.command("evidence")
    @click.argument("scenario")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @_format_options
    @with_repos
    def evidence_cmd(scenario: str, pool: int, fmt: str, out: str | None,
                     scenarios_root: str | None, catalog_root: str | None,
                     registry_root: str | None) -> None:
        """How many provenance entries rest on evidence, of how many, and which are assumed."""
        safe_output.check_outputs([("SCENARIO", scenario)], [("-o", out)])
        con = _load([scenario], make_repos(scenarios_root, catalog_root, registry_root), None)
        key = _key(con, scenario)
        _check_pool(con, key, pool)
        table = _arrow(con, "SELECT evidenced, total, assumed_names FROM evidence "
                       "WHERE scenario = ? AND pool = ?", [key, pool])
        write_table(table, fmt, out, f"{key} pool {pool}: evidence", transpose=True)

    @group.command("sql")
    @click.argument("query")
    @click.option("--scenario", "scenarios", multiple=True,
                  help="Scenario to load (repeatable; default: every embedded scenario).")
    @click.option("--db", "db_path", type=click.Path(dir_okay=False),
                  help="Query this DuckDB file (e.g. from `price --db`) as it is, read-only, "
                       "instead of loading scenarios.")
    @_format_options
    @with_repos
    def sql_cmd(query: str, scenarios: tuple[str, ...], db_path: str | None, fmt: str,
                out: str | None, scenarios_root: str | None, catalog_root: str | None,
                registry_root: str | None) -> None:
        """Run a read-only SQL query over the document tables and resolution views
        (docs/tables.md). No file, network, extension or write is reachable from it."""
        from pipeline import sandbox

        if db_path and scenarios:
            raise click.UsageError("--db queries a database as it is; --scenario loads "
                                   "scenarios into a fresh one: give one of them")
        safe_output.check_outputs([("--db", db_path)], [("-o", out)])
        if db_path:
            con = sandbox.open_read_only(db_path)
        else:
            con = sandbox.lock(_load(list(scenarios), make_repos(scenarios_root, catalog_root,
                                                                 registry_root), None))
        try:
            sandbox.check_query(con, query)
            table = _arrow(con, query)
        except duckdb.Error as exc:  # the first line says what; the rest draws a caret
            raise click.ClickException(f"SQL: {str(exc).splitlines()[0]}") from None
        write_table(table, fmt, out)
