"""Synthetic continuous-batching traces (the demo's, the tests' and the benchmark's input).

The generator models a vLLM-style engine in steady state:

* requests arrive as a Poisson process whose rate keeps, by Little's law, ``requests_per_batch``
  requests in flight on average;
* each request has a prompt length and an output length drawn from the given distributions;
* it is prefilled in chunks of at most ``chunk`` tokens (``scheduled = min(chunk, left)``,
  ``computed`` = tokens already prefilled), then decodes one token per step
  (``scheduled = 1``, ``computed = prompt + k``) for ``output - 1`` steps — the last prefill
  chunk samples the first output token — and leaves;
* unless given, ``chunk`` is solved so that the share of request rows that are prefill chunks
  is ``prefill_share``; it never exceeds ``max_num_batched_tokens``.

It is vectorised: requests are drawn once, then rows are expanded window by window of
``window`` steps with ``np.repeat`` and ordered with a stable 16-bit radix sort, so memory is
bounded by one window and a 1,000,000-step trace takes seconds. Within a step, requests appear
in arrival order. The budget is honoured on average, not per step: rare pile-ups of prefill
chunks can exceed ``max_num_batched_tokens`` (``SynthStats.over_budget_steps`` counts them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import safe_output

# Requests in one synthetic trace (each costs ~40 bytes while the plan is built).
MAX_REQUESTS = 100_000_000

__all__ = ["Lengths", "SynthStats", "synth", "synth_batches", "write_synth"]

SCHEMA = pa.schema([
    ("batch_id", pa.int64()),
    ("scheduled", pa.int32()),
    ("computed", pa.int32()),
    ("prompt_len", pa.int32()),
])


@dataclass(frozen=True)
class Lengths:
    """A length distribution: ``fixed:N``, ``uniform:LO:HI``, ``lognormal:MEAN:SIGMA``,
    ``exponential:MEAN``; samples are integers clipped to ``[lo, hi]``."""

    kind: str
    a: float
    b: float = 0.0
    lo: int = 1
    hi: int = 131072

    @classmethod
    def parse(cls, text: str | Lengths, *, lo: int = 1, hi: int = 131072) -> Lengths:
        if isinstance(text, Lengths):
            return text
        parts = str(text).split(":")
        kind = parts[0].strip().lower()
        try:
            nums = [float(p) for p in parts[1:]]
        except ValueError as e:
            raise ValueError(f"bad length distribution {text!r}: {e}") from None
        need = {"fixed": 1, "uniform": 2, "lognormal": 2, "exponential": 1}
        if kind not in need or len(nums) != need[kind]:
            raise ValueError(f"bad length distribution {text!r}: expected one of fixed:N, "
                             "uniform:LO:HI, lognormal:MEAN:SIGMA, exponential:MEAN")
        if any(n < 0 or not math.isfinite(n) for n in nums):
            raise ValueError(f"bad length distribution {text!r}: parameters must be >= 0")
        return cls(kind, nums[0], nums[1] if len(nums) > 1 else 0.0, lo, hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, n)
        elif self.kind == "exponential":
            x = rng.exponential(self.a, n)
        else:  # lognormal parameterised by its mean and the log-space sigma
            mu = math.log(max(self.a, 1e-9)) - self.b * self.b / 2
            x = rng.lognormal(mu, self.b, n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


@dataclass(frozen=True)
class SynthStats:
    batches: int
    rows: int
    requests: int
    chunk: int
    prefill_rows: int
    over_budget_steps: int

    @property
    def prefill_share(self) -> float:
        return self.prefill_rows / self.rows if self.rows else 0.0

    @property
    def requests_per_batch(self) -> float:
        return self.rows / self.batches if self.batches else 0.0


@dataclass(frozen=True)
class _Plan:
    arrival: np.ndarray  # int64, sorted
    prompt: np.ndarray
    chunks: np.ndarray  # prefill chunks per request
    life: np.ndarray  # steps in flight = chunks + output - 1
    chunk: int
    max_life: int


def _solve_chunk(prompt: np.ndarray, decode_steps: float, share: float, budget: int) -> int:
    """The chunk size whose mean chunk count makes prefill rows ``share`` of all rows."""
    if share <= 0:
        return max(budget, 1)
    if share >= 1:
        return 1
    target = share / (1 - share) * decode_steps  # wanted mean chunks per request
    lo, hi = 1, max(budget, 1)

    def mean_chunks(c: int) -> float:
        return float(np.mean(-(-prompt // c)))

    if mean_chunks(hi) >= target:
        return hi
    if mean_chunks(lo) <= target:
        return lo
    while hi - lo > 1:  # mean_chunks is non-increasing in c
        mid = (lo + hi) // 2
        if mean_chunks(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi if abs(mean_chunks(hi) - target) <= abs(mean_chunks(lo) - target) else lo


def _plan(batches: int, requests_per_batch: float, prefill_share: float, prompt: Lengths,
          output: Lengths, max_num_batched_tokens: int, chunk: int | None,
          rng: np.random.Generator) -> _Plan:
    probe = 200_000
    p_probe = prompt.sample(rng, probe)
    o_probe = np.maximum(output.sample(rng, probe), 1)
    decode_mean = float(np.mean(o_probe - 1))
    c = chunk if chunk is not None else _solve_chunk(p_probe, decode_mean, prefill_share,
                                                     max_num_batched_tokens)
    c = int(min(max(c, 1), max(max_num_batched_tokens, 1)))
    mean_life = float(np.mean(-(-p_probe // c) + o_probe - 1))
    rate = requests_per_batch / max(mean_life, 1e-9)  # arrivals per step (Little's law)
    warm = int(np.quantile(-(-p_probe // c) + o_probe - 1, 0.999)) + 1
    span = batches + warm
    if rate * span > MAX_REQUESTS:  # the plan holds a few arrays of this length in memory
        raise ValueError(f"the trace would hold ~{rate * span:,.0f} requests; at most "
                         f"{MAX_REQUESTS:,}: lower the batches or the requests per batch")
    n = int(rng.poisson(rate * span))
    arrival = np.sort(rng.integers(-warm, batches, n)).astype(np.int64)
    p = prompt.sample(rng, n)
    o = np.maximum(output.sample(rng, n), 1)
    chunks = -(-p // c)
    life = chunks + o - 1
    return _Plan(arrival, p, chunks, life, c, int(life.max()) if n else 0)


def synth_batches(batches: int, *, requests_per_batch: float = 32.0,
                  prefill_share: float = 0.05, prompt: str | Lengths = "lognormal:1024:1.0",
                  output: str | Lengths = "lognormal:256:1.0",
                  max_num_batched_tokens: int = 8192, chunk: int | None = None, seed: int = 0,
                  window: int = 65536, stats: list[SynthStats] | None = None,
                  request_ids: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield the trace as Arrow record batches of whole steps, in step order.

    If ``stats`` is a list, a :class:`SynthStats` is appended to it when the iterator ends.
    ``request_ids`` adds a ``request_id`` column (requests numbered in arrival order).
    """
    if batches < 0:
        raise ValueError("batches must be >= 0")
    if requests_per_batch <= 0:
        raise ValueError("requests_per_batch must be > 0")
    if not 0 <= prefill_share < 1:
        raise ValueError("prefill_share must be in [0, 1)")
    window = max(1, min(int(window), 65536))  # keys fit the 16-bit radix sort
    rng = np.random.default_rng(seed)
    plan = _plan(batches, requests_per_batch, prefill_share, Lengths.parse(prompt, lo=1),
                 Lengths.parse(output, lo=1), max_num_batched_tokens, chunk, rng)
    c = plan.chunk
    end = plan.arrival + plan.life
    rows = prefill_rows = over = 0
    for w0 in range(0, batches, window):
        w1 = min(w0 + window, batches)
        lo = int(np.searchsorted(plan.arrival, w0 - plan.max_life, "left"))
        hi = int(np.searchsorted(plan.arrival, w1, "left"))
        idx = np.arange(lo, hi)
        idx = idx[end[lo:hi] > w0]
        start = np.maximum(plan.arrival[idx], w0)
        stop = np.minimum(end[idx], w1)
        count = stop - start
        keep = count > 0
        idx, start, count = idx[keep], start[keep], count[keep]
        total = int(count.sum())
        req = np.repeat(np.arange(idx.size), count)
        offs = np.cumsum(count) - count
        step = np.arange(total, dtype=np.int64) - np.repeat(offs, count) + np.repeat(start, count)
        pos = step - np.repeat(plan.arrival[idx], count)  # step index within the request
        nch = plan.chunks[idx][req]
        ptk = plan.prompt[idx][req]
        pre = pos < nch
        done = np.minimum(pos, nch) * c
        scheduled = np.where(pre, np.minimum(c, ptk - np.minimum(done, ptk)), 1)
        computed = np.where(pre, done, ptk + (pos - nch))
        order = np.argsort((step - w0).astype(np.uint16), kind="stable")
        step = step[order]
        scheduled = scheduled[order]
        rows += total
        prefill_rows += int(pre.sum())
        if total:
            per = np.bincount(step - w0, weights=scheduled, minlength=w1 - w0)
            over += int((per > max_num_batched_tokens).sum())
        arrays = [pa.array(step), pa.array(scheduled.astype(np.int32)),
                  pa.array(computed[order].astype(np.int32)), pa.array(ptk[order].astype(np.int32))]
        if request_ids:
            arrays.append(pa.array(idx[req][order].astype(np.int64)))
        yield pa.RecordBatch.from_arrays(arrays, schema=_schema(request_ids))
    if stats is not None:
        stats.append(SynthStats(batches, rows, int(plan.arrival.size), c, prefill_rows, over))


