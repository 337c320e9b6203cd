"""The resolution database: documents as tables, resolution as SQL views over them.

``open_db()`` gives a DuckDB connection (in memory, or a file) with every table of
:mod:`pipeline.normalise` created empty; ``register(con, inputs)`` adds one scenario's
documents (idempotently: a document already present with the same content is skipped, one
with different content under the same name is an error); ``apply_views(con)`` runs every
``sql/*.sql`` file in dependency order and materialises the views of the files whose header
declares it. Views compute for every scenario and pool at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from . import constants, sql_models, units
from . import load as _load
from . import normalise as nz
from .errors import DocumentError, Problem
from .load import Inputs, Repos, open_inputs, resolve_scenario_path
from .resources import sql_dir


def open_db(path: str | os.PathLike[str] | None = None,
            apply: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection with every document table present (empty if new) and the views applied."""
    con = duckdb.connect(str(path) if path else ":memory:")
    fresh = not path  # a new in-memory database holds no table yet: no need to ask
    for name, schema in nz.SCHEMAS.items():
        if fresh or not _exists(con, name):
            con.register("__schema_tmp", pa.Table.from_pylist([], schema=schema))
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM __schema_tmp')
            con.unregister("__schema_tmp")
    if fresh or not _exists(con, "loaded_documents"):
        con.execute("CREATE TABLE loaded_documents (kind VARCHAR, name VARCHAR, "
                    "digest VARCHAR, file VARCHAR)")
    if apply:
        apply_views(con)
    return con


def _exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    rows = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                       [name]).fetchall()
    return bool(rows and rows[0][0])


def _digest(tables: dict[str, pa.Table]) -> str:
    h = hashlib.sha256()
    for name in sorted(tables):
        h.update(name.encode())
        h.update(repr(tables[name].to_pylist()).encode())
    return h.hexdigest()


# id(document) -> (document, tables, digest): a document object seen before is not re-normalised.
# The document is kept so its id stays valid; documents are frozen, so the entry stays true.
_NORMALISED: dict[int, tuple[object, dict[str, pa.Table], str]] = {}


def _normalised(doc: object, make: Callable[[], dict[str, pa.Table]]
                ) -> tuple[dict[str, pa.Table], str]:
    hit = _NORMALISED.get(id(doc))
    if hit is not None and hit[0] is doc:
        return hit[1], hit[2]
    tables = make()
    digest = _digest(tables)
    if len(_NORMALISED) > 256:
        _NORMALISED.clear()
    _NORMALISED[id(doc)] = (doc, tables, digest)
    return tables, digest


def _add(con: duckdb.DuckDBPyConnection, kind: str, name: str, doc: object,
         make: Callable[[], dict[str, pa.Table]], file: str) -> None:
    tables, digest = _normalised(doc, make)
    rows = con.execute("SELECT digest, file FROM loaded_documents WHERE kind = ? AND name = ?",
                       [kind, name]).fetchall()
    if rows:
        row = rows[0]
        if row[0] == digest:
            return
        raise DocumentError(Problem(file, "", f"{kind} {name!r} is already in the database "
                                    f"(from {row[1]}) with different content; one name must "
                                    "mean one document"))
    for table, data in tables.items():
        if data.num_rows:
            con.from_arrow(data).insert_into(table)
    con.execute("INSERT INTO loaded_documents VALUES (?, ?, ?, ?)", [kind, name, digest, file])


def scenario_key(inputs: Inputs) -> str:
    """The name a scenario's rows are keyed by: its ``name``, else its file stem."""
    if inputs.scenario.name:
        return inputs.scenario.name
    src = inputs.sources.get("scenario")
    return Path(src.file).stem if src else "scenario"


