"""Price partitioned traces, and sweeps over many deployments, on local processes or Dask.

One task prices one input partition under one scenario with the bulk path and writes one output
partition. When there are too few partitions × scenarios to keep every worker busy, files are
split into pieces of whole row groups (:class:`Piece`), so one big file prices on every worker. Every batch is priced whole: a batch whose rows straddle input partitions is moved to
the first partition that holds it before pricing. Each scenario's kernel is built exactly once
per sweep (by a build task, in parallel) and handed to the pricing tasks as a saved resolved pool
(:mod:`kernel.facade.saved`), so no worker reads YAML or resolves again; a worker keeps the kernels it
has loaded. A task whose worker dies is retried; a partition that cannot be priced is reported
with its reason; the totals always balance (rows in = rows priced + rows rejected).

Executors: ``local[:N]`` (the default) is a pool of N local processes, the fastest on one
machine (``docs/scaling.md``); ``dask-local:N`` a local Dask cluster; an ADDRESS or a Dask
``Client`` a Dask cluster of any size.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import safe_output
from pipeline.load import Repos

from ..bulk import price_file
from ..bulk.many import Output, price_table_many
from ..bulk.options import Tuning
from ..facade.factory import open_pool
from ..facade.saved import dumps, loads
from ..io.stamp import Stamp, for_kernel, read_stamp, stamped

if TYPE_CHECKING:
    from ..bulk.engine import PriceCounts
    from ..bulk.many import Output

BATCH_ID = "batch_id"


@dataclass(frozen=True)
class PartitionResult:
    """What one (partition, scenario) task did."""

    scenario: str
    partition: int
    rows_in: int
    rows_priced: int
    rows_rejected: int
    batches: int
    output: str
    error: str = ""


@dataclass
class SweepResult:
    """A whole run: per-task results, the summary per scenario, and the balanced totals."""

    tasks: list[PartitionResult]
    summary: pl.DataFrame
    seconds: float
    failures: list[PartitionResult] = field(default_factory=list)
    kernels_built: int = 0  # build tasks run: one per scenario
    executor: str = ""

    @property
    def rows_in(self) -> int:
        return sum(t.rows_in for t in self.tasks)

    @property
    def rows_priced(self) -> int:
        return sum(t.rows_priced for t in self.tasks)

    @property
    def rows_rejected(self) -> int:
        return sum(t.rows_rejected for t in self.tasks)


@dataclass(frozen=True)
class Piece:
    """Some row groups of one parquet file, priced as one partition."""

    path: str
    row_groups: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.path} (row groups {self.row_groups[0]}-{self.row_groups[-1]})"


Part = str | Piece  # a whole file, or a piece of one


def _read(part: Part, columns: list[str] | None = None) -> pa.Table:
    if isinstance(part, Piece):
        return pq.ParquetFile(part.path).read_row_groups(list(part.row_groups), columns=columns)
    return pq.read_table(part, columns=columns)


def _groups_that_may_hold(piece: Piece, column: str, ids: np.ndarray) -> Piece:
    """The row groups of ``piece`` whose statistics of ``column`` overlap ``ids`` (all of
    them when a group has no statistics)."""
    meta = pq.ParquetFile(piece.path).metadata
    paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
    at = paths.index(column) if column in paths else -1
    lo, hi = ids.min(), ids.max()
    keep = []
    for g in piece.row_groups:
        stats = meta.row_group(g).column(at).statistics if at >= 0 else None
        if stats is None or not stats.has_min_max or not (stats.max < lo or stats.min > hi):
            keep.append(g)
    return Piece(piece.path, tuple(keep) or piece.row_groups[:1])


def split_files(files: Sequence[str], pieces_per_file: int) -> list[Part]:
    """Each file as up to ``pieces_per_file`` pieces of consecutive, whole row groups (a file
    of one row group, or ``pieces_per_file`` <= 1, stays whole)."""
    if pieces_per_file <= 1:
        return list(files)
    parts: list[Part] = []
    for f in files:
        try:
            n = pq.ParquetFile(f).metadata.num_row_groups
        except Exception:  # unreadable: stays whole, and its task reports why
            n = 1
        k = min(pieces_per_file, n)
        if k <= 1:
            parts.append(f)
            continue
        bounds = [i * n // k for i in range(k + 1)]
        parts.extend(Piece(f, tuple(range(a, b))) for a, b in zip(bounds, bounds[1:],
                                                                 strict=False))
    return parts


def list_partitions(src: str | os.PathLike[str]) -> list[Path]:
    """The parquet files of a partitioned dataset (a directory, searched recursively, or one file)."""
    path = Path(src)
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no parquet partitions under {path}")
    return files


def _ids_of(part: Part, column: str) -> np.ndarray:
    """The distinct batch ids of one partition (no sort when they already increase)."""
    ids = _read(part, [column]).column(column).drop_null()
    values = ids.to_numpy(zero_copy_only=False)
    if values.size and bool(np.all(values[1:] >= values[:-1])):
        keep = np.ones(values.size, dtype=bool)
        keep[1:] = values[1:] != values[:-1]
        return values[keep]
    return np.unique(values)


def straddling_owners(partition_ids: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
    """For each partition, the batch ids it must fetch from later partitions (it owns them).

    A batch id present in several partitions is owned by the first of them.
    """
    if not partition_ids:
        return {}
    every = np.concatenate(partition_ids)
    where = np.concatenate([np.full(len(ids), i) for i, ids in enumerate(partition_ids)])
    order = np.lexsort((where, every))
    every, where = every[order], where[order]
    first = np.ones(len(every), dtype=bool)
    first[1:] = every[1:] != every[:-1]
    owner_of = np.maximum.accumulate(np.where(first, np.arange(len(every)), 0))
    shared = ~first  # an id seen again in a later partition
    owners: dict[int, np.ndarray] = {}
    if shared.any():
        ids = every[shared]
        own = where[owner_of[shared]]
        for p in np.unique(own):
            owners[int(p)] = np.unique(ids[own == p])
    return owners


def _read_partition(files: Sequence[Part], index: int, owned: np.ndarray,
                    foreign: np.ndarray, column: str, donors: Sequence[int] = ()) -> pa.Table:
    """Partition ``index`` without the batches it gave away, plus the rows of those it owns
    (read from the ``donors``, the later partitions that hold some of them)."""
    own = _read(files[index])
    if len(foreign):
        keep = pc.invert(pc.is_in(own.column(column), value_set=pa.array(foreign)))
        own = own.filter(pc.fill_null(keep, True))
    if not len(owned):
        return own
    extra = [own]
    for j in donors:
        donor = files[j]
        if isinstance(donor, Piece):
            other = _read(_groups_that_may_hold(donor, column, owned))
            other = other.filter(pc.fill_null(pc.is_in(other.column(column),
                                                       value_set=pa.array(owned)), False))
        else:
            other = pq.read_table(donor, filters=[(column, "in", owned.tolist())])
        if other.num_rows:
            extra.append(other.select(own.column_names).cast(own.schema))
    # One chunk: the bulk path prices a table of one chunk faster than the same rows in two.
    return pa.concat_tables(extra).combine_chunks() if len(extra) > 1 else own


def build_kernel(scenario: str, pool: int, repos: Repos) -> bytes:
    """A build task: the scenario's kernel as a saved resolved pool (:func:`kernel.facade.saved.dumps`)."""

    return dumps(open_pool(scenario, repos, pool))


