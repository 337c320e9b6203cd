"""The numbers behind the charts and the report.

Everything here is plain data: sweeps over a :class:`~kernel.facade.kernel.Kernel` return lists of
:class:`AnatomyPoint` / a :class:`BottleneckGrid` / a :class:`BatchLimit`. A priced trace's
numbers are :mod:`kernel.bulk.summary`; durations as text, :mod:`kernel.model.display`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernel.model.types import Batch, Request

from ..bulk.summary import RESOURCES

if TYPE_CHECKING:
    from kernel.facade.kernel import Kernel

__all__ = [
    "ANATOMY_SIZES",
    "AnatomyPoint",
    "BottleneckGrid",
    "MAP_CONTEXTS",
    "MAP_SIZES",
    "BatchLimit",
    "anatomy_sweep",
    "batch_limit",
    "bottleneck_grid",
    "decode_batch",
]

ANATOMY_SIZES: tuple[int, ...] = tuple(range(1, 257))
MAP_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MAP_CONTEXTS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                 131072)


# -- sweeps over a kernel ---------------------------------------------------------------------

def _decode_width(k: Kernel) -> int:
    """Tokens one decode request schedules per step (1 + speculative tokens)."""
    try:
        return max(int(k.resolved_pool.uniform_decode_width), 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def decode_batch(k: Kernel, size: int, context: int) -> Any:
    """``size`` identical decode requests whose next token sits at position ``context``."""

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