def register(con: duckdb.DuckDBPyConnection, inputs: Inputs) -> str:
    """Add one scenario's documents; returns the scenario key. Idempotent."""
    key = scenario_key(inputs)
    src = inputs.sources
    file = src["scenario"].file if "scenario" in src else "<memory>"
    graph, chip, fabric, rules = inputs.model, inputs.chip, inputs.fabric, inputs.rules
    _add(con, "graph", graph.name, graph, lambda: nz.graph_tables(graph),
         src["model"].file if "model" in src else "<memory>")
    _add(con, "chip", chip.name, chip, lambda: {"chips": nz.chip_table(chip)},
         src["chip"].file if "chip" in src else "<memory>")
    if fabric is not None:
        _add(con, "fabric", fabric.name, fabric, lambda: {"fabrics": nz.fabric_table(fabric)},
             src["fabric"].file if "fabric" in src else "<memory>")
    for dev in inputs.devices:
        if dev is not None:
            _add(con, "storage_device", dev.name, dev,
                 lambda d=dev: {"storage_devices": nz.device_table((d,))},  # type: ignore[misc]
                 src["devices"].file if "devices" in src else "<memory>")
    for cset in inputs.coefficients:
        where = src.get(f"coefficients:{cset.name}")
        _add(con, "coefficient_set", cset.name, cset,
             lambda c=cset: {"coefficients": nz.coefficient_table(c)},  # type: ignore[misc]
             where.file if where else "<memory>")
    _add(con, "rules", rules.version, rules, lambda: {"rules": nz.rules_table(rules)},
         "<rules pack>")
    scen_tables = nz.scenario_tables(key, file, inputs.scenario, inputs.deployment, graph, rules,
                                     assumed_collective_widths=inputs.assumed_collective_widths)
    _add(con, "scenario", key, scen_tables, lambda: scen_tables, file)
    return key


def embedded_scenarios(repos: Repos | None = None) -> list[str]:
    """Every scenario name under the scenarios root, sorted."""
    root = (repos or Repos()).scenarios_root()
    return sorted(p.stem for p in root.glob("*.yaml")) if root.is_dir() else []