def _schema(request_ids: bool) -> pa.Schema:
    return SCHEMA.append(pa.field("request_id", pa.int64())) if request_ids else SCHEMA


def synth(batches: int, **kwargs: object) -> pa.Table:
    """The whole trace as one Arrow table (see :func:`synth_batches` for the parameters)."""
    parts = list(synth_batches(batches, **kwargs))  # type: ignore[arg-type]
    return pa.Table.from_batches(parts, schema=_schema(bool(kwargs.get("request_ids"))))


def write_synth(path: str | Path, batches: int, *, row_group_rows: int = 1 << 20,
                **kwargs: object) -> SynthStats:
    """Write a synthetic trace to parquet (``.csv`` / ``.arrow`` / ``.ipc`` by suffix)."""
    stats: list[SynthStats] = []
    it = synth_batches(batches, stats=stats, **kwargs)  # type: ignore[arg-type]
    schema = _schema(bool(kwargs.get("request_ids")))
    path = Path(path)
    suffix = path.suffix.lower()
    with safe_output.atomic(path) as tmp:
        if suffix == ".csv":
            import pyarrow.csv as pcsv  # (heavy: Arrow, loaded only on this path)

            with pcsv.CSVWriter(str(tmp), schema) as w:
                for rb in it:
                    w.write_batch(rb)
        elif suffix in (".arrow", ".ipc", ".feather"):
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
                for rb in it:
                    w.write_batch(rb)
        else:
            with pq.ParquetWriter(str(tmp), schema, compression="lz4") as pw:
                for rb in it:
                    pw.write_batch(rb, row_group_size=row_group_rows)
    return stats[0]
