"""A reusable, mutable batch for simulators: one step's requests as numpy columns (issue 31).

A discrete-event simulator keeps its running requests from step to step: each step it sets how
many tokens each schedules, prices the step, then moves every request's ``computed`` on by its
``scheduled``, drops the finished ones and admits new ones. :class:`StepBatch` holds that state
as three int64 columns with spare capacity, changed only through its methods, each a fixed
number of numpy calls and never a Python object per request. Every method checks what it is
given (non-negative integers), and keeps the step's aggregates up to date: Σ scheduled,
Σ computed and how many requests schedule each count. So an all-decode step is priced from
those aggregates alone, in time independent of the batch size; a step with prefill reads
its columns once (:func:`kernel.model.step.walk_columns`).

``b.step_time(k)`` is ``k.step_time(b.to_batch())`` bit for bit (``tests/test_step_arrays.py``
checks that after every operation). The columns read back as read-only views.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from . import jit
from .step import _compose, finish, mixed_estimate, prefill_rows, prepared, walk_parts
from .step_arrays import column, position, threshold_and_budget
from .step_fast import decode_estimate
from .types import Batch, Request, Resource, _count, refuse_empty

if TYPE_CHECKING:
    from .pricer import Pricer
    from .types import StepEstimate

__all__ = ["StepBatch"]

_I64 = np.int64
_FIELDS = ("scheduled", "computed", "prompt_len")


def shift_left(cols: np.ndarray, i: int, n: int) -> None:
    """``cols[:, i:n - 1] = cols[:, i + 1:n]``: the columns after request ``i`` move down by
    one (compiled by :mod:`kernel.model.jit`, decision AJ6; this is also its specification)."""
    for r in range(cols.shape[0]):
        for j in range(i, n - 1):
            cols[r, j] = cols[r, j + 1]


def _checked(values: Any, name: str) -> np.ndarray:
    """A column of non-negative integers as int64 (errors name the first bad position)."""
    col = np.asarray(column(values, name), dtype=_I64)
    if len(col) and col.min() < 0:
        i = int(np.argmax(col < 0))
        raise ValueError(f"{name}[{i}] is {col[i]}; token counts must be non-negative integers")
    return col


class StepBatch:
    """The requests of the next step as columns, in batch order (the order the walk sees),
    plus the step's ``decode_threshold`` and ``sm_budget`` (checked when priced)."""

    __slots__ = ("_cap", "_cols", "_counts", "_crow", "_n", "_prep", "_prow", "_srow", "_sum_c",
                 "_sum_s", "decode_threshold", "sm_budget")

    def __init__(self, decode_threshold: int = 1, sm_budget: int = 0, capacity: int = 64):
        checked = Batch((), decode_threshold, sm_budget)  # the same checks as a Batch's
        self.decode_threshold = checked.decode_threshold
        self.sm_budget = checked.sm_budget
        self._set_cols(np.zeros((3, max(int(capacity), 1)), dtype=_I64))
        self._n = 0
        self._sum_s = 0  # Σ scheduled, Σ computed: Python ints, exact
        self._sum_c = 0
        self._counts: dict[int, int] = {}  # scheduled count -> requests scheduling it
        self._prep: tuple[Any, Any] | None = None  # (pool, its prepared constants), last used

    # -- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def _view(self, row: int) -> np.ndarray:
        v = self._cols[row, :self._n]
        v.flags.writeable = False  # changes go through the methods, which keep the sums
        return v

    @property
    def scheduled(self) -> np.ndarray:
        """Tokens each request schedules this step (read-only view)."""
        return self._view(0)

    @property
    def computed(self) -> np.ndarray:
        """Tokens each request has computed before this step (read-only view)."""
        return self._view(1)

    @property
    def prompt_len(self) -> np.ndarray:
        """Each request's prompt length (carried, not read by step pricing; read-only view)."""
        return self._view(2)

    def to_batch(self) -> Batch:
        """The same step as a :class:`Batch` of :class:`Request` (for checks and display)."""
        return Batch([Request(*row) for row in self._cols[:, :self._n].T.tolist()],
                     self.decode_threshold, self.sm_budget)

    # -- pricing -------------------------------------------------------------------------
    def step_time(self, k: Pricer, per_resource: bool = True) -> StepEstimate:
        """``k.step_time(self.to_batch())``, bit for bit."""
        thr, budget = self.decode_threshold, self.sm_budget
        if type(thr) is not int or type(budget) is not int or budget < 0:
            thr, budget = threshold_and_budget(thr, budget)
        per: dict[Resource, int] | None = {} if per_resource else None
        n = self._n
        r = k._r  # noqa: SLF001 (the kernel's own fields: one lookup less than its properties)
        prep = self._prep
        if prep is None or prep[0] is not r:
            prep = self._prep = (r, prepared(r))
        p = prep[1]
        fast = p.fast
        if not self._sum_s:  # no token scheduled: no forward pass (RL8), as k.step_time says
            refuse_empty(self.to_batch())
        if not n or fast is None or k._cal is not None:  # noqa: SLF001
            cols = self._cols
            return k.step_time_arrays(cols[0, :n], cols[1, :n], decode_threshold=thr,
                                      sm_budget=budget, per_resource=per_resource)
        counts = self._counts
        if len(counts) == 1:
            (lo,) = counts
            hi = lo
        else:
            lo = min(counts)
            hi = max(counts)
        if lo > 0 and hi <= thr:  # all decode: the aggregates are the summary
            tokens = self._sum_s
            return decode_estimate(p, fast, tokens, self._sum_c + tokens, lo, hi, n, budget,
                                   per)
        # A prefill: its rows, found in the scheduled column, are walked; the rest is sums.
        srow, crow = self._srow, self._crow
        if hi > thr and lo <= thr and len(counts) == 2 and counts[hi] == 1:  # one chunk
            # The chunk is probed at either end first (a simulator appends a new prompt's
            # chunk, or schedules it first): a byte search of the row only when it is inside.
            i = (n - 1 if srow.item(n - 1) == hi else 0 if srow.item(0) == hi
                 else position(srow[:n], hi))
            prefills = [(hi, crow.item(i))]
        else:
            sl = srow[:n].tolist()
            item = crow.item
            prefills = [(sl[i], item(i)) for i in prefill_rows(sl, counts, lo, hi, thr)]
        empty = 0
        if 0 in counts and thr >= 0:  # (0, 0) requests: no context, the walk skips them
            empty = int(np.count_nonzero((srow[:n] == 0) & (crow[:n] == 0)))
        est = mixed_estimate(p, fast, n, self._sum_s, self._sum_c, prefills, empty,
                             len(counts) == 1 and p.uniform_width in counts, budget, per)
        if est is not None:
            return est
        return finish(_compose(p, walk_parts(p, n, self._sum_s, self._sum_c, prefills, empty,
                                             counts, budget)), per)  # no tokens: host only

    # -- changing --------------------------------------------------------------------------
    def add(self, scheduled: int, computed: int = 0, prompt_len: int = 0) -> int:
        """Append one request; returns its position."""
        s, c, pl = scheduled, computed, prompt_len
        if type(s) is not int or type(c) is not int or type(pl) is not int or (s | c | pl) < 0:
            s, c, pl = (_count(scheduled, "scheduled"), _count(computed, "computed"),
                        _count(prompt_len, "prompt_len"))
            for name, v in zip(_FIELDS, (s, c, pl), strict=True):
                if v < 0:
                    raise ValueError(f"{name} must be a non-negative integer, got {v}")
        i = self._n
        if i == self._cap:
            self._reserve(i + 1)
        self._srow[i] = s
        self._crow[i] = c
        self._prow[i] = pl
        self._n = i + 1
        self._sum_s += s
        self._sum_c += c
        self._counts[s] = self._counts.get(s, 0) + 1
        return i

    def extend(self, scheduled: Any, computed: Any, prompt_len: Any = None) -> None:
        """Append requests given as columns (numpy/Arrow integer arrays or int sequences)."""
        s = _checked(scheduled, "scheduled")
        m = len(s)
        c = _checked(computed, "computed")
        pl = np.zeros(m, dtype=_I64) if prompt_len is None else _checked(prompt_len,
                                                                          "prompt_len")
        for name, col in (("computed", c), ("prompt_len", pl)):
            if len(col) != m:
                raise ValueError(f"{name} has {len(col)} entries, scheduled has {m}: one each "
                                 f"per request")
        n = self._n
        self._reserve(n + m)
        self._cols[:, n:n + m] = (s, c, pl)
        self._n = n + m
        sl = s.tolist()
        self._sum_s += sum(sl)
        self._sum_c += sum(c.tolist())
        self._add_counts(Counter(sl))

    def remove(self, which: Any) -> None:
        """Drop requests, keeping the others in order: a position, positions, or a boolean
        mask over the current requests (True = drop)."""
        n = self._n
        if type(which) is int:  # one position: shift the tail down by one
            i = which + n if which < 0 else which
            if not 0 <= i < n:
                raise IndexError(f"position {which} out of range for a batch of {n} requests")
            cols = self._cols
            s = self._srow.item(i)
            self._sum_s -= s
            self._sum_c -= self._crow.item(i)
            if i < n - 1:
                shift = jit.compiled(shift_left)
                if shift is None:
                    cols[:, i:n - 1] = cols[:, i + 1:n]
                else:
                    shift(cols, i, n)
            self._srow[n - 1] = 0  # a free slot schedules nothing (advance adds whole rows)
            self._n = n - 1
            counts = self._counts
            if counts[s] == 1:
                del counts[s]
            else:
                counts[s] -= 1
            return
        sel = np.asarray(which)
        if sel.dtype == bool:
            if sel.shape != (n,):
                raise ValueError(f"a removal mask needs one entry per request ({n}), got "
                                 f"shape {sel.shape}")
            drop = sel
        else:
            if sel.dtype.kind not in "iu":
                raise ValueError(f"remove takes positions (integers) or a boolean mask, got "
                                 f"dtype {sel.dtype}")
            pos = sel.reshape(-1)
            if pos.size and (pos.min() < -n or pos.max() >= n):
                raise IndexError(f"position out of range for a batch of {n} requests: "
                                 f"{pos.tolist()}")
            drop = np.zeros(n, dtype=bool)
            drop[pos] = True
        live = self._cols[:, :n]
        gone = live[:, drop]
        kept = live[:, ~drop]
        m = kept.shape[1]
        self._cols[:, :m] = kept
        self._cols[0, m:n] = 0  # free slots schedule nothing (advance adds whole rows)
        self._n = m
        gs = gone[0].tolist()
        self._sum_s -= sum(gs)
        self._sum_c -= sum(gone[1].tolist())
        counts = self._counts
        for v, k in Counter(gs).items():
            left = counts[v] - k
            if left:
                counts[v] = left
            else:
                del counts[v]

    def advance(self) -> None:
        """The step ran: every request's ``computed`` moves on by its ``scheduled``."""
        crow = self._crow
        np.add(crow, self._srow, out=crow)  # whole rows: free slots schedule 0
        self._sum_c += self._sum_s

    def schedule(self, scheduled: Any) -> None:
        """Set every request's ``scheduled`` for the next step (a column, or one int for all)."""
        n = self._n
        if isinstance(scheduled, int | np.integer) and not isinstance(scheduled, bool | np.bool_):
            v = _count(scheduled, "scheduled")
            if v < 0:
                raise ValueError(f"scheduled must be a non-negative integer, got {v}")
            self._cols[0, :n] = v
            self._sum_s = v * n
            self._counts = {v: n} if n else {}
            return
        col = _checked(scheduled, "scheduled")
        if len(col) != n:
            raise ValueError(f"scheduled has {len(col)} entries for {n} requests")
        self._cols[0, :n] = col
        sl = col.tolist()
        self._sum_s = sum(sl)
        self._counts = {}
        self._add_counts(Counter(sl))

    def set_scheduled(self, position: int, scheduled: int) -> None:
        """Set one request's ``scheduled`` (e.g. a prefill chunk that becomes a decode)."""
        n = self._n
        i, v = position, scheduled
        if type(i) is not int or type(v) is not int:
            i, v = _count(position, "position"), _count(scheduled, "scheduled")
        if not -n <= i < n:
            raise IndexError(f"position {i} out of range for a batch of {n} requests")
        if v < 0:
            raise ValueError(f"scheduled must be a non-negative integer, got {v}")
        if i < 0:  # from the end of the requests, not of the spare capacity
            i += n
        srow = self._srow
        old = srow.item(i)
        srow[i] = v
        self._sum_s += v - old
        counts = self._counts
        if counts[old] == 1:
            del counts[old]
        else:
            counts[old] -= 1
        counts[v] = counts.get(v, 0) + 1

    def clear(self) -> None:
        """Drop every request (the capacity stays)."""
        self._srow[:] = 0
        self._n = 0
        self._sum_s = self._sum_c = 0
        self._counts = {}

    def _add_counts(self, more: Counter[int]) -> None:
        counts = self._counts
        for v, k in more.items():
            counts[v] = counts.get(v, 0) + k

    def _set_cols(self, cols: np.ndarray) -> None:
        self._cols = cols
        self._srow = cols[0]
        self._crow = cols[1]
        self._prow = cols[2]
        self._cap = cols.shape[1]

    def _reserve(self, need: int) -> None:
        cap = self._cols.shape[1]
        if need > cap:
            grown = np.zeros((3, max(need, 2 * cap)), dtype=_I64)
            grown[:, :self._n] = self._cols[:, :self._n]
            self._set_cols(grown)

    def __repr__(self) -> str:
        return (f"StepBatch({self._n} requests, decode_threshold={self.decode_threshold}, "
                f"sm_budget={self.sm_budget})")