_LOADED: dict[str, Any] = {}  # per worker process: saved-pool digest -> Kernel


def _worker_kernel(digest: str, saved: bytes) -> Any:
    """The kernel of a saved pool, loaded once per worker process and reused by every task."""
    k = _LOADED.get(digest)
    if k is None:
        if len(_LOADED) >= 64:
            _LOADED.clear()
        k = _LOADED[digest] = loads(saved, f"saved pool {digest[:12]}")
    return k


def scenario_key(scenario: str) -> str:
    """A filesystem-safe label for a scenario (its stem when it is a path)."""
    stem = Path(scenario).stem if scenario.endswith((".yaml", ".yml")) else scenario
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)


def price_partition(files: Sequence[Part], index: int, owned: np.ndarray, foreign: np.ndarray,
                    scenario: str, saved: bytes, digest: str, dst: str, decode_threshold: int,
                    column: str = BATCH_ID, donors: Sequence[int] = (),
                    threads: int | None = None) -> PartitionResult:
    """Price one partition under one scenario (its kernel given as a saved pool, ``saved``,
    identified by ``digest``) and write its priced and rejected rows with ``threads`` pricing
    threads (None: the cores).

    Outputs are written aside and renamed by the bulk path, so a retried task never leaves half
    a file behind.
    """
    return price_partition_group(files, index, owned, foreign, [(scenario, saved, digest)], dst,
                                 decode_threshold, column, donors, threads)[0]


