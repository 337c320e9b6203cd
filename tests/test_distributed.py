"""Scale-out on a local Dask cluster: identical to single-process bulk, even with faults."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kernel
from kernel.bulk import price
from kernel.io.synth import synth
from kernel.sweep.distributed import price_dataset, straddling_owners

SCENARIOS = ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-8b-h100-tp1"]


def test_straddling_batches_are_owned_by_their_first_partition() -> None:
    parts = [np.array([1, 2, 3]), np.array([3, 4]), np.array([4, 5, 3]), np.array([9])]
    owners = straddling_owners(parts)
    assert {k: v.tolist() for k, v in owners.items()} == {0: [3], 1: [4]}
    assert straddling_owners([np.array([1]), np.array([2])]) == {}


def _write_partitions(table: pa.Table, out: Path, cuts: list[int]) -> None:
    """Cut the trace at row offsets that fall inside batches, one file per piece."""
    out.mkdir(parents=True)
    bounds = [0, *cuts, table.num_rows]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        pq.write_table(table.slice(a, b - a), out / f"part-{i:03d}.parquet")


def _read_priced(root: Path, scenario: str) -> pl.DataFrame:
    frame = pl.read_parquet(str(root / f"scenario={scenario}" / "*.parquet"),
                            hive_partitioning=False)
    return frame.sort("batch_id")


@pytest.fixture(scope="module")
def client():  # type: ignore[no-untyped-def]
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    with Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def trace() -> pa.Table:
    return synth(1500, requests_per_batch=8, prefill_share=0.1, seed=7)


def test_cluster_equals_single_process_with_straddling_batches(tmp_path: Path, client,  # type: ignore[no-untyped-def]
                                                                trace: pa.Table) -> None:
    ids = trace.column("batch_id").to_numpy()
    # Cut inside batches: the rows on each side of every cut share a batch id.
    cuts = [int(n) for n in np.linspace(0, len(ids), 6)[1:-1]]
    assert all(ids[c - 1] == ids[c] for c in cuts)
    src = tmp_path / "trace"
    _write_partitions(trace, src, cuts)
    result = price_dataset(src, tmp_path / "out", SCENARIOS, client)
    assert result.rows_in == trace.num_rows * len(SCENARIOS)
    assert result.rows_in == result.rows_priced + result.rows_rejected
    assert len(result.tasks) == 5 * len(SCENARIOS) and not result.failures
    for name in SCENARIOS:
        expected = price(kernel.open(name), trace, identity=False).sort("batch_id")  # (hive)
        got = _read_priced(tmp_path / "out", name)
        assert got.height == len(np.unique(ids))
        assert got.equals(expected), name
    summary = pl.read_parquet(tmp_path / "out" / "summary.parquet")
    assert summary["scenario"].to_list() == sorted(SCENARIOS)
    # every output is stamped: the summary with its scenarios and counts, each partition
    # with its scenario and its own counts (issue 14)
    from kernel.io.stamp import read_stamp

    top = read_stamp(tmp_path / "out" / "summary.parquet")
    assert top is not None and top.kind == "sweep-summary"
    assert top.scenarios == tuple(sorted(SCENARIOS)) and top.counts["rows_in"] == result.rows_in
    for name in SCENARIOS:
        assert top.documents[f"{name}/chip"] == kernel.open(name).documents()["chip"]
        parts = [read_stamp(p) for p in (tmp_path / "out" / f"scenario={name}").glob("*.parquet")]
        assert {(p.kind, p.scenario) for p in parts if p} == {("sweep-partition", name)}
        assert sum(p.counts["rows_in"] for p in parts if p) == trace.num_rows
    assert (summary["batches"] == len(np.unique(ids))).all()


def test_bad_rows_are_rejected_and_counted_across_the_cluster(tmp_path: Path, client,  # type: ignore[no-untyped-def]
                                                              trace: pa.Table) -> None:
    bad = trace.slice(0, 200).to_pydict()
    bad["scheduled"][5] = -3
    bad["computed"][17] = None
    src = tmp_path / "trace"
    src.mkdir()
    pq.write_table(pa.table(bad), src / "part-000.parquet")
    pq.write_table(trace.slice(200, 300), src / "part-001.parquet")
    result = price_dataset(src, tmp_path / "out", SCENARIOS[:1], client)
    assert result.rows_in == 500 and result.rows_rejected >= 2
    assert result.rows_in == result.rows_priced + result.rows_rejected
    files = sorted((tmp_path / "out" / "rejects").rglob("*.parquet"))
    per_file = {f.name: pl.read_parquet(f, hive_partitioning=False).height for f in files}
    assert sum(per_file.values()) == result.rows_rejected
    assert {name for name, n in per_file.items() if n} == {"part-00000.parquet"}


def test_unreadable_partition_is_reported_not_dropped(tmp_path: Path, client,  # type: ignore[no-untyped-def]
                                                      trace: pa.Table) -> None:
    src = tmp_path / "trace"
    src.mkdir()
    pq.write_table(trace.slice(0, 100), src / "part-000.parquet")
    pq.write_table(trace.slice(100, 100).drop_columns(["computed"]), src / "part-001.parquet")
    with pytest.raises(RuntimeError) as err:
        price_dataset(src, tmp_path / "out", SCENARIOS[:1], client)
    assert "partition 1" in str(err.value) and "part-001.parquet" in str(err.value)


def test_a_worker_killed_mid_run_is_retried_with_identical_results(tmp_path: Path,
                                                                    trace: pa.Table) -> None:
    from distributed import Client, LocalCluster

    src = tmp_path / "trace"
    ids = trace.column("batch_id").to_numpy()
    cuts = [int(n) for n in np.linspace(0, len(ids), 41)[1:-1]]
    _write_partitions(trace, src, cuts)
    out = tmp_path / "out"
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    with Client(cluster) as c:
        pids = list(c.run(os.getpid).values())
        done: dict[str, object] = {}

        def run() -> None:
            try:
                done["result"] = price_dataset(src, out, SCENARIOS[:1], c, retries=5)
            except Exception as exc:  # surfaced below
                done["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.time() + 60
        while not list(out.glob("scenario=*/*.parquet")) and time.time() < deadline:
            time.sleep(0.02)
        os.kill(pids[0], signal.SIGKILL)  # mid-run: some partitions are done, others are not
        assert worker.is_alive(), "the run finished before the fault: nothing was tested"
        worker.join(120)
        assert "error" not in done, done.get("error")
        result = done["result"]
        assert pids[0] not in c.run(os.getpid).values()  # the fault really happened
    cluster.close()
    assert result.rows_in == trace.num_rows == result.rows_priced + result.rows_rejected
    expected = price(kernel.open(SCENARIOS[0]), trace, identity=False).sort("batch_id")
    assert _read_priced(out, SCENARIOS[0]).equals(expected)


def test_price_command_on_a_local_cluster(tmp_path: Path, trace: pa.Table) -> None:
    from click.testing import CliRunner

    from kernel.cli import cli

    src = tmp_path / "trace"
    ids = trace.column("batch_id").to_numpy()
    _write_partitions(trace, src, [int(len(ids) * 0.5)])
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["price", str(src), "--scenario", SCENARIOS[0], "-o",
                                      str(out), "--cluster", "local:2"])
    assert result.exit_code == 0, result.output
    assert f"rows in {trace.num_rows:,} = priced {trace.num_rows:,} + rejected 0" in result.output
    expected = price(kernel.open(SCENARIOS[0]), trace, identity=False).sort("batch_id")
    assert _read_priced(out, SCENARIOS[0]).equals(expected)
    refused = CliRunner().invoke(cli, ["price", "-s", "deepseek-v3-h200-fp8-sglang-tp8", str(src), "-o", str(tmp_path / "o2"),
                                       "--cluster", "local", "--strict"])
    assert refused.exit_code == 2 and "--strict cannot be combined with --cluster" in refused.output


def test_sweep_command_writes_a_summary(tmp_path: Path, trace: pa.Table) -> None:
    from click.testing import CliRunner

    from kernel.cli import cli

    src = tmp_path / "t.parquet"
    pq.write_table(trace, src)
    result = CliRunner().invoke(cli, ["sweep", str(src), "--scenario", "llama-3.1-8b-h100*",
                                      "--scenario", SCENARIOS[0], "-o", str(tmp_path / "o"),
                                      "--cluster", "local:2"])
    assert result.exit_code == 0, result.output
    summary = pl.read_parquet(tmp_path / "o" / "summary.parquet")
    assert sorted(summary["scenario"].to_list()) == sorted(
        ["llama-3.1-8b-h100-tp1", SCENARIOS[0]])
    assert f"rows in {2 * trace.num_rows:,}" in result.output
