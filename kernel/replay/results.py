"""A replay's outputs: the requests table, the steps table and the summary.

Token times come from the steps table, vectorised: the k-th token of a request is sampled at
the end of the k-th step that emitted for it, and reaches the client after k output-token host
overheads (the host processes each request's tokens in turn; the engine clock does not wait
for it). The request is done ``completion_overhead`` after its last token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..model import jit
from .engine import Rows

if TYPE_CHECKING:
    from ..facade.kernel import Kernel
    from .api import ReplayOptions
    from .engine import RunState, Simulation

__all__ = ["ReplayResult", "build_result", "summarise"]

NS = 1e9


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`kernel.replay.replay` returns (docs/replay.md)."""

    requests: pa.Table  # one row per request: times, latencies, tokens, status, reason
    # the steps table, or what builds it when ``steps`` is first read (it is the largest
    # output, one row per request per step, and many callers read only the summary)
    steps_source: pa.Table | Callable[[], pa.Table]
    summary: dict[str, Any]
    rejects: pa.Table  # requests that could not run: request_id, row, reason
    options: ReplayOptions
    engine_steps: pa.Table | None = None  # one row per engine core per step

    @property
    def steps(self) -> pa.Table:
        """One row per request per step, in the trace schema ``price`` reads."""
        src = self.steps_source
        if not isinstance(src, pa.Table):
            src = src()
            object.__setattr__(self, "steps_source", src)  # built once, then kept
        return src


def run_percentiles(values: np.ndarray, counts: np.ndarray,
                    qs: tuple[float, ...]) -> list[np.ndarray]:
    """Percentiles of each run of ``values`` (``counts[g]`` values for group g, the groups'
    runs one after another), without a Python loop: for a run sorted as v of n values, the
    q-th is v[lo] + (v[hi] - v[lo]) * frac with pos = q * (n - 1), lo = floor(pos), hi =
    min(lo + 1, n - 1), frac = pos - lo (linear interpolation, numpy's default method). Groups
    with no value get -1."""
    n_groups = counts.size
    table = np.full((len(qs), n_groups), -1.0)
    outs = list(table)  # (one row of the table a percentile)
    if values.size == 0:
        return outs
    loop = jit.compiled(_percentiles_of_runs)
    if loop is not None:  # each run sorted alone: no key of every value, no global sort
        loop(values, np.asarray(counts, np.int64), np.asarray(qs, np.float64), table)
        return outs
    present = np.flatnonzero(counts)
    counts = counts[present]
    starts = np.cumsum(counts) - counts
    integral = np.issubdtype(values.dtype, np.integer)
    iv = values if integral else values.astype(np.int64)
    if ((integral or np.array_equal(iv, values)) and iv.min() >= 0 and iv.max() < 1 << 40
            and n_groups <= 1 << 23):  # one int64 sort of (group, value) keys: faster
        key = np.repeat(present << 40, counts)
        key |= iv
        key.sort()

        def at(i: np.ndarray) -> np.ndarray:  # the sorted values, read where needed only
            return (key[i] & ((1 << 40) - 1)).astype(np.float64)
    else:
        order = np.lexsort((values, np.repeat(present, counts)))
        v = values[order]

        def at(i: np.ndarray) -> np.ndarray:
            return v[i]
    for q, out in zip(qs, outs, strict=True):
        pos = q * (counts - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts - 1)
        frac = pos - lo
        a, b = at(starts + lo), at(starts + hi)
        out[present] = a + (b - a) * frac
    return outs


def _percentiles_of_runs(values: np.ndarray, counts: np.ndarray, qs: np.ndarray,
                         out: np.ndarray) -> None:
    """:func:`run_percentiles`, compiled (decision RR3): run g sorted on its own, its q-th
    the same interpolation in the values' own type (ints subtract as ints)."""
    start = 0
    for g in range(counts.size):
        n = counts[g]
        if n:
            v = np.sort(values[start:start + n])
            for k in range(qs.size):
                pos = qs[k] * (n - 1)
                lo = int(np.floor(pos))
                hi = min(lo + 1, n - 1)
                out[k, g] = v[lo] + (v[hi] - v[lo]) * (pos - lo)
            start += n


