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

Where compiled loops are on (:mod:`kernel.model.jit`), native int64 columns (``prompt_len``
too, when given) are checked and summed in one compiled pass (:func:`aggregate`: least and
greatest counts, the chunk, sums, signs), and the step goes straight to the decode or mixed
fast path, its prefill rows from a second pass (:func:`prefill_pairs`) when there are
several; anything else takes the code above, unchanged (decisions AJ1-AJ4).

The result is ``k.step_time(Batch(zip(scheduled, computed, prompt_len), decode_threshold,
sm_budget))``, bit for bit (``tests/test_step_arrays.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import Any

import numpy as np

from . import jit
from .step import (
    _compose,
    finish,
    mixed_estimate,
    prefill_rows,
    prepared,
    step_time_into,
    walk_columns,
)
from .step_fast import decode_estimate
from .types import Batch, Resource, StepEstimate, _count

__all__ = ["aggregate", "as_batch", "column", "counts_of", "position", "prefill_pairs", "price",
           "signs_clear", "threshold_and_budget"]

_INT = int
_ND = np.ndarray
_BIG_ENDIAN = sys.byteorder == "big"
_I64 = np.dtype(np.int64)  # the native int64 dtype (numpy keeps one instance)
_MSB = 0 if _BIG_ENDIAN else 7  # its most significant byte within each element
_SUM_MIN = 40  # below this many requests, tolist + sum beats one numpy reduction
_add_reduce = np.add.reduce
_INT64_MAX = 2**63 - 1
_NONE_BELOW = -(2**63)  # aggregate's "second greatest" when every request schedules the greatest
_UNASKED = object()
# jit.compiled's table, read per call (a dict read, ~0.1 µs less than the call); a pass not yet
# asked for is asked of jit.compiled
_compiled_get = jit.lookup


def aggregate(scheduled: np.ndarray, computed: np.ndarray, prompt_len: np.ndarray | None
              ) -> tuple[int, ...]:
    """What the decode and one-chunk paths of :func:`price` need from int64 columns, in one
    pass (compiled by :mod:`kernel.model.jit`; this is also its specification): ``(n, least,
    greatest scheduled count, computed at the first greatest, whether another request
    schedules the greatest, the greatest scheduled count below it (or -2**63), how many
    requests are (0, 0), Σ scheduled, Σ computed)``. ``n`` is 0 for empty columns and -1 when
    they differ in length, hold a negative, or could sum past int64 (n × the greatest value
    over 2**63 - 1): the general code then says what is wrong, or sums exactly.
    ``prompt_len`` (None, or a column checked for its length and sign alone) is read only
    when given (numba compiles the None case without it)."""
    n = scheduled.shape[0]
    if n == 0 or computed.shape[0] != n:
        return (-1 if n or computed.shape[0] else 0), 0, 0, 0, 0, 0, 0, 0, 0
    if prompt_len is not None:
        if prompt_len.shape[0] != n or prompt_len.min() < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0
    lo = hi = scheduled[0]
    c_lo = c_hi = computed[0]
    at = 0
    more = 0
    second = _NONE_BELOW
    empty = 0
    sum_s = 0
    sum_c = 0
    for i in range(n):
        s = scheduled[i]
        c = computed[i]
        sum_s += s
        sum_c += c
        if s > hi:
            second = hi
            hi = s
            at = i
            more = 0
        elif s == hi:
            if i:
                more = 1
        elif s > second:
            second = s
        lo = min(lo, s)
        c_lo = min(c_lo, c)
        c_hi = max(c_hi, c)
        if s == 0 and c == 0:
            empty += 1
    if lo < 0 or c_lo < 0 or hi > _INT64_MAX // n or c_hi > _INT64_MAX // n:
        return -1, 0, 0, 0, 0, 0, 0, 0, 0
    return n, lo, hi, computed[at], more, second, empty, sum_s, sum_c


def prefill_pairs(scheduled: np.ndarray, computed: np.ndarray, thr: int) -> np.ndarray:
    """The (scheduled, computed) pairs of the requests scheduling more than ``thr`` tokens, in
    batch order, as the two rows of an int64 array (compiled by :mod:`kernel.model.jit`;
    this is also its specification). Called on columns :func:`aggregate` accepted."""
    k = 0
    for i in range(scheduled.shape[0]):
        if scheduled[i] > thr:
            k += 1
    out = np.empty((2, k), dtype=np.int64)
    j = 0
    for i in range(scheduled.shape[0]):
        if scheduled[i] > thr:
            out[0, j] = scheduled[i]
            out[1, j] = computed[i]
            j += 1
    return out


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
    ``set``, one ``sum`` per column, and the sign check of ``computed`` on its bytes. With
    compiled loops (:mod:`kernel.model.jit`), native int64 columns take one compiled pass
    instead (:func:`aggregate`), and a second (:func:`prefill_pairs`) for a step with more
    than one prefill row (decisions AJ1-AJ4).
    """
    if (type(scheduled) is _ND and type(computed) is _ND and scheduled.dtype is _I64
            and computed.dtype is _I64 and scheduled.ndim == 1 and computed.ndim == 1
            and type(thr) is int and type(budget) is int and budget >= 0):
        agg: Any = _compiled_get(aggregate, _UNASKED)
        if agg is _UNASKED:
            agg = jit.compiled(aggregate)
        if agg is not None and (prompt_len is None or type(prompt_len) is _ND
                                and prompt_len.dtype is _I64 and prompt_len.ndim == 1):
            # One compiled pass over the columns (decision AJ1).
            n, lo, hi, c_at, more, second, empty, sum_s, sum_c = agg(scheduled, computed,
                                                                     prompt_len)
            if n > 0:  # (else: empty, unequal lengths, a negative or a large sum: see below)
                p = prepared(r)
                fast = p.fast
                if fast is not None:
                    if lo > 0 and hi <= thr:  # all decode
                        return decode_estimate(p, fast, sum_s, sum_c + sum_s, lo, hi, n,
                                               budget, per)
                    if hi <= thr:
                        prefills: list[tuple[int, int]] = []
                    elif not more and second <= thr:  # one prefill row: the greatest
                        prefills = [(hi, c_at)]
                    else:  # several, in batch order, from a second compiled pass
                        pairs: Any = _compiled_get(prefill_pairs, _UNASKED)
                        if pairs is _UNASKED:
                            pairs = jit.compiled(prefill_pairs)
                        # (a threshold below -1 selects what -1 selects: no count is negative)
                        rows = pairs(scheduled, computed, thr if thr >= -1 else -1).tolist()
                        prefills = list(zip(*rows, strict=True))
                    est = mixed_estimate(p, fast, n, sum_s, sum_c, prefills,
                                         empty if thr >= 0 else 0,
                                         lo == hi == p.uniform_width, budget, per)
                    if est is not None:
                        return est
        elif agg is None and prompt_len is None:
            # Without compiled loops: native int64 columns of a step whose requests all decode
            # the same count, but perhaps one prefill chunk (first or last, typically). Anything
            # else, or a failed check, goes on to the general code below, which says what is
            # wrong: the decode count is probed at either end (a small int: counting it is an
            # identity test per request), the chunk found with one max.
            sl = scheduled.tolist()
            n = len(sl)
            lo = k = 0
            if n and n == len(computed):
                lo = sl[0]
                if lo > thr:
                    lo = sl[-1]
                if 0 < lo <= thr:
                    k = sl.count(lo)
            p = prepared(r)
            fast = p.fast
            if k and k >= n - 1 and fast is not None:
                sum_c = None
                if _SUM_MIN < n < 128:
                    if computed.tobytes()[_MSB::8].count(0) == n:  # see below (LS2)
                        sum_c = int(_add_reduce(computed))
                elif signs_clear(computed):
                    sum_c = sum(computed.tolist())
                if sum_c is not None and k == n:
                    tokens = lo * n
                    return decode_estimate(p, fast, tokens, sum_c + tokens, lo, lo, n, budget,
                                           per)
                if sum_c is not None:
                    hi = max(sl)
                    if hi > thr:  # one chunk among decodes
                        i = (0 if sl[0] == hi else n - 1 if sl[-1] == hi
                             else position(scheduled, hi))
                        est = mixed_estimate(p, fast, n, lo * k + hi, sum_c,
                                             [(hi, computed.item(i))], 0, False, budget, per)
                        if est is not None:
                            return est
    sum_c = None
    cl: list[int] | None = None
    if (type(scheduled) is _ND and type(computed) is _ND and scheduled.ndim == 1
            and computed.ndim == 1 and scheduled.dtype.kind in "iu"
            and computed.dtype.kind in "iu"):
        sl = scheduled.tolist()
        n = len(sl)
        if computed.dtype is _I64 and _SUM_MIN < n == len(computed) < 128:
            # Every value in [0, 2**56) (its most significant byte 0): none is negative, and
            # the int64 sum of fewer than 128 is exact, in one C call (decision LS2).
            c_ok = computed.tobytes()[_MSB::8].count(0) == n
            if c_ok:
                sum_c = int(_add_reduce(computed))
            else:
                cl = computed.tolist()
                c_ok = signs_clear(computed)
        else:
            cl = computed.tolist()
            c_ok = signs_clear(computed)
    else:
        sl = column(scheduled, "scheduled")
        cl = column(computed, "computed")
        c_ok = None
    n = len(sl)
    if cl is not None and len(cl) != n:
        raise ValueError(f"scheduled and computed must have one entry per request: "
                         f"{n} scheduled, {len(cl)} computed")
    if prompt_len is not None:
        _check_prompt_len(prompt_len, n)
    if type(thr) is not int or type(budget) is not int or budget < 0:
        thr, budget = threshold_and_budget(thr, budget)
    if not n:
        return step_time_into(r, Batch((), thr, budget), per)
    # The distinct scheduled counts, probed with a decode count where the first or last
    # request has one: a small int, so counting it is an identity test per request.
    lo = sl[0]
    if lo > thr:
        lo = sl[-1]
    k = sl.count(lo)
    seen: Collection[int] | None = None
    if k == n:  # a uniform step: every request schedules the same count
        hi = lo
    elif k == n - 1:  # one request differs (a chunked prefill among decodes, typically)
        hi = max(sl)
        if hi > lo:
            seen = {lo: k, hi: 1}  # how many requests schedule each count
        else:
            lo = min(sl)
            seen = {lo: 1, hi: k}
    else:
        seen = set(sl)
        lo = min(seen)
        hi = max(seen)
    if lo < 0:
        _check_least(sl, lo, "scheduled")
    if not c_ok:  # a sequence, or a numpy column with a sign bit set: find the least
        assert cl is not None
        _check_least(cl, min(cl), "computed")
    p = prepared(r)
    fast = p.fast
    if sum_c is None:
        assert cl is not None
        sum_c = sum(cl)
    if fast is None:
        return step_time_into(r, as_batch(sl, computed.tolist() if cl is None else cl, thr,
                                          budget), per)
    if lo > 0 and hi <= thr:  # all decode
        tokens = lo * n if seen is None else sum(sl)
        return decode_estimate(p, fast, tokens, sum_c + tokens, lo, hi, n, budget, per)
    if seen is None:
        seen = {lo}
    rows = prefill_rows(sl, seen, lo, hi, thr)
    empty = 0
    if 0 in seen and thr >= 0:  # (0, 0) requests have no context: the walk skips them
        if cl is None:
            cl = computed.tolist()
        empty = sum(1 for s, c in zip(sl, cl, strict=True) if s == 0 and c == 0)
    c_at = computed.item if cl is None else cl.__getitem__
    est = mixed_estimate(p, fast, n, sum(sl), sum_c, [(sl[i], c_at(i)) for i in rows], empty,
                         len(seen) == 1 and p.uniform_width in seen, budget, per)
    if est is not None:
        return est
    return finish(_compose(p, walk_columns(p, sl, computed.tolist() if cl is None else cl, seen,
                                           thr, budget)), per)  # host only


def position(a: np.ndarray, value: int) -> int:
    """The first position of ``value`` in a native int64 array that holds it (decision LS3):
    a C-level search of its bytes for the value's 8 bytes, kept only at an element boundary
    (a match straddling two elements is skipped). Cheaper than ``list.index`` over Python
    ints that are not small-int singletons (each a value comparison), or a numpy call."""
    raw = a.tobytes()
    pattern = value.to_bytes(8, sys.byteorder)
    i = raw.find(pattern)
    while i > 0 and i % 8:
        i = raw.find(pattern, i + 1)
    if i < 0:
        raise ValueError(f"{value} is not in the array")
    return i // 8


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