def price_partition_group(files: Sequence[Part], index: int, owned: np.ndarray,
                          foreign: np.ndarray, kernels: Sequence[tuple[str, bytes, str]],
                          dst: str, decode_threshold: int, column: str = BATCH_ID,
                          donors: Sequence[int] = (), threads: int | None = None
                          ) -> list[PartitionResult]:
    """:func:`price_partition` under several scenarios ((name, saved pool, digest) each),
    reading the partition once: one result per scenario, in order."""
    try:
        table = _read_partition(files, index, owned, foreign, column, donors)
    except Exception as exc:  # reported, never dropped: the caller lists it
        return [_failed(name, index, dst, exc) for name, _, _ in kernels]
    if len(kernels) > 1:
        try:  # the rows validated and grouped once for every scenario
            return _price_table_many(table, files, index, kernels, dst, decode_threshold,
                                     column, threads)
        except Exception:  # priced one by one below, so each scenario reports its own error
            pass
    return [_price_table(table, files, index, name, saved, digest, dst, decode_threshold,
                         column, threads) for name, saved, digest in kernels]


def _failed(scenario: str, index: int, dst: str, exc: Exception) -> PartitionResult:
    key = scenario_key(scenario)
    out = Path(dst) / f"scenario={key}" / f"part-{index:05d}.parquet"
    return PartitionResult(key, index, 0, 0, 0, 0, str(out), f"{type(exc).__name__}: {exc}")


def _output(files: Sequence[Part], index: int, scenario: str, saved: bytes, digest: str,
            dst: str, decode_threshold: int) -> Output:
    """Where one scenario's rows of partition ``index`` go, with their stamps."""

    key = scenario_key(scenario)
    out = Path(dst) / f"scenario={key}" / f"part-{index:05d}.parquet"
    rejects = Path(dst) / "rejects" / f"scenario={key}" / f"part-{index:05d}.parquet"
    k = _worker_kernel(digest, saved)
    out.parent.mkdir(parents=True, exist_ok=True)
    rejects.parent.mkdir(parents=True, exist_ok=True)
    part = files[index]
    pieces = ({"row_groups": f"{part.row_groups[0]}-{part.row_groups[-1]}"}
              if isinstance(part, Piece) else {})
    made = for_kernel(k, "sweep-partition", trace=part.path if isinstance(part, Piece) else part,
                      decode_threshold=decode_threshold, sm_budget=0, **pieces)
    return Output(k, out, rejects, made.to_metadata(),
                  made.as_kind("sweep-rejects").to_metadata())


def _columns(column: str) -> dict[str, str] | None:
    return None if column == BATCH_ID else {BATCH_ID: column}


def _result(scenario: str, index: int, counts: PriceCounts, out: Path) -> PartitionResult:
    return PartitionResult(scenario_key(scenario), index, counts.rows_in, counts.rows_priced,
                           counts.rows_rejected, counts.batches_priced, str(out))


def _price_table(table: pa.Table, files: Sequence[Part], index: int, scenario: str,
                 saved: bytes, digest: str, dst: str, decode_threshold: int, column: str,
                 threads: int | None) -> PartitionResult:

    try:
        o = _output(files, index, scenario, saved, digest, dst, decode_threshold)
        counts = price_file(o.kernel, table, o.dst, rejects=o.rejects, progress=False,
                            decode_threshold=decode_threshold, tuning=Tuning(workers=threads),
                            metadata=o.metadata, rejects_metadata=o.rejects_metadata,
                            columns=_columns(column), identity=False)  # (hive path says it)
    except Exception as exc:  # reported, never dropped: the caller lists it
        return _failed(scenario, index, dst, exc)
    return _result(scenario, index, counts, o.dst)


