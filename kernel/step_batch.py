"""A reusable, mutable batch for simulators: one step's requests as numpy columns (issue 31).

A discrete-event simulator keeps its running requests from step to step: each step it sets how
many tokens each schedules, prices the step, then moves every request's ``computed`` on by its
``scheduled``, drops the finished ones and admits new ones. :class:`StepBatch` holds that state
as three int64 columns with spare capacity, updated in place by vectorised operations, so a
step costs a fixed number of numpy calls and never a Python object per request.

``StepBatch.step_time(k)`` is ``k.step_time_arrays(b.scheduled, b.computed, b.prompt_len,
decode_threshold=b.decode_threshold, sm_budget=b.sm_budget)``, which is ``k.step_time(
b.to_batch())`` bit for bit. The columns are views the caller may also write; every pricing
checks them again (negative counts are refused there, whoever wrote them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .step_arrays import column
from .types import Batch, Request, _count

if TYPE_CHECKING:
    from .kernel import Kernel
    from .types import StepEstimate

__all__ = ["StepBatch"]

_I64 = np.int64


class StepBatch:
    """The requests of the next step as columns: ``scheduled``, ``computed`` and
    ``prompt_len`` (views of length ``len(b)``), plus the step's ``decode_threshold`` and
    ``sm_budget``. Positions are the batch order (the order the walk sees)."""

    __slots__ = ("_cols", "_n", "decode_threshold", "sm_budget")

    def __init__(self, decode_threshold: int = 1, sm_budget: int = 0, capacity: int = 64):
        checked = Batch((), decode_threshold, sm_budget)  # the same checks as a Batch's
        self.decode_threshold = checked.decode_threshold
        self.sm_budget = checked.sm_budget
        self._cols = np.zeros((3, max(int(capacity), 1)), dtype=_I64)
        self._n = 0

    # -- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def scheduled(self) -> np.ndarray:
        """Tokens each request schedules this step (a writable view)."""
        return self._cols[0, :self._n]

    @property
    def computed(self) -> np.ndarray:
        """Tokens each request has computed before this step (a writable view)."""
        return self._cols[1, :self._n]

    @property
    def prompt_len(self) -> np.ndarray:
        """Each request's prompt length (carried, not read by step pricing; a writable view)."""
        return self._cols[2, :self._n]

    def to_batch(self) -> Batch:
        """The same step as a :class:`Batch` of :class:`Request` (for checks and display)."""
        return Batch([Request(*row) for row in self._cols[:, :self._n].T.tolist()],
                     self.decode_threshold, self.sm_budget)

    # -- pricing -------------------------------------------------------------------------
    def step_time(self, k: Kernel, per_resource: bool = True) -> StepEstimate:
        """``k.step_time(self.to_batch())``, bit for bit, from the columns."""
        cols = self._cols
        n = self._n
        return k.step_time_arrays(cols[0, :n], cols[1, :n], None,
                                  decode_threshold=self.decode_threshold,
                                  sm_budget=self.sm_budget, per_resource=per_resource)

    # -- changing --------------------------------------------------------------------------
    def add(self, scheduled: int, computed: int = 0, prompt_len: int = 0) -> int:
        """Append one request; returns its position."""
        row = (_count(scheduled, "scheduled"), _count(computed, "computed"),
               _count(prompt_len, "prompt_len"))
        for name, v in zip(("scheduled", "computed", "prompt_len"), row, strict=True):
            if v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v}")
        i = self._n
        self._reserve(i + 1)
        self._cols[:, i] = row
        self._n = i + 1
        return i

    def extend(self, scheduled: Any, computed: Any, prompt_len: Any = None) -> None:
        """Append requests given as columns (numpy/Arrow integer arrays or int sequences)."""
        cols = [np.asarray(column(scheduled, "scheduled"), dtype=_I64),
                np.asarray(column(computed, "computed"), dtype=_I64)]
        m = len(cols[0])
        cols.append(np.zeros(m, dtype=_I64) if prompt_len is None
                    else np.asarray(column(prompt_len, "prompt_len"), dtype=_I64))
        for name, c in zip(("scheduled", "computed", "prompt_len"), cols, strict=True):
            if len(c) != m:
                raise ValueError(f"{name} has {len(c)} entries, scheduled has {m}: one each "
                                 f"per request")
            if m and c.min() < 0:
                i = int(np.argmax(c < 0))
                raise ValueError(f"{name}[{i}] is {c[i]}; token counts must be non-negative "
                                 f"integers")
        n = self._n
        self._reserve(n + m)
        self._cols[:, n:n + m] = cols
        self._n = n + m

    def remove(self, which: Any) -> None:
        """Drop requests, keeping the others in order: a position, positions, or a boolean
        mask over the current requests (True = drop)."""
        n = self._n
        sel = np.asarray(which)
        if sel.dtype == bool:
            if sel.shape != (n,):
                raise ValueError(f"a removal mask needs one entry per request ({n}), got "
                                 f"shape {sel.shape}")
            keep = ~sel
        else:
            if sel.dtype.kind not in "iu":
                raise ValueError(f"remove takes positions (integers) or a boolean mask, got "
                                 f"dtype {sel.dtype}")
            pos = sel.reshape(-1)
            if pos.size and (pos.min() < -n or pos.max() >= n):
                raise IndexError(f"position out of range for a batch of {n} requests: "
                                 f"{pos.tolist()}")
            keep = np.ones(n, dtype=bool)
            keep[pos] = False
        kept = self._cols[:, :n][:, keep]
        m = kept.shape[1]
        self._cols[:, :m] = kept
        self._n = m

    def advance(self) -> None:
        """The step ran: every request's ``computed`` moves on by its ``scheduled``."""
        n = self._n
        cols = self._cols
        np.add(cols[1, :n], cols[0, :n], out=cols[1, :n])

    def schedule(self, scheduled: Any) -> None:
        """Set every request's ``scheduled`` for the next step (a column, or one int for all)."""
        n = self._n
        if isinstance(scheduled, int | np.integer) and not isinstance(scheduled, bool | np.bool_):
            v = _count(scheduled, "scheduled")
            if v < 0:
                raise ValueError(f"scheduled must be a non-negative integer, got {v}")
            self._cols[0, :n] = v
            return
        col = np.asarray(column(scheduled, "scheduled"), dtype=_I64)
        if len(col) != n:
            raise ValueError(f"scheduled has {len(col)} entries for {n} requests")
        if n and col.min() < 0:
            i = int(np.argmax(col < 0))
            raise ValueError(f"scheduled[{i}] is {col[i]}; token counts must be non-negative "
                             f"integers")
        self._cols[0, :n] = col

    def clear(self) -> None:
        """Drop every request (the capacity stays)."""
        self._n = 0

    def _reserve(self, need: int) -> None:
        cap = self._cols.shape[1]
        if need > cap:
            grown = np.zeros((3, max(need, 2 * cap)), dtype=_I64)
            grown[:, :self._n] = self._cols[:, :self._n]
            self._cols = grown

    def __repr__(self) -> str:
        return (f"StepBatch({self._n} requests, decode_threshold={self.decode_threshold}, "
                f"sm_budget={self.sm_budget})")
