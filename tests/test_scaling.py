"""Faster opens and sweeps change no result: the YAML composer without tag resolution and the
path-free conversion give the trees the full conversion gives (every refusal still names its
key path and line); a sweep task prices alike on any number of threads, and one file cut into
row-group pieces for several workers prices like one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.bulk import price
from kernel.facade.saved import dumps
from kernel.io.synth import synth
from kernel.sweep.distributed import Piece, price_dataset, price_partition_group, split_files
from pipeline import yamlio
from pipeline.errors import DocumentError

_RESOLVING = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

scalars = (st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.booleans()
           | st.none() | st.text("ab yes~:#'\"-", max_size=6))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text("xyz", min_size=1, max_size=2), c, max_size=3),
                      max_leaves=25)


@settings(max_examples=80, deadline=None)
@given(values, st.sampled_from([None, True, False]))
def test_fast_reading_equals_the_full_conversion_of_resolved_nodes(value: object,
                                                                    flow: bool | None) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow)
    fast = yamlio.read_documents("v.yaml", text)
    full = [yamlio._convert(n, "v.yaml", "") for n in yaml.compose_all(text, Loader=_RESOLVING)]
    assert fast == full


@pytest.mark.parametrize(("text", "path", "message"), [
    ("a:\n  b: 1\n  b: 2\n", "a.b", "duplicate key 'b' (first at line 2)"),
    ("a:\n  - x: 1\n    <<: {y: 2}\n", "a[0].<<", "merge keys are not accepted"),
    ("a:\n  ? [1, 2]\n  : 3\n", "a", "a mapping key must be a plain scalar"),
])
def test_refusals_still_name_the_key_path(text: str, path: str, message: str) -> None:
    with pytest.raises(DocumentError) as err:
        yamlio.read_documents("bad.yaml", text)
    problem = err.value.problems[0]
    assert problem.path == path
    assert message in problem.message
    assert problem.line > 0


def test_a_sweep_task_prices_alike_on_any_number_of_threads(tmp_path: Path) -> None:
    """Workers price with cores / N threads: the partition's priced rows do not depend on it."""
    trace = synth(600, requests_per_batch=6, prefill_share=0.2, seed=5)
    src = tmp_path / "t.parquet"
    pq.write_table(trace, src)
    saved = dumps(kernel.open("llama-3.1-8b-h100-tp1"))
    empty = np.array([], dtype=np.int64)
    got = []
    for threads in (1, 2, 3):
        out = tmp_path / f"out-{threads}"
        (r,) = price_partition_group([str(src)], 0, empty, empty, [("s", saved, "d")],
                                     str(out), 1, threads=threads)
        assert r.error == "" and r.rows_in == trace.num_rows
        got.append(pq.read_table(r.output).replace_schema_metadata(None))
    assert got[0].num_rows > 0
    assert all(g.equals(got[0]) for g in got[1:])


def test_files_split_into_whole_row_groups_cover_each_group_once(tmp_path: Path) -> None:
    trace = synth(300, requests_per_batch=4, seed=2)
    path = tmp_path / "t.parquet"
    pq.write_table(trace, path, row_group_size=100)
    n = pq.ParquetFile(path).metadata.num_row_groups
    assert n > 5
    for k in (1, 2, 5, n, 4 * n):
        parts = split_files([str(path)], k)
        if k == 1:
            assert parts == [str(path)]
            continue
        assert all(isinstance(p, Piece) for p in parts)
        assert len(parts) == min(k, n)
        groups = [g for p in parts for g in p.row_groups]  # type: ignore[union-attr]
        assert groups == list(range(n))


def test_one_file_prices_on_every_worker_like_one_process(tmp_path: Path) -> None:
    """A single file, one scenario, 2 workers: cut into pieces at row groups that split
    batches, priced bit for bit as one process prices the whole file."""
    trace = synth(900, requests_per_batch=7, prefill_share=0.2, seed=8)
    path = tmp_path / "t.parquet"
    pq.write_table(trace, path, row_group_size=500)  # batches cut at the row-group seams
    name = "llama-3.1-8b-h100-tp1"
    result = price_dataset(path, tmp_path / "out", [name], "local:2")
    assert len(result.tasks) == 8  # four tasks per worker
    assert result.rows_in == trace.num_rows == result.rows_priced + result.rows_rejected
    got = pl.read_parquet(str(tmp_path / "out" / f"scenario={name}" / "*.parquet"),
                          hive_partitioning=False).sort("batch_id")
    assert got.equals(price(kernel.open(name), trace, identity=False).sort("batch_id"))