def _price_table_many(table: pa.Table, files: Sequence[Part], index: int,
                      kernels: Sequence[tuple[str, bytes, str]], dst: str,
                      decode_threshold: int, column: str, threads: int | None
                      ) -> list[PartitionResult]:

    outputs = [_output(files, index, name, saved, digest, dst, decode_threshold)
               for name, saved, digest in kernels]
    counts = price_table_many(outputs, table, decode_threshold=decode_threshold,
                              columns=_columns(column), workers=threads, identity=False)
    return [_result(name, index, c, o.dst)
            for (name, _, _), c, o in zip(kernels, counts, outputs, strict=True)]


def make_client(cluster: Any = None, connect_timeout: float | None = None) -> Any:
    """A Dask client: an existing Client, an address, ``dask-local[:N]`` / ``local[:N]``, or
    None (a local cluster of 2 workers). ``connect_timeout`` (seconds) bounds the wait for an
    unreachable address (then OSError)."""
    from distributed import Client, LocalCluster  # (optional: Dask, an optional extra)

    if cluster is not None and hasattr(cluster, "submit"):
        return cluster
    text = str(cluster) if cluster is not None else "local"
    if text.startswith("dask-"):
        text = text[len("dask-"):]
    if text.startswith("local"):
        n = _local_count(text, 2)
        local = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                             dashboard_address=":0")
        return Client(local)
    if connect_timeout is None:
        return Client(text)
    return Client(text, timeout=connect_timeout)


def _local_count(text: str, default: int) -> int:
    """N of ``local:N`` (``default`` for a bare ``local``); a clear error otherwise."""
    if ":" not in text:
        return default
    value = text.split(":", 1)[1]
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"cluster {text!r}: local:N needs N >= 1 worker processes")
    return int(value)


class _Processes:
    """A pool of N local worker processes (spawned: no thread state is forked)."""

    def __init__(self, n: int):
        self.workers = n
        self.name = f"local:{n} (processes)"
        self._pool = self._start()

    def _start(self) -> Any:

        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))

    def run(self, fn: Any, calls: Sequence[tuple[Any, ...]], retries: int) -> list[Any]:
        """``fn(*call)`` for every call, in order; a call whose worker died is run again on a
        fresh pool, up to ``retries`` times."""

        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(retries + 1):
            futures = {i: self._pool.submit(fn, *calls[i]) for i in pending}
            lost = []
            for i, fut in futures.items():
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    lost.append(i)
            if not lost:
                return results
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._start()
            pending = lost
            if attempt == retries:
                raise RuntimeError(
                    f"{len(lost)} task(s) lost their worker process {retries + 1} times (a "
                    "worker was killed, or could not start: a script that starts local workers "
                    "needs the `if __name__ == '__main__':` guard)")
        return results

    def share(self, value: Any) -> Any:
        return value

    def close(self) -> None:
        self._pool.shutdown()


class _Dask:
    """A Dask client (owned: closed with its local cluster at the end)."""

    def __init__(self, client: Any, own: bool):
        self.client, self.own = client, own
        self.worker_names = sorted(client.scheduler_info().get("workers", {})) or [None]
        self.workers = len(self.worker_names)
        self.name = f"dask ({self.workers} workers)"

    def run(self, fn: Any, calls: Sequence[tuple[Any, ...]], retries: int) -> list[Any]:
        stamp = time.time_ns()
        # Spread over the workers so each loads only its share of the kernels; any worker may
        # still take a task (a dead worker's tasks move elsewhere).
        futures = [self.client.submit(fn, *call, pure=False, retries=retries,
                                      key=f"{fn.__name__}-{i}-{stamp}",
                                      workers=self.worker_names[i % self.workers],
                                      allow_other_workers=True)
                   for i, call in enumerate(calls)]
        return list(self.client.gather(futures))

    def share(self, value: Any) -> Any:
        """A value every task takes, sent to every worker once (not once per task)."""
        return self.client.scatter(value, broadcast=True, hash=False)

    def close(self) -> None:
        if self.own:
            local = getattr(self.client, "cluster", None)
            self.client.close()
            if local is not None:
                local.close()


def _runner(cluster: Any, connect_timeout: float | None = None) -> _Processes | _Dask:
    """The executor a ``cluster`` argument names (module docstring)."""
    if cluster is not None and hasattr(cluster, "submit"):
        return _Dask(cluster, own=False)
    text = "local" if cluster is None else str(cluster)
    if text == "local" or text.startswith("local:"):
        return _Processes(_local_count(text, os.cpu_count() or 2))
    return _Dask(make_client(text, connect_timeout), own=True)


