"""StepTime from per-request columns: the batch API for simulators (issue 31).

``Kernel.step_time_arrays(scheduled, computed, prompt_len=None, *, decode_threshold=1,
sm_budget=0)`` prices one step from numpy integer arrays, Arrow integer arrays or sequences of
integers, with no per-request Python object. Validation is whole-column (dtype, shape,
length, the least value), a fixed number of C-level calls per batch, and the errors name the
column, the first bad position and what is allowed.

The walk (model.md §1.2) is done with builtins over the columns as Python int lists: decode
aggregates are integer sums (exact in any order), and only the prefill requests, found with one
C-level pass, are walked one by one (:func:`kernel.model.step.walk_columns`), in batch order, so
the float sums (causal and windowed pairs) add the same terms in the same order as
:func:`kernel.model.step._walk`. The summary then goes to :func:`kernel.model.step_fast.decode_totals`
(all-decode), :func:`kernel.model.step_mixed.totals` (any other non-empty batch) or, on pools without
a fast path, to a :class:`Batch` and the shared path.

The result is ``k.step_time(Batch(zip(scheduled, computed, prompt_len), decode_threshold,
sm_budget))``, bit for bit (``tests/test_step_arrays.py``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import step_mixed
from .step import _compose, finish, prepared, step_time_into, walk_columns
from .step_fast import decode_totals, summarize
from .types import Batch, Resource, StepEstimate, _count

__all__ = ["as_batch", "column", "counts_of", "price", "signs_clear", "threshold_and_budget"]

_INT = int
_ND = np.ndarray
_BIG_ENDIAN = sys.byteorder == "big"


def column(x: Any, name: str) -> list[int]:
    """A per-request count column as a list of Python ints, checked whole: a 1-D numpy integer
    array, an Arrow integer array without nulls, or a sequence of integral values. Negative
    values are the caller's check (:func:`_check_least`), done on the least value."""
    if isinstance(x, np.ndarray):
        if x.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array (one count per request), got shape "
                             f"{x.shape}")
        if x.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers (an integer dtype such as int64), got "
                             f"dtype {x.dtype}; floats and bools are refused")
        out: list[int] = x.tolist()
        return out
    if type(x) is list:
        lst = x
    elif hasattr(x, "to_numpy") and hasattr(x, "null_count"):  # a pyarrow (chunked) array
        import pyarrow as pa  # (heavy: Arrow, loaded only on this path)

        if not pa.types.is_integer(x.type):
            raise ValueError(f"{name} must be an Arrow integer array, got type {x.type}")
        if x.null_count:
            raise ValueError(f"{name} holds {x.null_count} null(s); every request needs a "
                             f"count")
        return column(x.to_numpy(), name)
    else:
        try:
            lst = list(x)
        except TypeError:
            raise ValueError(f"{name} must be a numpy integer array, an Arrow integer array or "
                             f"a sequence of integers, got {type(x).__name__}") from None
    types = set(map(type, lst))
    if types and types != {_INT}:  # numpy scalars, __index__ types: one checked pass
        lst = [v if type(v) is _INT else _count(v, f"{name}[{i}]") for i, v in enumerate(lst)]
    return lst


def _check_least(values: list[int], least: int, name: str) -> None:
    if least < 0:
        i = next(i for i, v in enumerate(values) if v < 0)
        raise ValueError(f"{name}[{i}] is {values[i]}; token counts must be non-negative "
                         f"integers")


def counts_of(scheduled: Any, computed: Any, prompt_len: Any = None
              ) -> tuple[list[int], list[int], set[int]]:
    """The scheduled and computed columns, checked (types, equal lengths, non-negative), and
    the distinct scheduled counts; ``prompt_len`` is checked the same way but not kept (step
    pricing does not read it)."""
    sl = column(scheduled, "scheduled")
    cl = column(computed, "computed")
    n = len(sl)
    if len(cl) != n:
        raise ValueError(f"scheduled and computed must have one entry per request: "
                         f"{n} scheduled, {len(cl)} computed")
    seen = set(sl)
    if n:
        _check_least(sl, min(seen), "scheduled")
        _check_least(cl, min(cl), "computed")
    if prompt_len is not None:
        _check_prompt_len(prompt_len, n)
    return sl, cl, seen


