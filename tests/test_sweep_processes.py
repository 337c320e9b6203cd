"""Sweeps on local worker processes: each scenario built once, workers never rebuild, results
identical to single-process bulk, a dead worker's tasks run again, refusals reported."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kernel
from kernel.bulk import price
from kernel.facade.saved import dumps
from kernel.io.synth import synth
from kernel.sweep import distributed
from kernel.sweep.distributed import _Processes, price_dataset, price_partition

SCENARIOS = ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1"]


@pytest.fixture(scope="module")
def trace() -> pa.Table:
    return synth(800, requests_per_batch=8, prefill_share=0.1, seed=11)


def _partitions(table: pa.Table, out: Path, cuts: list[int]) -> Path:
    out.mkdir(parents=True)
    bounds = [0, *cuts, table.num_rows]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        pq.write_table(table.slice(a, b - a), out / f"part-{i:03d}.parquet")
    return out


def test_sweep_on_processes_builds_once_and_equals_bulk(tmp_path: Path,
                                                        trace: pa.Table) -> None:
    n = trace.num_rows
    src = _partitions(trace, tmp_path / "src", [n // 3 + 1, 2 * n // 3 + 2])  # inside batches
    result = price_dataset(src, tmp_path / "out", SCENARIOS, "local:2")
    assert result.kernels_built == len(SCENARIOS)
    assert result.executor.startswith("local:2")
    assert len(result.tasks) == 3 * len(SCENARIOS)
    assert result.rows_in == len(SCENARIOS) * n == result.rows_priced + result.rows_rejected
    for name in SCENARIOS:
        got = pl.read_parquet(str(tmp_path / "out" / f"scenario={name}" / "*.parquet"),
                              hive_partitioning=False).sort("batch_id")
        # (hive-partitioned files leave scenario and pool to the path: identity=False)
        assert got.equals(price(kernel.open(name), trace, identity=False).sort("batch_id"))
    assert sorted(result.summary["scenario"].to_list()) == sorted(SCENARIOS)


def test_a_task_prices_from_the_saved_pool_without_building(
        tmp_path: Path, trace: pa.Table, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = dumps(kernel.open(SCENARIOS[1]))

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a pricing task built a kernel")

    from kernel.facade import factory

    monkeypatch.setattr(factory, "resolve", refuse)  # every kernel is built through it
    monkeypatch.setattr(distributed, "open_pool", refuse)
    monkeypatch.setattr(distributed, "_LOADED", {})
    src = tmp_path / "t.parquet"
    pq.write_table(trace, src)
    empty = np.array([], dtype=np.int64)
    for _ in range(2):  # the second task reuses the loaded kernel
        r = price_partition([str(src)], 0, empty, empty, SCENARIOS[1], saved, "d1",
                            str(tmp_path / "o"), 1, threads=1)
        assert r.error == "" and r.rows_in == trace.num_rows
    assert list(distributed._LOADED) == ["d1"]


def _die_once(marker: str, value: int) -> int:
    """Kill this worker process the first time (the marker file says it happened)."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return value * 2


def test_a_dead_worker_process_is_replaced_and_its_tasks_run_again(tmp_path: Path) -> None:
    runner = _Processes(2)
    try:
        marker = str(tmp_path / "died")
        assert runner.run(_die_once, [(marker, v) for v in range(6)], retries=2) == [
            0, 2, 4, 6, 8, 10]
        assert Path(marker).exists()  # the fault really happened
    finally:
        runner.close()


def test_refused_or_unknown_scenarios_are_listed(tmp_path: Path, trace: pa.Table) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(trace.slice(0, 50), src)
    with pytest.raises(RuntimeError, match=r"scenario no-such-scenario: .*no-such-scenario"):
        price_dataset(src, tmp_path / "o", [SCENARIOS[1], "no-such-scenario"], "local:1")
    with pytest.raises(ValueError, match="local:N needs N >= 1"):
        price_dataset(src, tmp_path / "o", SCENARIOS[:1], "local:0")


def test_one_task_prices_a_partition_under_several_scenarios(tmp_path: Path,
                                                             trace: pa.Table) -> None:
    n = trace.num_rows
    src = _partitions(trace, tmp_path / "src", [n // 4 + 3, n // 2 + 1, 3 * n // 4 + 5])
    result = price_dataset(src, tmp_path / "out", SCENARIOS, "local:1")  # 1 group: 4 tasks
    assert result.kernels_built == len(SCENARIOS) and len(result.tasks) == 4 * len(SCENARIOS)
    for name in SCENARIOS:
        got = pl.read_parquet(str(tmp_path / "out" / f"scenario={name}" / "*.parquet"),
                              hive_partitioning=False).sort("batch_id")
        assert got.equals(price(kernel.open(name), trace, identity=False).sort("batch_id"))
    part = src / "part-002.parquet"
    pq.write_table(pq.read_table(part).drop_columns(["computed"]), part)
    with pytest.raises(RuntimeError) as err:
        price_dataset(src, tmp_path / "out2", SCENARIOS, "local:1")
    for name in SCENARIOS:  # the bad partition is reported under every scenario
        assert f"scenario {name} partition 2" in str(err.value)
