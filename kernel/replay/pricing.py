"""The replay's one step-pricing seam (docs/replay.md).

Every step the replay runs is priced here and nowhere else: per-request numpy int64 arrays
(scheduled, computed, prompt_len) for one engine step in, the kernel's :class:`StepEstimate`
out. Today it builds a :class:`kernel.Batch`, so a replay's steps re-priced by ``k.price`` in
bulk give the same nanoseconds bit for bit; the fast array API (``Kernel.step_time_arrays``)
replaces the body after that lands, with the same contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..model.types import Batch, Request, StepEstimate

if TYPE_CHECKING:
    from ..facade.kernel import Kernel

__all__ = ["ESTIMATES", "price_step", "step_ns"]

ESTIMATES = ("overlap", "no_overlap", "calibrated")
_tuple_new = tuple.__new__


def price_step(k: Kernel, scheduled: np.ndarray, computed: np.ndarray, prompt_len: np.ndarray,
               decode_threshold: int = 1) -> StepEstimate:
    """The kernel's estimate for one engine step whose rows are the three arrays, in order."""
    fast = getattr(k, "step_time_arrays", None)
    if fast is not None:
        return fast(scheduled, computed, prompt_len,
                    decode_threshold=decode_threshold)
    # The arrays hold non-negative int64 counts made by the engine: Requests need no re-check.
    reqs = tuple(_tuple_new(Request, (s, c, p, 0)) for s, c, p in
                 zip(scheduled.tolist(), computed.tolist(), prompt_len.tolist(), strict=True))
    return k.step_time(Batch(reqs, decode_threshold))


def step_ns(est: StepEstimate, estimate: str) -> int:
    """The estimate the replay's clock advances by ("overlap", "no_overlap", "calibrated")."""
    if estimate == "no_overlap":
        return est.no_overlap
    if estimate == "overlap":
        return est.overlap
    if estimate == "calibrated":
        if est.calibrated is None:
            raise ValueError("estimate='calibrated' needs a kernel opened with a calibration "
                             "(kernel.open(..., calibration=...)); this one has none")
        return est.calibrated
    raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, not {estimate!r}")
