"""Pricing options as types (issue 30 item 3): one set of keyword-only options with one set
of defaults on every pricing entry point, engine tuning as a frozen ``Tuning`` that never
changes a number, and one vocabulary for rejects (``strict`` a deprecated alias)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel import bulk
from kernel.bulk.options import ON_REJECT, ORDERS, Tuning
from kernel.io.trace import RejectedRowError

from .bulk_pools import pool
from .test_bulk import random_trace

FILE_ONLY = {"rejects", "progress", "out_format", "metadata", "rejects_metadata"}
FACADE_ONLY = {"trace_format"}


def _options(fn: object, skip: int) -> dict[str, inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())[skip:]  # type: ignore[arg-type]
    return {p.name: p for p in params}


ENTRY_POINTS = {
    "bulk.price": (bulk.price, 2), "bulk.price_result": (bulk.price_result, 2),
    "bulk.price_file": (bulk.price_file, 3), "Kernel.price": (kernel.Kernel.price, 2),
    "Kernel.price_result": (kernel.Kernel.price_result, 2),
}


def test_every_entry_point_takes_the_same_typed_keyword_only_options() -> None:
    reference = _options(bulk.price, 2)
    assert "tuning" in reference and "on_reject" in reference
    for name, (fn, skip) in ENTRY_POINTS.items():
        got = _options(fn, skip)
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in got.values()), name
        assert all(p.annotation is not inspect.Parameter.empty for p in got.values()), name
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in got.values()), name
        options = {n: p for n, p in got.items() if n not in FILE_ONLY | FACADE_ONLY}
        assert set(options) == set(reference), name
        for n, p in options.items():
            want = "ignore" if (n == "on_reject" and name == "bulk.price_file") else \
                reference[n].default
            assert p.default == want, (name, n)


def test_tuning_is_frozen_and_refuses_what_it_cannot_run() -> None:
    t = Tuning(order="sort", chunk_rows=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.order = "auto"  # type: ignore[misc]
    for bad, what in ((dict(order="random"), "order must be one of"),
                      (dict(chunk_rows=0), "chunk_rows must be a positive integer"),
                      (dict(chunk_rows=True), "chunk_rows must be a positive integer"),
                      (dict(workers=0), "workers must be None or a positive integer"),
                      (dict(memory_budget="lots"), "Tuning.memory_budget='lots': expected"),
                      (dict(sort_memory="1 parsec"), "Tuning.sort_memory")):
        with pytest.raises(ValueError, match=what):
            Tuning(**bad)  # type: ignore[arg-type]
    assert set(ORDERS) == {"auto", "sort", "external"}


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 300), st.integers(0, 10_000), st.sampled_from(("auto", "sort")),
       st.integers(1, 500), st.sampled_from((1, 2_000, None)), st.integers(1, 3))
def test_tuning_never_changes_a_priced_number(n: int, seed: int, order: str, chunk: int,
                                               budget: int | None, workers: int) -> None:
    r = pool()
    df = random_trace(n, seed)
    want = bulk.price_result(r, df, on_reject="ignore")
    got = bulk.price_result(r, df.sample(fraction=1.0, shuffle=True, seed=seed),
                            on_reject="ignore",
                            tuning=Tuning(order=order, chunk_rows=chunk, memory_budget=budget,
                                          workers=workers))
    assert got.priced.equals(want.priced)
    assert got.counts.rows_in == got.counts.rows_priced + got.counts.rows_rejected


def _bad(n: int = 40) -> pl.DataFrame:
    df = random_trace(n, 3)
    return df.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(-1)
                           .otherwise(pl.col("scheduled")).alias("scheduled"))


def test_strict_is_a_deprecated_spelling_of_on_reject_raise(tmp_path: Path) -> None:
    r = pool()
    with pytest.warns(DeprecationWarning, match="on_reject='raise'"), \
            pytest.raises(RejectedRowError):
        bulk.price(r, _bad(), strict=True)
    with pytest.raises(RejectedRowError):
        bulk.price(r, _bad(), on_reject="raise")
    with pytest.warns(DeprecationWarning), pytest.raises(RejectedRowError):
        bulk.price_file(r, _bad(), tmp_path / "o.parquet", strict=True, progress=False)
    with pytest.raises(RejectedRowError):
        bulk.price_file(r, _bad(), tmp_path / "o.parquet", on_reject="raise", progress=False)
    assert not (tmp_path / "o.parquet").exists()  # a failed run leaves no output
    with pytest.warns(DeprecationWarning):  # strict=False: the entry point's own default
        c = bulk.price_file(r, _bad(), tmp_path / "o.parquet", strict=False, progress=False)
    assert c.rows_rejected >= 1 and c.rows_in == c.rows_priced + c.rows_rejected


@pytest.mark.parametrize("entry", ["price", "price_result", "price_file"])
def test_an_unknown_reject_mode_names_the_allowed_ones(entry: str, tmp_path: Path) -> None:
    fn = getattr(bulk, entry)
    args = (pool(), _bad()) + ((tmp_path / "o.parquet",) if entry == "price_file" else ())
    with pytest.raises(ValueError) as err:
        fn(*args, on_reject="drop")
    for mode in ON_REJECT:
        assert repr(mode) in str(err.value)


def test_the_cli_spells_the_same_tuning(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kernel.cli import cli

    src = tmp_path / "t.parquet"
    random_trace(300, 9).sample(fraction=1.0, shuffle=True, seed=1).write_parquet(src)
    runner = CliRunner()
    outs = []
    for extra in ([], ["--order", "sort", "--memory-budget", "1", "--workers", "1",
                       "--tmp-dir", str(tmp_path / "spill"), "--chunk-rows", "17"]):
        out = tmp_path / f"o{len(outs)}.parquet"
        res = runner.invoke(cli, ["price", str(src), "-s", "llama-3.1-8b-h100-tp1", "-o",
                                  str(out), "--no-progress", *extra])
        assert res.exit_code == 0, res.output
        outs.append(pl.read_parquet(out))
    assert outs[1].equals(outs[0])  # tuning never moves a number
    bad = runner.invoke(cli, ["price", str(src), "-s", "llama-3.1-8b-h100-tp1", "-o",
                              str(tmp_path / "x.parquet"), "--memory-budget", "lots"])
    assert bad.exit_code != 0 and "memory_budget='lots'" in bad.output