def load_scenarios(names_or_paths: Iterable[str | os.PathLike[str]] | None = None,
                   repos: Repos | None = None,
                   con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
    """Register each named scenario (default: every embedded one) and apply the views."""
    repos = repos or Repos()
    con = con if con is not None else open_db(apply=False)
    names = list(names_or_paths) if names_or_paths is not None else embedded_scenarios(repos)
    with shared_document_cache():
        for name in names:
            resolve_scenario_path(name, repos)  # a clear error for an unknown name
            register(con, open_inputs(name, repos, 0))
    apply_views(con)
    return con


@contextlib.contextmanager
def shared_document_cache() -> Iterator[None]:
    """Within the block, a catalog/registry file named by several scenarios is parsed once.

    Documents are frozen dataclasses, so sharing one decoded value is safe; the cache is keyed
    by the file's path, size and modification time and dropped when the block ends.
    """
    original = _load.load_document
    cache: dict[tuple[object, ...], Any] = {}

    def cached(tp: Any, path: Any, doc_index: int = 0) -> Any:
        st = os.stat(path)
        key = (tp, str(path), doc_index, st.st_size, st.st_mtime_ns)
        if key not in cache:
            cache[key] = original(tp, path, doc_index)
        return cache[key]

    _load.load_document = cached
    try:
        yield
    finally:
        _load.load_document = original


def sql_files() -> list[Path]:
    return sorted(sql_dir().glob("*.sql"))


# Scalar functions the views call (the kernel's cost laws) are installed by the layer above:
# kernel/pool/sql_laws.py adds its installer here, so pipeline/ never imports kernel/ and SQL and
# Python still share one definition of each law.
UdfInstaller = Callable[[duckdb.DuckDBPyConnection], None]
_UDF_INSTALLERS: list[UdfInstaller] = []


def add_udf_installer(install: UdfInstaller) -> None:
    """Run ``install(con)`` on every connection before the views are applied (idempotent)."""
    if install not in _UDF_INSTALLERS:
        _UDF_INSTALLERS.append(install)


def udf_installers() -> tuple[UdfInstaller, ...]:
    """The installers :func:`install_udfs` runs, in order."""
    return tuple(_UDF_INSTALLERS)


def install_udfs(con: duckdb.DuckDBPyConnection) -> None:
    """Install every registered SQL function on ``con``; fail clearly when none is."""
    if not _UDF_INSTALLERS:
        raise RuntimeError(
            "sql/ views call the kernel's cost laws, but no SQL function installer is "
            "registered: import kernel.pool.sql_laws (kernel.pool.build and the CLI do) before "
            "applying the views")
    for install in _UDF_INSTALLERS:
        install(con)


def register_constants(con: duckdb.DuckDBPyConnection) -> None:
    """Give SQL the kernel's constants as the one-row table ``kernel_constants`` and macros
    over it, so that views never spell a version or a set name as a literal (idempotent)."""
    con.execute(
        "CREATE OR REPLACE TABLE kernel_constants AS SELECT ?::VARCHAR AS engine_version, "
        "?::VARCHAR AS engine_commit, ?::VARCHAR AS assumption_set, "
        "?::BIGINT AS max_duration_ns, ?::VARCHAR[] AS evidenced_methods, "
        "?::VARCHAR AS flashinfer_sm90_sparse_mla_version",
        [constants.ENGINE_BEHAVIOUR_VERSION, constants.ENGINE_BEHAVIOUR_COMMIT,
         constants.KERNEL_ASSUMPTION_SET, constants.MAX_DURATION_NS,
         list(constants.EVIDENCED_METHODS), constants.FLASHINFER_SM90_SPARSE_MLA_VERSION])
    con.execute("CREATE OR REPLACE MACRO engine_version() AS "
                "(SELECT engine_version FROM kernel_constants)")
    con.execute("CREATE OR REPLACE MACRO vllm() AS "
                "(SELECT 'vLLM v' || engine_version FROM kernel_constants)")
    con.execute("CREATE OR REPLACE MACRO assumption_set() AS "
                "(SELECT assumption_set FROM kernel_constants)")


# Tables the loader writes from Python values before the views run (not documents, not views).
PARAMETER_TABLES = ("kernel_constants", "coefficient_units", "coefficient_quantities")


def register_units(con: duckdb.DuckDBPyConnection) -> None:
    """Give SQL the coefficient unit tables of :mod:`pipeline.units` (idempotent):
    ``coefficient_units`` (unit → quantity, SI unit, factor) and ``coefficient_quantities``
    (name pattern → quantity)."""
    for name, table in (("coefficient_units", units.units_table()),
                        ("coefficient_quantities", units.quantities_table())):
        con.register("__units_tmp", table)
        con.execute(f'CREATE OR REPLACE TABLE "{name}" AS SELECT * FROM __units_tmp')
        con.unregister("__units_tmp")


def prepare(con: duckdb.DuckDBPyConnection) -> None:
    """Give ``con`` what the views call and read besides documents (idempotent): the cost-law
    functions, the kernel's constants and the coefficient unit tables."""
    install_udfs(con)
    register_constants(con)
    register_units(con)


def apply_views(con: duckdb.DuckDBPyConnection, materialize: bool = True) -> None:
    """:func:`prepare` ``con``, then :func:`run_views`."""
    prepare(con)
    run_views(con, materialize)


def run_views(con: duckdb.DuckDBPyConnection, materialize: bool = True) -> None:
    """Run every ``sql/*.sql`` file in dependency order (``pipeline.sql_models``; each creates
    or replaces views) on a connection :func:`prepare` has set up.

    A file whose header declares ``-- materialize: true`` has each of its views computed once
    into a table of the same name, filled from the view's own query
    (:func:`pipeline.sql_models.statements`): later files then read rows rather than
    re-expanding the whole chain, which keeps resolving many scenarios at once fast. Derived
    tables are a snapshot: call this again after registering more documents
    (``load_scenarios`` and ``kernel.facade.factory.new`` do). ``materialize=False`` leaves every view a
    plain view whatever the headers say (slow; for debugging).
    """
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables"
                             ).fetchall())
    models = sql_models.order((sql_models.parse(p) for p in sql_files()), kinds)
    for model in models:
        table = materialize and model.materialize
        for name in model.views:  # switching between a view and a table of the same name
            if table and kinds.get(name) == "VIEW":
                con.execute(f'DROP VIEW "{name}"')
            elif not table and kinds.get(name) == "BASE TABLE":
                con.execute(f'DROP TABLE "{name}"')
        try:
            for statement in sql_models.parsed(model, materialize):
                con.execute(statement)
        except duckdb.Error as exc:  # a broken view file is a programming error: say which
            raise RuntimeError(f"{model.path.name}: {exc}") from exc
