"""A priced trace's headline numbers (:class:`TraceSummary`, :func:`summarise`) and its
notebook view (:func:`priced_html`): plain data over the frame :func:`kernel.bulk.price`
returns. Durations stay integer nanoseconds."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ..model.display import fmt_duration, fmt_long, table_html
from ..model.limits import NAMES

if TYPE_CHECKING:
    from ..io.stamp import Stamp
    from ..model.pricer import Pricer

# The reference's tie-break order; also the order of every legend.
RESOURCES: tuple[str, ...] = ("sm", "hbm", "nvlink", "nic", "host")
RESOURCE_COLUMNS: dict[str, str] = {r: f"{r}_ns" for r in RESOURCES}

def nearest_rank(values: Sequence[int] | np.ndarray, q: float) -> int:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``: an observed value.

    A selection (``np.partition``), not a sort: linear in the number of values."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.size == 0:
        return 0
    rank = min(max(math.ceil(q * arr.size), 1), arr.size) - 1
    return int(np.partition(arr, rank)[rank])


def gpus_of_pool(k: Pricer) -> int | None:
    """The GPUs one pool occupies: tp × pp × dp × pcp (DCP reuses the TP ranks); None when
    the kernel does not say."""
    lay = getattr(k.resolved_pool, "layout", None)
    if lay is None:
        return None
    return max(lay.tp, 1) * max(lay.pp, 1) * max(lay.dp, 1) * max(lay.pcp, 1)


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
    # Batches over each deployment limit (kernel.model.limits); None: the table has no limits column.
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


def summarise(priced: pl.DataFrame, k: Pricer | None = None,
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
    """Batches over each deployment limit, from the ``limits`` column (kernel.model.limits)."""
    if "limits" not in priced.columns:
        return {}
    flagged = priced["limits"].fill_null("")
    per = {name: int(flagged.str.contains(rf"(^|,){name}(,|$)").sum()) for name in NAMES}
    return {"over_limit": per, "over_limit_batches": int((flagged != "").sum())}


def priced_html(frame: pl.DataFrame, stamp: Stamp | None = None, title: str = "priced trace",
                extra: Iterable[tuple[str, str]] = ()) -> str:
    """A priced frame: the headline numbers, the stamp, then polars' own table."""
    s = summarise(frame) if {"no_overlap_ns", "overlap_ns", "bottleneck"} <= set(
        frame.columns) else None
    rows: list[tuple[str, str]] = [("batches", f"{frame.height:,}")]
    if s is not None and frame.height:
        rows += [("NoOverlap", f"total {fmt_duration(s.total_no_overlap_ns)}, p50 "
                               f"{fmt_duration(s.p50_no_overlap_ns)}, p99 {fmt_duration(s.p99_no_overlap_ns)}"),
                 ("Overlap", f"total {fmt_duration(s.total_overlap_ns)}, p99 {fmt_duration(s.p99_overlap_ns)}")]
        shares = s.bottleneck_share("time")
        rows.append(("bottleneck (time)", ", ".join(f"{k} {v:.0%}" for k, v in shares.items()
                                                    if v)))
    rows += list(extra)
    if stamp is not None:
        rows += [("made by", line) for line in stamp.lines()]
    return f"<div>{table_html(rows, title)}{frame._repr_html_()}</div>"