def price(r: Any, scheduled: Any, computed: Any, prompt_len: Any, thr: Any, budget: Any,
          per: dict[Resource, int] | None) -> StepEstimate:
    """StepTime of one step's columns: ``step_time_into(r, Batch(...), per)`` bit for bit.

    The common case (two 1-D numpy integer arrays, int threshold and budget) is checked and
    summed with a few C-level calls: two ``tolist``, one ``count`` (a uniform step) or one
    ``set``, one ``sum`` per column, and the sign check of ``computed`` on its bytes.
    """
    if (type(scheduled) is _ND and type(computed) is _ND and scheduled.ndim == 1
            and computed.ndim == 1 and scheduled.dtype.kind in "iu"
            and computed.dtype.kind in "iu"):
        sl = scheduled.tolist()
        cl = computed.tolist()
        c_ok = signs_clear(computed)
    else:
        sl = column(scheduled, "scheduled")
        cl = column(computed, "computed")
        c_ok = None
    n = len(sl)
    if len(cl) != n:
        raise ValueError(f"scheduled and computed must have one entry per request: "
                         f"{n} scheduled, {len(cl)} computed")
    if prompt_len is not None:
        _check_prompt_len(prompt_len, n)
    if type(thr) is not int or type(budget) is not int or budget < 0:
        thr, budget = threshold_and_budget(thr, budget)
    if not n:
        return step_time_into(r, Batch((), thr, budget), per)
    lo = sl[0]
    if sl.count(lo) == n:  # a uniform step: every request schedules the same count
        hi = lo
        seen: set[int] | None = None
    else:
        seen = set(sl)
        lo = min(seen)
        hi = max(seen)
    if lo < 0:
        _check_least(sl, lo, "scheduled")
    if not c_ok:  # a sequence, or a numpy column with a sign bit set: find the least
        _check_least(cl, min(cl), "computed")
    p = prepared(r)
    fast = p.fast
    if fast is None:
        return step_time_into(r, as_batch(sl, cl, thr, budget), per)
    if lo > 0 and hi <= thr:  # all decode
        tokens = lo * n if seen is None else sum(sl)
        return summarize(decode_totals(p, fast, tokens, sum(cl) + tokens, lo, hi, n, budget),
                         per)
    s = walk_columns(p, sl, cl, {lo} if seen is None else seen, thr, budget)
    t = step_mixed.totals(p, fast, s)
    if t is not None:
        return summarize(t, per)
    return finish(_compose(p, s), per)  # an empty step: host only


def signs_clear(a: np.ndarray) -> bool:
    """No negative value in a 1-D integer array, read from the sign bytes alone: the most
    significant byte of every element, taken with one strided slice of ``tobytes()``, is below
    0x80 exactly when the element is non-negative (two's complement). One C-level pass, cheaper
    than a numpy reduction or ``min`` over the Python ints at simulator batch sizes."""
    dt = a.dtype
    if dt.kind == "u":
        return True
    k = dt.itemsize
    raw = a.tobytes()
    big = dt.byteorder == ">" or (dt.byteorder == "=" and _BIG_ENDIAN)
    return raw[0::k].isascii() if big else raw[k - 1::k].isascii()


def _check_prompt_len(prompt_len: Any, n: int) -> None:
    if (type(prompt_len) is _ND and prompt_len.ndim == 1 and prompt_len.dtype.kind == "i"
            and len(prompt_len) == n and (not n or min(prompt_len.tolist()) >= 0)):
        return  # the common case, checked whole (the messages come from the general path)
    pl = column(prompt_len, "prompt_len")
    if len(pl) != n:
        raise ValueError(f"prompt_len must have one entry per request: {n} scheduled, "
                         f"{len(pl)} prompt_len")
    if n:
        _check_least(pl, min(pl), "prompt_len")


def as_batch(sl: list[int], cl: list[int], thr: int, budget: int) -> Batch:
    """The checked columns as a :class:`Batch` (the shared path's input)."""
    return Batch(list(zip(sl, cl, strict=True)), decode_threshold=thr, sm_budget=budget)


def threshold_and_budget(decode_threshold: Any, sm_budget: Any) -> tuple[int, int]:
    """The step's decode threshold and SM budget, checked as :class:`Batch` checks them."""
    thr = decode_threshold if type(decode_threshold) is int else _count(decode_threshold,
                                                                         "decode_threshold")
    budget = sm_budget if type(sm_budget) is int else _count(sm_budget,
                                                             "sm_budget (0 = all SMs)")
    if budget < 0:
        raise ValueError(f"sm_budget must be a non-negative integer (0 = all SMs), "
                         f"got {sm_budget!r}")
    return thr, budget