def token_times(req: np.ndarray, known: np.ndarray, batch: np.ndarray, step_end: np.ndarray,
                prompt: np.ndarray, otok: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request, the tokens it received and the times its first and last reached the
    client (-1 without one); and every inter-token latency, request by request in token order
    (``emitted - 1`` for each request with a token).

    Per token in the order sampled: ``req`` its request, ``known`` the tokens the request knew
    before it (its prompt plus the token's ordinal), ``batch`` the step that sampled it (a row
    of ``step_end``). The token of ordinal j reaches the client (j + 1) output-token overheads
    ``otok`` after that step's end, so a latency is the difference of two steps' ends plus one
    overhead. The three token arrays (int64) are used as scratch: each array of the tokens'
    size made afresh costs page faults, up to tens of ms each on a loaded machine.

    Without a sort: a token lands at its place in the (request, ordinal) layout, the order a
    stable sort by request of the time-ordered tokens gives."""
    n = prompt.size
    emitted = np.bincount(req, minlength=n).astype(np.int64, copy=False)
    if emitted.size != n:
        raise AssertionError(f"a token of request {emitted.size - 1} of {n}")
    if req.size and not (batch.min() >= 0 and batch.max() < step_end.size):
        raise AssertionError("a token of a step that was not recorded")
    offset = np.cumsum(emitted) - emitted
    at = np.take(prompt, req)
    ordinal = np.subtract(known, at, out=known)
    if req.size and ordinal.min() < 0:
        raise AssertionError("a request sampled a token before its prompt was computed")
    # (mode="clip": the indices are in range (checked above); with the default mode, numpy
    # buffers ``out`` and the take costs several times more)
    np.add(np.take(offset, req, out=at, mode="clip"), ordinal, out=at)  # each token's place
    ends = batch  # each token's step end in (request, ordinal) order, in batch's memory
    ends[at] = np.take(step_end, batch, out=req, mode="clip")
    del at
    has = emitted > 0
    first = np.full(n, -1, np.int64)
    last = np.full(n, -1, np.int64)
    first[has] = ends[offset[has]] + otok
    last[has] = ends[offset[has] + emitted[has] - 1] + emitted[has] * otok
    gaps = np.subtract(ends[1:], ends[:-1], out=ordinal[:-1])
    same = np.ones(gaps.size, bool)  # a gap between two tokens of one request
    same[offset[has][1:] - 1] = False
    itl = gaps[same]
    itl += otok
    return emitted, first, last, itl


def _stats(x: np.ndarray, prefix: str) -> dict[str, float | None]:
    """Mean, p50, p90, p99 of ``x``, which is reordered (the partition works in place)."""
    if x.size == 0:
        return {f"{prefix}_{k}": None for k in ("mean", "p50", "p90", "p99")}
    mean = float(np.mean(x))
    ps = np.percentile(x, (50, 90, 99), overwrite_input=True)  # one partition, in place
    return {f"{prefix}_mean": mean,
            **{f"{prefix}_p{q}": float(p) for q, p in zip((50, 90, 99), ps, strict=True)}}


def build_result(kernels: list[Kernel], options: ReplayOptions, table: pa.Table,
                 ids: list[Any], sim: Simulation, states: list[RunState],
                 arrival: np.ndarray, ready: np.ndarray, reason: list[str | None], *,
                 otok: int, completion_ns: int, slo: dict[str, float] | None,
                 lockstep: list[bool], handoff: np.ndarray | None = None) -> ReplayResult:
    n = table.num_rows
    client = len(states) - 1  # the pool whose tokens reach the user (decode in P/D)
    state = states[client]
    keep = sim.rows.keep
    steps = sim.rows.steps

    tok_req, tok_known, tok_batch = sim.rows.tokens()  # fresh arrays: changed in place
    emitted_n, first_token, last_token, itl = token_times(
        tok_req, tok_known, tok_batch, steps["end"], np.asarray(state.prompt, np.int64), otok)
    del tok_req, tok_known, tok_batch
    itl_p50, itl_p99 = run_percentiles(itl, np.maximum(emitted_n - 1, 0), (0.5, 0.99))

    admitted = states[0].admitted

    output = np.asarray(state.output, np.int64)
    prompt = np.asarray(state.prompt, np.int64)
    ok = np.array([r is None for r in reason], bool)
    done = ok & (emitted_n == output)
    if np.any(ok & ~done):  # the engine ran until its queues emptied: never happens
        bad = int(np.flatnonzero(ok & ~done)[0])
        raise AssertionError(f"request {ids[bad]!r} emitted {emitted_n[bad]} of "
                             f"{output[bad]} tokens")
    finish = np.where(done, last_token + completion_ns, -1)
    ttft = np.where(done, first_token - arrival, -1)
    e2e = np.where(done, finish - arrival, -1)
    tpot = np.where(done & (output > 1),
                    (last_token - first_token) / np.maximum(output - 1, 1), np.nan)
    queue = np.where(done, admitted - arrival, -1)

    def nullable(x: np.ndarray, typ: pa.DataType, mask: np.ndarray) -> pa.Array:
        return pa.array(x, typ, mask=~mask)

    engine = np.asarray(state.core, np.int64)
    names = [next((c.pool for c in sim.cores if c.pool_index == i), "")
             for i in range(len(states))]
    pool = names[client]
    no = np.full(n, -1, np.int64)
    h0, h1 = (handoff[:, 0], handoff[:, 1]) if handoff is not None else (no, no)
    first_engine = np.asarray(states[0].core, np.int64)
    status = np.where(done, "finished", "rejected")
    requests = pa.table({
        "request_id": pa.array([str(x) for x in ids], pa.string()),
        "session_id": (table.column("session_id") if "session_id" in table.column_names
                       else pa.nulls(n, pa.string())),
        "stage": (table.column("stage") if "stage" in table.column_names
                  else pa.array(np.zeros(n, np.int32))),
        "arrival_ns": nullable(arrival, pa.int64(), arrival >= 0),
        "ready_ns": nullable(ready, pa.int64(), done),
        "admitted_ns": nullable(admitted, pa.int64(), done),
        "first_token_ns": nullable(first_token, pa.int64(), done),
        "finish_ns": nullable(finish, pa.int64(), done),
        "ttft_ns": nullable(ttft, pa.int64(), done),
        "tpot_mean_ns": nullable(np.nan_to_num(tpot, nan=0.0), pa.float64(),
                                 done & (output > 1)),
        "itl_p50_ns": nullable(itl_p50, pa.float64(), done & (output > 1)),
        "itl_p99_ns": nullable(itl_p99, pa.float64(), done & (output > 1)),
        "e2e_ns": nullable(e2e, pa.int64(), done),
        "queue_ns": nullable(queue, pa.int64(), done),
        "prompt_tokens": pa.array(prompt, pa.int64()),
        "output_tokens": pa.array(output, pa.int64()),
        "cached_tokens": pa.array(sum(s.cached_tokens for s in states), pa.int64()),
        "preemptions": pa.array(sum(s.preemptions for s in states), pa.int64()),
        "recomputed_tokens": pa.array(sum(s.lost for s in states), pa.int64()),
        "engine": nullable(engine, pa.int64(), done),
        "pool": pa.array([pool] * n, pa.string()),
        "prefill_engine": nullable(first_engine, pa.int64(), done & (handoff is not None)),
        "handoff_start_ns": nullable(h0, pa.int64(), done & (h0 >= 0)),
        "handoff_end_ns": nullable(h1, pa.int64(), done & (h1 >= 0)),
        "status": pa.array(status.tolist(), pa.string()),
        "reason": pa.array(reason, pa.string()),
    })
    rejected = np.flatnonzero(~ok)
    rejects = pa.table({
        "request_id": pa.array([str(ids[i]) for i in rejected], pa.string()),
        "row": pa.array(rejected.astype(np.int64), pa.int64()),
        "reason": pa.array([reason[i] for i in rejected], pa.string()),
    })
    id_arr = requests.column("request_id").combine_chunks()
    rows_of = sim.rows if keep else None

    def steps_table() -> pa.Table:  # built when first read
        return _steps_table(rows_of, steps, id_arr, names)

    engine_steps = pa.table({name: pa.array(v, pa.int64()) for name, v in steps.items()})
    summary = summarise(requests, engine_steps, itl, slo)
    summary["engine_cores"] = len(sim.cores)
    summary["pools"] = names
    summary["lockstep"] = lockstep
    summary["kv_blocks_per_core"] = [next(c.limits.num_blocks for c in sim.cores
                                          if c.pool_index == i) for i in range(len(states))]
    if handoff is not None:
        took = (handoff[:, 1] - handoff[:, 0])[handoff[:, 1] >= 0]
        summary.update({k_: (v / NS if v is not None else None)
                        for k_, v in _stats(took.astype(np.float64), "handoff_s").items()})
    summary["prefix_cache_evictions"] = sum(c.kv.evictions for c in sim.cores)
    summary["options"] = options.to_dict()
    return ReplayResult(requests, steps_table, summary=summary,
                        rejects=rejects, options=options, engine_steps=engine_steps)


def _steps_table(rows_of: Rows | None, steps: dict[str, np.ndarray], id_arr: pa.Array,
                 names: list[str]) -> pa.Table:
    """The steps table, one row per request per step (no rows when none were kept)."""
    if rows_of is not None:
        rows = rows_of.cols
        per = steps["requests"]
    else:
        rows = {name: np.zeros(0, np.int64) for name in Rows.NAMES}
        per = np.zeros(steps["requests"].size, np.int64)
    batch, req = rows["batch_id"], rows["request"]

    # rows are grouped by batch in batch order: a per-batch value is repeated over its rows
    def spread(name: str) -> np.ndarray:
        return np.repeat(steps[name], per)

    return pa.table({
        "batch_id": pa.array(batch, pa.int64()),
        "scheduled": pa.array(rows["scheduled"], pa.int64()),
        "computed": pa.array(rows["computed"], pa.int64()),
        "prompt_len": pa.array(rows["prompt_len"], pa.int64()),
        "cached_tokens": pa.array(rows["cached_tokens"], pa.int64()),
        "decode_threshold": pa.array(np.ones(batch.size, np.int64), pa.int64()),
        "request_id": id_arr.take(pa.array(req)) if req.size else pa.array([], pa.string()),
        "engine": pa.array(spread("engine"), pa.int64()),
        "pool": pa.array(names, pa.string()).take(pa.array(rows["pool"])),
        "step_start_ns": pa.array(spread("start"), pa.int64()),
        "step_end_ns": pa.array(spread("end"), pa.int64()),
        "batch_ns": pa.array(spread("batch_ns"), pa.int64()),
        "step_ns": pa.array(spread("step_ns"), pa.int64()),
        "emitted": pa.array(rows["emitted"].astype(np.int8), pa.int8()),
    })


def _seconds(slo: dict[str, float] | None) -> dict[str, float]:
    allowed = ("ttft", "itl", "tpot", "e2e")
    out: dict[str, float] = {}
    for key, v in (slo or {}).items():
        if key not in allowed:
            raise ValueError(f"slo: unknown key {key!r}; allowed: {', '.join(allowed)} "
                             f"(values in seconds)")
        if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
            raise ValueError(f"slo: {key} must be a positive number of seconds, got {v!r}")
        out[key] = float(v)
    return out


def summarise(requests: pa.Table, engine_steps: pa.Table, itl_ns: np.ndarray,
              slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Throughput, latency distributions, queueing, KV occupancy, preemptions, goodput.
    ``itl_ns``: every inter-token latency (reordered here: the caller's scratch)."""
    limits = _seconds(slo)
    status = np.asarray(requests.column("status").to_pylist())
    done = status == "finished"

    def col(name: str) -> np.ndarray:
        return np.asarray(requests.column(name).to_numpy(zero_copy_only=False),
                          np.float64)

    arrival, finish = col("arrival_ns"), col("finish_ns")
    ttft, e2e, queue = col("ttft_ns")[done], col("e2e_ns")[done], col("queue_ns")[done]
    out_tok = col("output_tokens")[done]
    span = (np.nanmax(finish[done]) - np.nanmin(arrival[done])) / NS if done.any() else 0.0
    s: dict[str, Any] = {
        "requests": int(requests.num_rows), "finished": int(done.sum()),
        "rejected": int((~done).sum()), "duration_s": float(span),
        "throughput_rps": float(done.sum() / span) if span > 0 else None,
        "throughput_output_tps": float(out_tok.sum() / span) if span > 0 else None,
        "throughput_total_tps": (float((out_tok.sum() + col("prompt_tokens")[done].sum())
                                       / span) if span > 0 else None),
        **{k: (v / NS if v is not None else None) for k, v in _stats(ttft, "ttft_s").items()},
        **{k: (v / NS if v is not None else None)
           for k, v in _stats(itl_ns, "itl_s").items()},
        **{k: (v / NS if v is not None else None) for k, v in _stats(e2e, "e2e_s").items()},
        **{k: (v / NS if v is not None else None) for k, v in _stats(queue, "queue_s").items()},
        "preemptions": int(np.asarray(requests.column("preemptions")).sum()),
        "cached_tokens": int(np.asarray(requests.column("cached_tokens")).sum()),
        "prompt_tokens": int(col("prompt_tokens")[done].sum()),
    }
    s["prefix_hit_rate"] = (s["cached_tokens"] / s["prompt_tokens"]) if s["prompt_tokens"] else 0.0
    es = {n: np.asarray(engine_steps.column(n)) for n in engine_steps.column_names}
    if es["batch_id"].size:
        occ = es["kv_used"] / es["kv_blocks"]
        w = es["step_ns"].astype(np.float64)
        s["kv_occupancy_mean"] = float(np.average(occ, weights=w) if w.sum() > 0 else occ.mean())
        s["kv_occupancy_max"] = float(occ.max())
        s["engine_steps"] = int(es["batch_id"].size)
        s["batch_requests_mean"] = float(es["requests"].mean())
        s["running_max"] = int(es["running"].max())
    else:
        s.update(kv_occupancy_mean=0.0, kv_occupancy_max=0.0, engine_steps=0,
                 batch_requests_mean=0.0, running_max=0)
    if limits:
        good = done.copy()
        checks = {"ttft": "ttft_ns", "itl": "itl_p99_ns", "tpot": "tpot_mean_ns",
                  "e2e": "e2e_ns"}
        for key, limit in limits.items():
            v = col(checks[key])
            good &= ~(v > limit * NS)  # a null (one-token request) has no ITL to miss
        s["slo"] = limits
        s["goodput_requests"] = int(good.sum())
        s["goodput_rps"] = float(good.sum() / span) if span > 0 else None
        s["slo_attainment"] = float(good.sum() / done.sum()) if done.any() else None
    return s
