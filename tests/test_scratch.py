"""The reused scratch databases of ``kernel.open`` (pipeline/scratch.py, decision RO18).

A scratch database is lent inside a transaction that is rolled back, runs without DuckDB's
optimiser and worker threads, and is reused across scenarios, threads' turns and failures.
None of that may change a resolution: each is checked against a fresh, optimised database.
"""

from __future__ import annotations

import multiprocessing
import threading

import duckdb
import pytest

from kernel.pool import build
from pipeline import db, normalise, scratch
from pipeline.errors import RefusalError
from pipeline.load import open_inputs

from .embedded import BUILDABLE
from .resolution_support import DS3, inputs, variant


def _fresh_resolution(inputs: object) -> object:
    con = db.open_db(apply=False)  # DuckDB's defaults: optimiser on, worker threads
    try:
        return build.resolve(inputs, con)  # type: ignore[arg-type]
    finally:
        con.close()


def _scratch_resolution(inputs: object) -> object:
    return build._resolve(inputs, None)  # type: ignore[arg-type]  # bypasses the memo


@pytest.mark.parametrize("name", BUILDABLE)
def test_every_embedded_pool_resolves_as_in_a_fresh_optimised_database(name: str) -> None:
    for pool in range(len(open_inputs(name).deployment.pools)):
        pool_inputs = open_inputs(name, pool=pool)
        fresh = _fresh_resolution(pool_inputs)
        # Twice: the second loan reuses the database the first one rolled back.
        assert _scratch_resolution(pool_inputs) == fresh
        assert _scratch_resolution(pool_inputs) == fresh


def _state(con: duckdb.DuckDBPyConnection) -> tuple[object, ...]:
    """What a borrower could see: every relation, and the rows of every document table."""
    relations = con.execute("SELECT table_name, table_type FROM information_schema.tables "
                            "ORDER BY table_name").fetchall()
    rows = {name: con.execute(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
            for name in (*normalise.SCHEMAS, "loaded_documents")}
    return tuple(relations), tuple(sorted(rows.items()))


def test_a_loan_that_fails_halfway_leaves_the_database_as_it_was() -> None:
    with scratch.scratch_db() as con:
        before = _state(con)
        first = con
    assert all(n == 0 for _, n in before[1])
    assert not any(kind == "VIEW" for _, kind in before[0])
    with pytest.raises(RuntimeError, match="halfway"), scratch.scratch_db() as con:
        assert con is first  # reused, not set up again
        db.register(con, open_inputs("llama-3.1-8b-h100-tp1"))
        db.run_views(con)
        assert _state(con) != before
        raise RuntimeError("halfway")
    with scratch.scratch_db() as con:
        assert _state(con) == before


def test_a_refused_pool_is_refused_again_and_leaves_nothing_behind() -> None:
    with scratch.scratch_db() as con:
        before = _state(con)
    refused = variant(inputs(DS3), engine={"cache_dtype": "fp8_inc"})  # a refusal row
    for _ in range(2):
        with pytest.raises(RefusalError) as caught:
            build._resolve(refused, None)
        assert caught.value.setting == "cache_dtype"
    with scratch.scratch_db() as con:
        assert _state(con) == before


def test_concurrent_borrowers_get_databases_of_their_own() -> None:
    inside = threading.Barrier(2)
    seen: list[int] = []

    def borrow() -> None:
        with scratch.scratch_db() as con:
            seen.append(id(con))
            inside.wait(timeout=30)  # both loans are open at once

    threads = [threading.Thread(target=borrow) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 2


def test_a_database_set_up_before_a_new_cost_law_is_not_lent_again() -> None:
    def install(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("CREATE OR REPLACE MACRO scratch_probe() AS 42")

    with scratch.scratch_db() as con:
        old = con
    db.add_udf_installer(install)
    try:
        with scratch.scratch_db() as con:
            assert con is not old
            assert con.execute("SELECT scratch_probe()").fetchall() == [(42,)]
    finally:
        db._UDF_INSTALLERS.remove(install)
    with scratch.scratch_db():  # drop the database that knows the probe
        pass


def _child_borrows(parent_ids: list[int], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with scratch.scratch_db() as con:
        out.put((id(con) in parent_ids, len(scratch._inherited),
                 con.execute("SELECT count(*) FROM loaded_documents").fetchall()[0][0]))


def test_a_forked_child_never_borrows_its_parents_database() -> None:
    with scratch.scratch_db() as con:
        parent = [id(con)]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_borrows, args=(parent, out))
    child.start()
    reused, inherited, documents = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not reused
    assert inherited >= 1
    assert documents == 0
