"""The numbers behind the charts and the report.

Everything here is plain data: sweeps over a :class:`~kernel.kernel.Kernel` return lists of
:class:`AnatomyPoint` / a :class:`BottleneckGrid`, and :func:`summarise` turns a priced trace
(the frame :func:`kernel.bulk.price` returns) into a :class:`TraceSummary`. Durations stay
integer nanoseconds; only the text and the charts convert to µs / ms / s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from kernel.kernel import Kernel

__all__ = [
    "ANATOMY_SIZES",
    "AnatomyPoint",
    "BottleneckGrid",
    "MAP_CONTEXTS",
    "MAP_SIZES",
    "RESOURCE_COLUMNS",
    "RESOURCES",
    "TraceSummary",
    "BatchLimit",
    "anatomy_sweep",
    "batch_limit",
    "bottleneck_grid",
    "decode_batch",
    "fmt_duration",
    "fmt_long",
    "fmt_si",
    "fmt_span",
    "gpus_of_pool",
    "nearest_rank",
    "summarise",
]

# The reference's tie-break order; also the order of every legend.
RESOURCES: tuple[str, ...] = ("sm", "hbm", "nvlink", "nic", "host")
RESOURCE_COLUMNS: dict[str, str] = {r: f"{r}_ns" for r in RESOURCES}

ANATOMY_SIZES: tuple[int, ...] = tuple(range(1, 257))
MAP_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MAP_CONTEXTS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                 131072)


def fmt_duration(ns: float) -> str:
    """A duration in the unit that reads best: ns, µs, ms (three significant digits) or
    seconds — three significant digits below 100 s, then whole seconds to four significant
    digits with thousands separators (195,100 s), never scientific notation."""
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms"
    secs = ns / 1e9
    if a < 100e9:
        return f"{secs:.3g} s"
    digits = len(str(int(abs(secs))))
    return f"{round(secs, 4 - digits):,.0f} s"


_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(value: float, unit: str) -> str:
    """A count with an SI prefix and three significant digits: 1.06 EFLOP, 4.08 PB."""
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


_SPANS = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def fmt_span(ns: float) -> str:
    """A long duration as its two largest calendar units ("2 d 6 h", "3 h 12 min", "4 min
    10 s"); under a minute, :func:`fmt_duration`."""
    if abs(ns) < 60e9:
        return fmt_duration(ns)
    left = int(round(abs(ns) / 1e9))
    parts: list[str] = []
    for unit, size in _SPANS:
        n, left = divmod(left, size)
        if n or parts:
            parts.append(f"{n} {unit}")
        if len(parts) == 2:
            break
    parts = [p for p in parts if not p.startswith("0 ")] or parts[:1]
    return ("-" if ns < 0 else "") + " ".join(parts)


def fmt_long(ns: float) -> str:
    """``fmt_span`` with the exact seconds alongside once it exceeds a minute:
    "2 d 6 h (195,100 s)"."""
    if abs(ns) < 60e9:
        return fmt_duration(ns)
    return f"{fmt_span(ns)} ({fmt_duration(ns)})"


def nearest_rank(values: Sequence[int] | np.ndarray, q: float) -> int:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``: an observed value.

    A selection (``np.partition``), not a sort: linear in the number of values."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.size == 0:
        return 0
    rank = min(max(math.ceil(q * arr.size), 1), arr.size) - 1
    return int(np.partition(arr, rank)[rank])


# -- sweeps over a kernel ---------------------------------------------------------------------

def _decode_width(k: Kernel) -> int:
    """Tokens one decode request schedules per step (1 + speculative tokens)."""
    try:
        return max(int(k.resolved_pool.uniform_decode_width), 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def decode_batch(k: Kernel, size: int, context: int) -> Any:
    """``size`` identical decode requests whose next token sits at position ``context``."""
    from kernel.types import Batch, Request

    width = _decode_width(k)
    computed = max(context - width, 0)
    return Batch([Request(width, computed, computed)] * size, decode_threshold=width)


@dataclass(frozen=True)
class AnatomyPoint:
    """One decode step's price at one batch size."""

    batch_size: int
    overlap_ns: int
    no_overlap_ns: int
    bottleneck: str
    per_resource: dict[str, int] = field(default_factory=dict)


def anatomy_sweep(k: Kernel, context: int = 4096,
                  sizes: Iterable[int] = ANATOMY_SIZES) -> list[AnatomyPoint]:
    """Price a uniform decode batch of every size in ``sizes`` at a fixed ``context``."""
    points = []
    for n in sizes:
        per: dict[Any, int] = {}
        est = k.step_time_into(decode_batch(k, n, context), per)
        points.append(AnatomyPoint(n, int(est.overlap), int(est.no_overlap),
                                   str(est.bottleneck),
                                   {str(r): int(v) for r, v in per.items()}))
    return points


@dataclass(frozen=True)
class BottleneckGrid:
    """The binding resource of a uniform decode step per (context, batch size)."""

    sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    cells: tuple[tuple[str, ...], ...]  # cells[i][j]: contexts[i] × sizes[j]
    no_overlap_ns: tuple[tuple[int, ...], ...] = ()

    def resources(self) -> list[str]:
        """The resources that bind somewhere, in tie-break order."""
        seen = {c for row in self.cells for c in row}
        return [r for r in RESOURCES if r in seen] + sorted(seen - set(RESOURCES))


def bottleneck_grid(k: Kernel, sizes: Iterable[int] = MAP_SIZES,
                    contexts: Iterable[int] = MAP_CONTEXTS) -> BottleneckGrid:
    """Which resource binds over batch size × context length (contexts past the model's
    ``max_model_len`` are dropped)."""
    sizes_t = tuple(int(s) for s in sizes)
    limit = getattr(k.resolved_pool, "max_model_len", 0) or 0
    ctx_t = tuple(int(c) for c in contexts if not limit or c <= limit) or (min(contexts),)
    cells, times = [], []
    for c in ctx_t:
        row, trow = [], []
        for n in sizes_t:
            est = k.step_time(decode_batch(k, n, c))
            row.append(str(est.bottleneck))
            trow.append(int(est.no_overlap))
        cells.append(tuple(row))
        times.append(tuple(trow))
    return BottleneckGrid(sizes_t, ctx_t, tuple(cells), tuple(times))


def gpus_of_pool(k: Kernel) -> int | None:
    """The GPUs one pool occupies: tp × pp × dp × pcp (DCP reuses the TP ranks); None when
    the kernel does not say."""
    lay = getattr(k.resolved_pool, "layout", None)
    if lay is None:
        return None
    return max(lay.tp, 1) * max(lay.pp, 1) * max(lay.dp, 1) * max(lay.pcp, 1)


@dataclass(frozen=True)
class BatchLimit:
    """The largest decode batch a pool can hold at one context, and what sets it."""

    size: int
    reason: str  # "max_num_seqs = 256" or "KV capacity at 4,096 tokens"


def batch_limit(k: Kernel, context: int) -> BatchLimit | None:
    """min(max_num_seqs, the requests whose KV fits at ``context``): vLLM's concurrency rule,
    KV blocks × page / (SequenceVariableBytes(context) + SequenceAdmissionBytes)."""
    r = k.resolved_pool
    out: list[BatchLimit] = []
    seqs = int(getattr(r, "max_num_seqs", 0) or 0)
    if seqs > 0:
        out.append(BatchLimit(seqs, f"max_num_seqs = {seqs:,}"))
    if hasattr(k, "kv_capacity") and hasattr(k, "sequence_variable_bytes"):
        cap = k.kv_capacity()
        per = k.sequence_variable_bytes(context) + k.sequence_admission_bytes()
        if per > 0:
            fit = int(cap.num_blocks * cap.page_bytes // per)
            out.append(BatchLimit(fit, f"KV capacity at {context:,} tokens ({fit:,} requests)"))
    return min(out, key=lambda b: b.size) if out else None


# -- a priced trace -----------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceSummary:
    """The headline numbers of one priced trace."""

    batches: int
    requests: int
    tokens: int
    prefill_requests: int
    decode_requests: int
    total_no_overlap_ns: int
    total_overlap_ns: int
    mean_no_overlap_ns: float
    p50_no_overlap_ns: int
    p99_no_overlap_ns: int
    p50_overlap_ns: int
    p99_overlap_ns: int
    max_no_overlap_ns: int
    bottleneck_batches: dict[str, int]
    bottleneck_time_ns: dict[str, int]  # Σ no_overlap of the batches each resource binds
    resource_time_ns: dict[str, int]  # Σ per-resource busy time over the trace
    evidence: tuple[int, int] | None = None  # (evidenced, total) provenance entries
    scenario: str | None = None
    gpus: int | None = None  # GPUs of the pool (with a kernel): GPU time = wall time × gpus

    def gpu_ns(self, overlap: bool = False) -> int | None:
        """GPU time (GPU-nanoseconds): wall time × the pool's GPUs; None without a kernel."""
        if self.gpus is None:
            return None
        return (self.total_overlap_ns if overlap else self.total_no_overlap_ns) * self.gpus
    # Batches over each deployment limit (kernel.limits); None: the table has no limits column.
    over_limit: dict[str, int] | None = None
    over_limit_batches: int = 0
    # Trace rows set aside when this summary's trace was priced (when known), by reason.
    rows_rejected: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def evidence_ratio(self) -> float | None:
        if self.evidence is None or not self.evidence[1]:
            return None
        return self.evidence[0] / self.evidence[1]

    def bottleneck_share(self, by: str = "time") -> dict[str, float]:
        """Each binding resource's share of batches (``by="batches"``) or of time."""
        src = self.bottleneck_time_ns if by == "time" else self.bottleneck_batches
        total = sum(src.values())
        return {r: (v / total if total else 0.0) for r, v in src.items()}

    def lines(self) -> list[str]:
        """The short text summary the demo prints."""
        shares_t = self.bottleneck_share("time")
        shares_b = self.bottleneck_share("batches")
        binds = ", ".join(f"{r} {shares_t[r]:.1%} of time ({shares_b[r]:.1%} of batches)"
                          for r in _ordered(shares_t) if self.bottleneck_batches.get(r))
        out = []
        if self.scenario:
            out.append(f"scenario        {self.scenario}")
        out += [
            f"batches         {self.batches:,} ({self.requests:,} request-steps: "
            f"{self.prefill_requests:,} prefill, {self.decode_requests:,} decode; "
            f"{self.tokens:,} tokens)",
            f"wall time       {fmt_long(self.total_no_overlap_ns)} NoOverlap, "
            f"{fmt_long(self.total_overlap_ns)} Overlap (steps back to back)",
            f"step time       p50 {fmt_duration(self.p50_no_overlap_ns)}, "
            f"p99 {fmt_duration(self.p99_no_overlap_ns)}, "
            f"max {fmt_duration(self.max_no_overlap_ns)} (NoOverlap); "
            f"p50 {fmt_duration(self.p50_overlap_ns)}, "
            f"p99 {fmt_duration(self.p99_overlap_ns)} (Overlap)",
            f"bottleneck      {binds or '-'}",
        ]
        gpu = self.gpu_ns()
        if gpu is not None:
            out.insert(-2, f"GPU time        {gpu / 1e9:,.0f} GPU-s NoOverlap "
                       f"(wall time × {self.gpus} GPUs of the pool)")
        if self.rows_rejected:
            why = ", ".join(f"{r} {n:,}" for r, n in self.reject_reasons.items())
            out.append(f"rejected        {self.rows_rejected:,} trace rows set aside"
                       + (f" ({why})" if why else ""))
        if self.over_limit is not None:
            which = ", ".join(f"{name} {n:,}" for name, n in self.over_limit.items() if n)
            noun = "batch" if self.over_limit_batches == 1 else "batches"
            out.append(f"limits          {self.over_limit_batches:,} {noun} over a deployment "
                       f"limit" + (f" ({which})" if which else ""))
        if self.evidence is not None:
            ev, total = self.evidence
            ratio = self.evidence_ratio
            out.append(f"evidence        {ev}/{total} provenance entries rest on evidence"
                       + (f" ({ratio:.0%})" if ratio is not None else ""))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "batches": self.batches, "requests": self.requests,
            "tokens": self.tokens, "prefill_requests": self.prefill_requests,
            "decode_requests": self.decode_requests,
            "total_no_overlap_ns": self.total_no_overlap_ns,
            "total_overlap_ns": self.total_overlap_ns,
            "p50_no_overlap_ns": self.p50_no_overlap_ns,
            "p99_no_overlap_ns": self.p99_no_overlap_ns,
            "bottleneck_batches": dict(self.bottleneck_batches),
            "bottleneck_time_ns": dict(self.bottleneck_time_ns),
            "evidence": list(self.evidence) if self.evidence else None,
            "gpus": self.gpus, "gpu_no_overlap_ns": self.gpu_ns(),
            "over_limit": dict(self.over_limit) if self.over_limit is not None else None,
            "over_limit_batches": self.over_limit_batches,
        }


def _ordered(keys: Iterable[str]) -> list[str]:
    ks = set(keys)
    return [r for r in RESOURCES if r in ks] + sorted(ks - set(RESOURCES))


def _col_sum(df: pl.DataFrame, col: str) -> int:
    return int(df[col].sum()) if col in df.columns and df.height else 0


def summarise(priced: pl.DataFrame, k: Kernel | None = None,
              scenario: str | None = None) -> TraceSummary:
    """The headline numbers of a priced trace; ``k`` adds the evidence ratio and scenario."""
    no = priced["no_overlap_ns"].to_numpy() if priced.height else np.zeros(0, np.int64)
    ov = priced["overlap_ns"].to_numpy() if priced.height else np.zeros(0, np.int64)
    by = (priced.group_by("bottleneck")
          .agg(pl.len().alias("n"), pl.col("no_overlap_ns").sum().alias("t"))
          if priced.height else pl.DataFrame({"bottleneck": [], "n": [], "t": []}))
    counts = {str(r["bottleneck"]): int(r["n"]) for r in by.iter_rows(named=True)}
    times = {str(r["bottleneck"]): int(r["t"]) for r in by.iter_rows(named=True)}
    order = _ordered(counts)
    evidence = None
    gpus = None
    if k is not None:
        gpus = gpus_of_pool(k)
        ev, total, _ = k.evidence()
        evidence = (int(ev), int(total))
        if scenario is None:
            scenario = getattr(k.resolved_pool, "scenario", None)
    return TraceSummary(
        batches=priced.height,
        requests=_col_sum(priced, "requests"),
        tokens=_col_sum(priced, "tokens"),
        prefill_requests=_col_sum(priced, "prefill_requests"),
        decode_requests=_col_sum(priced, "decode_requests"),
        total_no_overlap_ns=int(no.sum()),
        total_overlap_ns=int(ov.sum()),
        mean_no_overlap_ns=float(no.mean()) if no.size else 0.0,
        p50_no_overlap_ns=nearest_rank(no, 0.50),
        p99_no_overlap_ns=nearest_rank(no, 0.99),
        p50_overlap_ns=nearest_rank(ov, 0.50),
        p99_overlap_ns=nearest_rank(ov, 0.99),
        max_no_overlap_ns=int(no.max()) if no.size else 0,
        bottleneck_batches={r: counts[r] for r in order},
        bottleneck_time_ns={r: times[r] for r in order},
        resource_time_ns={r: _col_sum(priced, c) for r, c in RESOURCE_COLUMNS.items()
                          if c in priced.columns},
        evidence=evidence,
        scenario=scenario,
        gpus=gpus,
        **_over_limit(priced),
    )


def _over_limit(priced: pl.DataFrame) -> dict[str, Any]:
    """Batches over each deployment limit, from the ``limits`` column (kernel.limits)."""
    from kernel.limits import NAMES

    if "limits" not in priced.columns:
        return {}
    flagged = priced["limits"].fill_null("")
    per = {name: int(flagged.str.contains(rf"(^|,){name}(,|$)").sum()) for name in NAMES}
    return {"over_limit": per, "over_limit_batches": int((flagged != "").sum())}