def summarise(dst: str | os.PathLike[str]) -> pl.DataFrame:
    """Per scenario: batches, wall time (Σ NoOverlap), p50/p99 step time and each
    bottleneck's share of wall time (the measure ``compare`` reports)."""
    pattern = str(Path(dst) / "scenario=*" / "*.parquet")
    con = duckdb.connect()
    frame = con.sql(f"""
        SELECT scenario,
               count(*) AS batches,
               sum(no_overlap_ns)::BIGINT AS total_no_overlap_ns,
               sum(overlap_ns)::BIGINT AS total_overlap_ns,
               quantile_disc(no_overlap_ns, 0.5) AS p50_ns,
               quantile_disc(no_overlap_ns, 0.99) AS p99_ns,
               coalesce(sum(no_overlap_ns) FILTER (WHERE bottleneck = 'sm'), 0)::DOUBLE
                   / greatest(sum(no_overlap_ns), 1) AS share_sm,
               coalesce(sum(no_overlap_ns) FILTER (WHERE bottleneck = 'hbm'), 0)::DOUBLE
                   / greatest(sum(no_overlap_ns), 1) AS share_hbm,
               coalesce(sum(no_overlap_ns) FILTER (WHERE bottleneck = 'nvlink'), 0)::DOUBLE
                   / greatest(sum(no_overlap_ns), 1) AS share_nvlink,
               coalesce(sum(no_overlap_ns) FILTER (WHERE bottleneck = 'nic'), 0)::DOUBLE
                   / greatest(sum(no_overlap_ns), 1) AS share_nic,
               coalesce(sum(no_overlap_ns) FILTER (WHERE bottleneck = 'host'), 0)::DOUBLE
                   / greatest(sum(no_overlap_ns), 1) AS share_host
        FROM read_parquet('{pattern}', hive_partitioning = true)
        GROUP BY scenario ORDER BY scenario""").pl()
    con.close()
    return frame


def _built(scenario: str, pool: int, repos: Repos) -> tuple[bytes, str]:
    """A build task that reports a refusal instead of raising (it is listed with the others)."""
    try:
        return build_kernel(scenario, pool, repos), ""
    except Exception as exc:
        return b"", f"{type(exc).__name__}: {exc}"


