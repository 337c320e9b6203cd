"""One trace priced under several deployments, and the comparisons the CLI prints.

Library functions behind ``blis-kernel compare`` (and the demo): each returns data or plain
lines; the CLI only parses arguments and prints (issue 30 item 2, decision LF4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel import bulk
from kernel.bulk.summary import summarise
from kernel.model.display import fmt_duration

from ..facade import factory

if TYPE_CHECKING:
    import polars as pl

    from kernel.bulk.summary import TraceSummary
    from kernel.facade.kernel import Kernel
    from kernel.io.protocols import TraceInput
    from pipeline.load import Repos

__all__ = ["compare_lines", "compare_rows", "compare_summaries", "decode_width", "open_kernel"]


def open_kernel(scenario: str, repos: Repos | None = None) -> Kernel:
    """``kernel.open`` on a scenario name or path, with optional roots."""
    k: Kernel = factory.open(scenario, repos) if repos is not None else factory.open(scenario)
    return k


def decode_width(k: Kernel) -> int:
    """The decode threshold a trace is priced with: 1 + speculative tokens."""
    try:
        return max(int(k.resolved_pool.uniform_decode_width), 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def _shift(base: TraceSummary, s: TraceSummary) -> str:
    b, shares = base.bottleneck_share("time"), s.bottleneck_share("time")
    moves = [(r, shares.get(r, 0.0) - b.get(r, 0.0)) for r in sorted(set(b) | set(shares))]
    moves = [(r, d) for r, d in moves if abs(d) >= 0.0005]
    moves.sort(key=lambda m: -abs(m[1]))
    return ", ".join(f"{r} {d * 100:+.1f} pt" for r, d in moves[:3]) or "none"


def compare_lines(summaries: list[TraceSummary], names: list[str]) -> list[str]:
    """One plain line per deployment after the first: the differences against the first."""

    base, out = summaries[0], []
    for s, name in zip(summaries[1:], names[1:], strict=True):
        rel = (s.total_no_overlap_ns / base.total_no_overlap_ns - 1
               if base.total_no_overlap_ns else 0.0)
        rel99 = (s.p99_no_overlap_ns / base.p99_no_overlap_ns - 1
                 if base.p99_no_overlap_ns else 0.0)
        gpu = s.gpu_ns()
        gpu_text = "" if gpu is None else f", GPU time {gpu / 1e9:,.0f} GPU-s"
        out.append(f"{name} vs {names[0]}: wall time {fmt_duration(s.total_no_overlap_ns)} "
                   f"({rel:+.1%}){gpu_text}, p99 {fmt_duration(s.p99_no_overlap_ns)} ({rel99:+.1%}), "
                   f"bottleneck shift (share of wall time): {_shift(base, s)}")
    return out


def compare_rows(summaries: list[TraceSummary], names: list[str]) -> list[dict[str, Any]]:
    """One row per deployment, machine-readable (``--format json|csv``): integer ns."""
    base = summaries[0]
    out = []
    for s, name in zip(summaries, names, strict=True):
        shares = s.bottleneck_share("time")
        out.append({
            "scenario": name, "batches": s.batches, "rows_rejected": s.rows_rejected,
            "total_no_overlap_ns": s.total_no_overlap_ns,
            "total_overlap_ns": s.total_overlap_ns,
            "total_vs_base": (s.total_no_overlap_ns / base.total_no_overlap_ns - 1
                              if base.total_no_overlap_ns else 0.0),
            "p50_no_overlap_ns": s.p50_no_overlap_ns, "p99_no_overlap_ns": s.p99_no_overlap_ns,
            "p99_vs_base": (s.p99_no_overlap_ns / base.p99_no_overlap_ns - 1
                            if base.p99_no_overlap_ns else 0.0),
            **{f"share_{r}": shares.get(r, 0.0) for r in ("sm", "hbm", "nvlink", "nic", "host")},
        })
    return out


def compare_summaries(trace: TraceInput, scenarios: Sequence[str | Kernel], repos: Repos | None = None,
                      decode_threshold: int | None = None
                      ) -> tuple[list[TraceSummary], list[pl.DataFrame]]:
    """Price ``trace`` under each scenario (a name, a path or an open kernel); the summaries
    and the priced frames, in order."""

    summaries, frames = [], []
    for item in scenarios:
        k = open_kernel(item, repos) if isinstance(item, str) else item
        dt = decode_threshold if decode_threshold is not None else decode_width(k)
        # Rejected rows are counted in the summary, never dropped silently.
        result = bulk.price_result(k, str(trace) if isinstance(trace, Path) else trace,
                                   decode_threshold=dt, on_reject="ignore")
        frames.append(result.priced)
        name = item if isinstance(item, str) else str(k.resolved_pool.scenario)
        summaries.append(dataclasses.replace(
            summarise(result.priced, k, scenario=name), rows_rejected=result.counts.rows_rejected,
            reject_reasons=_reasons(result.rejects)))
    return summaries, frames


def _reasons(rejects: pl.DataFrame) -> dict[str, int]:
    if not rejects.height:
        return {}
    counts = rejects.group_by("reason").len().sort("reason")
    return {str(r): int(n) for r, n in counts.iter_rows()}
