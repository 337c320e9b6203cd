"""The threads around the pricing workers (decision RO15): the reader that takes chunks ahead
and the sink's writer thread. Whole runs through them are checked by the equality tests in
test_bulk_io.py; these check what those cannot see: where the work runs, how far ahead, and
what a failure on the writer thread does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel.bulk.ahead import prefetched
from kernel.bulk.sink import WRITE_AHEAD, Sink


class Counted:
    """Items 0..n-1, recording which thread took each and how many were taken."""

    def __init__(self, n: int):
        self.n = n
        self.taken = 0
        self.threads: set[str] = set()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.threads.add(threading.current_thread().name)
            self.taken += 1
            yield i


def _settled(c: Counted) -> int:
    """How many items the reader took once it has stopped taking more."""
    last = -1
    while c.taken != last:
        last = c.taken
        time.sleep(0.05)
    return last


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_prefetched_yields_every_item_in_order_taken_ahead_on_the_reader(depth: int) -> None:
    c = Counted(20)
    got = prefetched(c, depth)
    first = next(got)
    assert first == 0
    assert _settled(c) == depth + 2  # the one given, and depth + 1 already asked for
    assert [first, *got] == list(range(20))
    assert c.threads == {"blis-read_0"}


def test_prefetched_closed_early_takes_no_more() -> None:
    c = Counted(1000)
    got = prefetched(c, 2)
    assert [next(got) for _ in range(3)] == [0, 1, 2]
    got.close()
    assert _settled(c) <= 3 + 2 + 1


def test_prefetched_raises_the_reader_s_failure_in_place() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("row group 2 is corrupt")

    got = prefetched(failing(), 3)
    assert next(got) == 1
    with pytest.raises(ValueError, match="row group 2 is corrupt"):
        next(got)


def _table(n: int, typ: pa.DataType | None = None) -> pa.Table:
    return pa.table({"batch_id": pa.array(range(n), pa.int64()).cast(typ or pa.int64())})


def test_sink_writes_row_groups_in_order_on_its_thread(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    write = pq.ParquetWriter.write_table

    def spy(self: pq.ParquetWriter, t: pa.Table, **kw: object) -> None:
        seen.append(threading.current_thread().name)
        write(self, t, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", spy)
    out = tmp_path / "out.parquet"
    s = Sink(out, _table(0).schema, row_group_rows=10)
    for i in range(7):
        s.write(pa.table({"batch_id": pa.array(range(10 * i, 10 * i + 10), pa.int64())}))
    s.write(_table(3))
    s.close()
    f = pq.ParquetFile(out)
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [10] * 7 + [3]
    assert f.read().column("batch_id").to_pylist() == [*range(70), 0, 1, 2]
    assert seen and set(seen) == {"blis-write_0"}
    assert not list(tmp_path.glob(".*"))  # the temporary name is gone


def test_a_failure_on_the_writer_thread_is_raised_and_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    s = Sink(out, _table(0).schema, row_group_rows=1)
    s.write(_table(2))
    s.write(_table(2, pa.string()))  # not the file's schema: the writer thread fails
    with pytest.raises(Exception, match="schema"):
        s.close()
    s.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_stops_the_run_within_write_ahead_row_groups(tmp_path: Path) -> None:
    s = Sink(tmp_path / "out.parquet", _table(0).schema, row_group_rows=1)
    s.write(_table(1, pa.string()))
    with pytest.raises(Exception, match="schema"):
        for _ in range(WRITE_AHEAD + 2):
            s.write(_table(1))
    s.abort()
    assert list(tmp_path.iterdir()) == []
