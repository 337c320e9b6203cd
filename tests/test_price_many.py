"""One trace priced under several kernels at once (kernel/bulk/many.py): every kernel's files
hold exactly what ``price_file`` writes for it, whichever path the trace takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kernel
from kernel.bulk import many, price_file
from kernel.bulk.many import Output, price_table_many
from kernel.bulk.options import Tuning
from kernel.sweep import distributed

from .test_bulk import random_trace
from .test_bulk_io import _orders, _with_bad_rows

SCENARIOS = ("deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1",
             "nemotron3-ultra-h100-agg")
CHUNK = 4096  # several chunks per trace, batches carried across them


@pytest.fixture(scope="module")
def kernels() -> list[kernel.Kernel]:
    return [kernel.open(s) for s in SCENARIOS]


def _trace(order: str, seed: int) -> pa.Table:
    df = _with_bad_rows(random_trace(1500, seed), seed)
    return (df if order == "sorted" else _orders(df, seed)[order]).to_arrow()


def _outputs(root: Path, ks: list[kernel.Kernel], tag: str) -> list[Output]:
    return [Output(k, root / tag / f"{i}.parquet", root / tag / f"{i}-rejects.parquet",
                   {"who": f"kernel {i}"}, {"who": f"rejects {i}"}) for i, k in enumerate(ks)]


def _sorting(path: Path) -> set[object]:
    md = pq.ParquetFile(path).metadata
    return {md.row_group(i).sorting_columns for i in range(md.num_row_groups)}


def _same_file(a: Path, b: Path) -> None:
    assert pq.read_table(a).equals(pq.read_table(b), check_metadata=True)
    assert _sorting(a) == _sorting(b)


def _same_rejects(a: Path, b: Path) -> None:
    """The same rejected rows and reasons, and the same stamp. (Their order in the file follows
    how far validation ran ahead of pricing, which varies from run to run of price_file.)"""
    key = [("row", "ascending"), ("reason", "ascending"), ("column", "ascending")]
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.sort_by(key).equals(tb.sort_by(key), check_metadata=True)


@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled", "request-major"])
@pytest.mark.parametrize("seed", [5, 6])
def test_each_kernel_gets_what_price_file_writes(tmp_path: Path, kernels: list[kernel.Kernel],
                                                 monkeypatch: pytest.MonkeyPatch, order: str,
                                                 seed: int) -> None:
    table = _trace(order, seed)
    monkeypatch.setattr(many, "CHUNK_ROWS", CHUNK)
    alone = []
    for o in _outputs(tmp_path, kernels, "alone"):
        o.dst.parent.mkdir(parents=True, exist_ok=True)
        alone.append(price_file(o.kernel, table, o.dst, rejects=o.rejects, metadata=o.metadata,
                                rejects_metadata=o.rejects_metadata, progress=False,
                                tuning=Tuning(chunk_rows=CHUNK, workers=2)))
    shared_outputs = _outputs(tmp_path, kernels, "shared")
    shared_outputs[0].dst.parent.mkdir(parents=True)
    shared = price_table_many(shared_outputs, table, workers=2)
    for a, s, o in zip(alone, shared, shared_outputs, strict=True):
        assert (a.rows_in, a.rows_priced, a.rows_rejected, a.batches_priced,
                a.batches_over_limit, a.mode) == (s.rows_in, s.rows_priced, s.rows_rejected,
                                                  s.batches_priced, s.batches_over_limit,
                                                  s.mode)
        assert s.rows_rejected > 0  # the bad rows, in every kernel's rejects
        i = shared_outputs.index(o)
        _same_file(tmp_path / "alone" / f"{i}.parquet", o.dst)
        _same_rejects(tmp_path / "alone" / f"{i}-rejects.parquet", o.rejects)  # type: ignore[arg-type]


def test_price_files_default_chunk_is_the_one_shared() -> None:
    assert Tuning().chunk_rows == many.CHUNK_ROWS  # price_file's default tuning


@pytest.mark.parametrize("order, shared", [("sorted", True), ("reversed", True),
                                           ("shuffled", False)])
def test_contiguous_batches_are_validated_once(tmp_path: Path, kernels: list[kernel.Kernel],
                                               monkeypatch: pytest.MonkeyPatch, order: str,
                                               shared: bool) -> None:
    table = _trace(order, 7)
    calls = {"coerce": 0, "price_file": 0}
    real_coerce, real_price_file = many.Engine.coerce_task, many.price_file

    def counting_coerce(self: object, raw: pa.Table, offset: int) -> object:
        calls["coerce"] += 1
        return real_coerce(self, raw, offset)  # type: ignore[arg-type]

    def counting_price_file(*a: object, **kw: object) -> object:
        calls["price_file"] += 1
        return real_price_file(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(many.Engine, "coerce_task", counting_coerce)
    monkeypatch.setattr(many, "price_file", counting_price_file)
    monkeypatch.setattr(many, "CHUNK_ROWS", CHUNK)
    outputs = _outputs(tmp_path, kernels, "x")
    outputs[0].dst.parent.mkdir(parents=True)
    price_table_many(outputs, table, workers=1)
    chunks = -(-table.num_rows // CHUNK)
    if shared:
        assert calls["price_file"] == 0
        assert calls["coerce"] <= chunks + 1  # once per chunk, not once per kernel
    else:
        assert calls["price_file"] == len(kernels)


def test_a_sweep_task_prices_its_scenarios_together(tmp_path: Path,
                                                    kernels: list[kernel.Kernel],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.facade.saved import dumps

    src = tmp_path / "part-000.parquet"
    pq.write_table(_trace("sorted", 8), src)
    group = [(name, dumps(k), f"digest-{i}") for i, (name, k) in
             enumerate(zip(SCENARIOS, kernels, strict=True))]

    def alone(*_: object, **__: object) -> object:
        raise AssertionError("a scenario of the group was priced on its own")

    monkeypatch.setattr(distributed, "_price_table", alone)
    empty = np.array([], dtype=np.int64)
    results = distributed.price_partition_group([str(src)], 0, empty, empty, group,
                                                str(tmp_path / "out"), 1, threads=1)
    assert [r.error for r in results] == [""] * len(SCENARIOS)
    for r, k in zip(results, kernels, strict=True):
        expected = k.price(pl.read_parquet(src), on_reject="ignore", identity=False)
        got = pl.read_parquet(r.output).select(expected.columns)
        assert got.equals(expected)
        assert r.rows_in == r.rows_priced + r.rows_rejected
