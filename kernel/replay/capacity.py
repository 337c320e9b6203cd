"""Capacity planning: one request source replayed at many arrival rates on many deployments.

:func:`sweep_rates` runs one replay per (scenario, rate) through the sweep executors of
:mod:`kernel.sweep.distributed` (local processes, or a Dask cluster by address; ``inline`` runs in
this process) and returns the latency-throughput curve and, per scenario, the highest rate that
meets the SLOs (docs/replay.md "Capacity planning", decisions CP1-CP6).

The rate of a source: a load spec's time-weighted mean stage rate (scaled with
:meth:`LoadSpec.scaled`, durations kept, so a higher rate sends more requests over the same
time); a request set's arrivals per second over its arrival span, (n − 1) / (last − first)
(scaled with :func:`scale_rate`: the same requests, arriving sooner).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import safe_output
from pipeline.load import open_inputs

from ..facade.factory import open as open_kernel
from ..facade.saved import dumps
from ..io.stamp import Stamp, stamped
from ..sweep.distributed import _runner, _worker_kernel
from .api import ReplayOptions, replay
from .loads import LoadSpec, generate
from .requests import RequestSet, scale_rate

__all__ = ["CURVE_COLUMNS", "CapacityResult", "base_rate", "max_rate_within_slo", "meets_slo",
           "sweep_rates", "write_capacity"]

# The summary keys each curve row carries (kernel.replay.results.summarise), in order.
_SUMMARY_KEYS = (
    "requests", "finished", "rejected", "duration_s", "throughput_rps", "throughput_output_tps",
    "ttft_s_mean", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99",
    "itl_s_mean", "itl_s_p50", "itl_s_p90", "itl_s_p99",
    "e2e_s_mean", "e2e_s_p50", "e2e_s_p90", "e2e_s_p99",
    "queue_s_mean", "queue_s_p99", "kv_occupancy_mean", "kv_occupancy_max", "preemptions",
    "engine_steps", "goodput_requests", "goodput_rps",
)
_INTS = {"requests", "finished", "rejected", "preemptions", "engine_steps", "goodput_requests"}
CURVE_COLUMNS = ("scenario", "rate", "factor", *_SUMMARY_KEYS, "slo_attainment", "meets_slo")


@dataclass(frozen=True)
class CapacityResult:
    """The curve (one row per scenario and rate, rates ascending within a scenario) and the
    highest rate within the SLOs per scenario (null when no rate, or no SLO)."""

    curve: pa.Table
    max_rate: pa.Table
    slo: dict[str, float]
    min_attainment: float
    source: str
    base_rate: float
    executor: str
    seconds: float
    options: ReplayOptions = ReplayOptions()
    documents: dict[str, Any] | None = None  # scenario/pool/role -> {file, sha256}


def base_rate(source: RequestSet | LoadSpec) -> float:
    """The arrival rate (requests/s) a source runs at as given (module docstring)."""
    if isinstance(source, LoadSpec):
        if source.closed_loop:
            raise ValueError("a closed-loop load spec has no arrival rate to sweep: sweep its "
                             "users instead")
        total = sum(s.duration_s for s in source.stages)
        return sum(s.rate * s.duration_s for s in source.stages) / total
    arrival = source.table.column("arrival_ns")
    if arrival.null_count:
        raise ValueError(f"{source.source}: {arrival.null_count:,} closed-loop requests (no "
                         f"arrival_ns) have no rate to scale")
    ns = np.asarray(arrival.to_numpy(), np.int64)
    if ns.size < 2 or ns.max() == ns.min():
        raise ValueError(f"{source.source}: a rate needs at least two distinct arrival times "
                         f"(got {ns.size} request(s))")
    return float((ns.size - 1) / ((ns.max() - ns.min()) / 1e9))


def meets_slo(row: dict[str, Any], slo: dict[str, float], min_attainment: float) -> bool | None:
    """A curve row meets the SLOs when at least ``min_attainment`` of ALL its requests
    (rejected ones count as misses) meet every SLO. None without SLOs."""
    if not slo:
        return None
    n = int(row["requests"])
    return n > 0 and int(row["goodput_requests"] or 0) >= min_attainment * n - 1e-9


def max_rate_within_slo(rates: Sequence[float], meets: Sequence[bool | None]) -> float | None:
    """The highest rate such that it and every lower swept rate meet the SLOs (the top of the
    run of passing rates from the lowest; a pass above a failure is not counted: CP3)."""
    best = None
    for r, ok in sorted(zip(rates, meets, strict=True), key=lambda x: x[0]):
        if not ok:
            break
        best = r
    return best


def _factor(rate: float, base: float) -> float:
    return rate / base


def _digest(saved: bytes) -> str:
    return hashlib.sha256(saved).hexdigest()


def replay_point(scenario: str, saved: Sequence[bytes], source: RequestSet | LoadSpec,
                 rate: float, factor: float, options: ReplayOptions, slo: dict[str, float],
                 seed: int, min_attainment: float) -> dict[str, Any]:
    """One task: ``source`` at ``factor`` × its rate replayed on the saved kernel(s) (one pool,
    or [prefill, decode]); the curve row. Runs in a worker process."""

    kernels = [_worker_kernel(_digest(b), b) for b in saved]
    requests = (generate(source.scaled(factor), seed=seed) if isinstance(source, LoadSpec)
                else scale_rate(source, factor))
    k: Any = kernels[0] if len(kernels) == 1 else kernels
    res = replay(k, requests, _without_steps(options), slo=slo or None)
    s = res.summary
    row: dict[str, Any] = {"scenario": scenario, "rate": float(rate), "factor": float(factor)}
    for key in _SUMMARY_KEYS:
        v = s.get(key)
        row[key] = (int(v) if key in _INTS and v is not None else
                    float(v) if v is not None else None)
    if not slo:
        row["goodput_requests"] = row["goodput_rps"] = None
    row["slo_attainment"] = (row["goodput_requests"] / row["requests"]
                             if slo and row["requests"] else None)
    row["meets_slo"] = meets_slo(row, slo, min_attainment)
    return row


def _without_steps(options: ReplayOptions) -> ReplayOptions:
    """A sweep needs no steps table: only request latencies and the engine-step occupancy
    (``keep_steps=False`` gives the same requests table and summary, docs/replay.md)."""

    return dataclasses.replace(options, keep_steps=False)


class _Inline:
    """Every task in this process, in order (the reference the executors must match)."""

    name = "inline (this process)"
    workers = 1

    def run(self, fn: Any, calls: Sequence[tuple[Any, ...]], retries: int) -> list[Any]:
        return [fn(*c) for c in calls]

    def share(self, value: Any) -> Any:
        return value

    def close(self) -> None:
        pass


def _pools(scenario: str, repos: Any, pool: int, calibration: str | None) -> list[Any]:
    """The kernels a scenario replays on: its pool, or both pools of a P/D deployment."""


    first = open_kernel(scenario, repos, pool, calibration=calibration)
    if pool != 0:
        return [first]
    roles = [p.role for p in open_inputs(scenario, repos, 0).deployment.pools]
    if roles == ["prefill", "decode"]:
        return [first, open_kernel(scenario, repos, 1, calibration=calibration)]
    return [first]


def sweep_rates(scenarios: Sequence[str], source: RequestSet | LoadSpec, rates: Sequence[float],
                *, options: ReplayOptions | None = None, slo: dict[str, float] | None = None,
                min_attainment: float = 0.9, cluster: Any = "local", seed: int = 0,
                repos: Any = None, pool: int = 0, calibration: str | None = None,
                retries: int = 1, connect_timeout: float | None = None) -> CapacityResult:
    """Replay ``source`` at every rate (requests/s) on every scenario; the curve and the
    highest rate within the SLOs (module docstring).

    ``cluster``: ``inline`` (this process), ``local[:N]`` (N local processes, the default N
    the core count), ``dask-local:N``, a Dask scheduler address or a ``Client``
    (:func:`kernel.sweep.distributed._runner`). ``slo`` in seconds (ttft, itl, tpot, e2e, as
    :func:`kernel.replay.replay`); a rate meets them when at least ``min_attainment`` of its
    requests meet every one."""

    options = options or ReplayOptions()
    slo = dict(slo or {})
    if not scenarios:
        raise ValueError("capacity sweep: give at least one scenario")
    if len(set(scenarios)) != len(scenarios):
        raise ValueError(f"capacity sweep: scenarios repeat: {list(scenarios)}")
    rates = [float(r) for r in rates]
    if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
        raise ValueError(f"capacity sweep: rates must be finite numbers > 0 (requests/s), "
                         f"got {rates}")
    if len(set(rates)) != len(rates):
        raise ValueError(f"capacity sweep: rates repeat: {rates}")
    if not (0 < min_attainment <= 1):
        raise ValueError(f"min_attainment must be in (0, 1], got {min_attainment}")
    rates = sorted(rates)
    base = base_rate(source)
    t0 = time.perf_counter()
    saved: dict[str, list[bytes]] = {}
    docs: dict[str, Any] = {}

    for name in scenarios:  # each scenario's kernel(s) built once, shipped as saved pools
        ks = _pools(name, repos, pool, calibration)
        saved[name] = [dumps(k) for k in ks]
        for k in ks:  # for the stamps: every document each scenario was built from
            for role, doc in k.documents().items():
                docs[f"{name}/pool{k.resolved_pool.pool_index}/{role}"] = dict(doc)
    runner: Any = _Inline() if cluster == "inline" else _runner(cluster, connect_timeout)
    try:
        shared = runner.share(source)
        calls = [(name, saved[name], shared, r, _factor(r, base), options, slo, seed,
                  min_attainment) for name in scenarios for r in rates]
        # the highest rates are the longest replays: start them first, so no worker is left
        # with one long replay at the end (the rows come back in the table's order)
        order = sorted(range(len(calls)), key=lambda i: -calls[i][3])
        done = runner.run(replay_point, [calls[i] for i in order], retries)
        rows: list[dict[str, Any]] = [{}] * len(calls)
        for i, row in zip(order, done, strict=True):
            rows[i] = row
    finally:
        runner.close()
    curve = pa.Table.from_pylist(rows, schema=_schema())
    best = [{"scenario": name,
             "max_rate": max_rate_within_slo(
                 [r["rate"] for r in rows if r["scenario"] == name],
                 [r["meets_slo"] for r in rows if r["scenario"] == name]) if slo else None,
             "rates_swept": len(rates)} for name in scenarios]
    max_table = pa.Table.from_pylist(best, schema=pa.schema([
        ("scenario", pa.string()), ("max_rate", pa.float64()), ("rates_swept", pa.int64())]))
    describe = source.describe() if isinstance(source, LoadSpec) else source.source
    return CapacityResult(curve=curve, max_rate=max_table, slo=slo,
                          min_attainment=float(min_attainment), source=str(describe),
                          base_rate=base, executor=runner.name,
                          seconds=time.perf_counter() - t0, options=options, documents=docs)


def _schema() -> pa.Schema:
    fields = [pa.field("scenario", pa.string()), pa.field("rate", pa.float64()),
              pa.field("factor", pa.float64())]
    fields += [pa.field(k, pa.int64() if k in _INTS else pa.float64()) for k in _SUMMARY_KEYS]
    fields += [pa.field("slo_attainment", pa.float64()), pa.field("meets_slo", pa.bool_())]
    return pa.schema(fields)


def write_capacity(result: CapacityResult, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """``OUT_DIR/curve.parquet`` and ``max_rate.parquet``, stamped (kinds
    ``replay-capacity-curve`` / ``replay-capacity-max-rate``: every scenario and its documents,
    the replay options, the SLOs, the source and its base rate)."""


    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"replay": result.options.to_dict(), "slo": result.slo,
                               "min_attainment": result.min_attainment,
                               "base_rate": result.base_rate}
    names = tuple(dict.fromkeys(result.curve.column("scenario").to_pylist()))
    paths: dict[str, Path] = {}
    for name, kind, table in (("curve", "replay-capacity-curve", result.curve),
                              ("max_rate", "replay-capacity-max-rate", result.max_rate)):
        st = Stamp(kind=kind, scenarios=names, documents=result.documents or {},
                   options=options, trace={"source": result.source},
                   counts={"rows": table.num_rows, "replays": result.curve.num_rows})
        path = out / f"{name}.parquet"
        with safe_output.atomic(path) as tmp:  # never a half-written file under its name
            pq.write_table(stamped(table, st), tmp)
        paths[name] = path
    return paths