def price_dataset(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                  scenarios: Iterable[str], cluster: Any = None, *, pool: int = 0,
                  repos: Repos | None = None, decode_threshold: int = 1, retries: int = 3,
                  column: str = BATCH_ID, connect_timeout: float | None = None) -> SweepResult:
    """Price every partition of ``src`` under every scenario on local processes or Dask.

    ``cluster``: None or ``local[:N]`` (N local processes, default the cores), ``dask-local:N``,
    a Dask ADDRESS or Client. Builds each scenario's kernel once, then writes
    ``dst/scenario=<name>/part-NNNNN.parquet`` (one per input partition × scenario), rejected
    rows under ``dst/rejects/``, and ``dst/summary.parquet``. Raises RuntimeError naming every
    scenario that could not be built or partition that could not be priced, after all others
    have finished.
    """
    t0 = time.perf_counter()
    repos = repos or Repos()
    names = list(dict.fromkeys(scenarios))
    if not names:
        raise ValueError("price_dataset needs at least one scenario")
    whole = [str(p) for p in list_partitions(src)]
    Path(dst).mkdir(parents=True, exist_ok=True)
    runner = _runner(cluster, connect_timeout)
    try:
        # About four tasks per worker keep them all busy to the end (docs/scaling.md): with
        # fewer partitions × scenarios, files are cut into pieces of whole row groups.
        files = split_files(whole, -(-4 * runner.workers // (len(whole) * len(names))))
        # Kernels and partition ids in one round: both are independent of each other.
        scans = [(f, column) for f in files]
        builds = [(n, pool, repos) for n in names]
        found = runner.run(_scan_or_build, [("scan", a) for a in scans]
                           + [("build", a) for a in builds], retries)
        partition_ids = found[:len(files)]
        built: list[tuple[bytes, str]] = found[len(files):]
        refused = [(n, err) for n, (_, err) in zip(names, built, strict=True) if err]
        if refused:
            listing = "\n".join(f"  scenario {n}: {err}" for n, err in refused)
            raise RuntimeError(f"{len(refused)} scenario(s) could not be built:\n{listing}")
        owners = straddling_owners(partition_ids)
        foreign = _given_away(partition_ids, owners)
        donors = {i: [j for j in range(i + 1, len(files))
                      if np.isin(owned, partition_ids[j]).any()]
                  for i, owned in owners.items()}
        empty = np.array([], dtype=np.int64)
        threads = max(1, (os.cpu_count() or 1) // runner.workers) \
            if isinstance(runner, _Processes) else None
        pools = [(name, runner.share(saved), hashlib.sha256(saved).hexdigest())
                 for name, (saved, _) in zip(names, built, strict=True)]
        # A task prices one partition under a group of scenarios, reading it once; enough
        # groups that every worker gets about four tasks (docs/scaling.md).
        n_groups = min(len(names), max(1, -(-4 * runner.workers // len(files))))
        groups = [pools[g::n_groups] for g in range(n_groups)]
        calls = [(files, i, owners.get(i, empty), foreign.get(i, empty), group, str(dst),
                  decode_threshold, column, donors.get(i, []), threads)
                 for group in groups for i in range(len(files))]
        grouped: list[list[PartitionResult]] = runner.run(price_partition_group, calls, retries)
        results = [r for rs in grouped for r in rs]
    finally:
        runner.close()
    failures = [r for r in results if r.error]
    done = [r for r in results if not r.error]
    summary = summarise(dst) if done else pl.DataFrame()
    if summary.height:
        write_summary(summary, Path(dst) / "summary.parquet", done, src, decode_threshold)
    result = SweepResult(done, summary, time.perf_counter() - t0, failures,
                         kernels_built=len(built), executor=runner.name)
    if failures:
        listing = "\n".join(f"  scenario {f.scenario} partition {f.partition} "
                            f"({files[f.partition]}): {f.error}" for f in failures)
        raise RuntimeError(f"{len(failures)} partition task(s) could not be priced:\n{listing}")
    return result


def _scan_or_build(what: str, args: tuple[Any, ...]) -> Any:
    """One task of the first round: a partition's batch ids, or a scenario's kernel."""
    return _ids_of(*args) if what == "scan" else _built(*args)


def write_summary(summary: pl.DataFrame, path: Path, done: Sequence[PartitionResult],
                  src: str | os.PathLike[str], decode_threshold: int) -> None:
    """The summary parquet, stamped: every scenario, the documents each partition was priced
    with (from the partitions' own stamps), the options and the row counts."""
    import pyarrow.parquet as pq  # (heavy: Arrow, loaded only on this path)


    docs: dict[str, dict[str, str]] = {}
    for name in sorted({r.scenario for r in done}):
        first = min((r for r in done if r.scenario == name), key=lambda r: r.partition)
        part = read_stamp(first.output) if Path(first.output).is_file() else None
        for role, doc in (part.documents.items() if part else ()):
            docs[f"{name}/{role}"] = dict(doc)
    stamp = Stamp(kind="sweep-summary", scenarios=tuple(sorted({r.scenario for r in done})),
                  documents=docs, options={"decode_threshold": int(decode_threshold)},
                  trace={"source": str(src)},
                  counts={"rows_in": sum(r.rows_in for r in done),
                          "rows_priced": sum(r.rows_priced for r in done),
                          "rows_rejected": sum(r.rows_rejected for r in done),
                          "batches_priced": sum(r.batches for r in done),
                          "tasks": len(done)})
    with safe_output.atomic(path) as tmp:
        pq.write_table(stamped(summary.to_arrow(), stamp), tmp)


def _given_away(partition_ids: Sequence[np.ndarray],
                owners: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """For each partition, the batch ids another (earlier) partition owns."""
    if not owners:
        return {}
    owned_all = np.concatenate(list(owners.values()))
    owner_index = np.concatenate([np.full(len(v), k) for k, v in owners.items()])
    out: dict[int, np.ndarray] = {}
    for i, ids in enumerate(partition_ids):
        mask = np.isin(owned_all, ids) & (owner_index != i)
        if mask.any():
            out[i] = np.unique(owned_all[mask])
    return out
