"""The kernel's interface types (model.md §12.9), as Python values.

Durations are integer nanoseconds throughout.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from pipeline.constants import MAX_DURATION_NS

from .display import step_html
from .resolved import Origin as CoefficientOrigin
from .resolved import Override

__all__ = [
    "Batch",
    "CoefficientOrigin",
    "Direction",
    "MAX_DURATION_NS",
    "MemoryBreakdown",
    "Override",
    "Placement",
    "Request",
    "Resolution",
    "Resource",
    "StepEstimate",
]


class Resource(StrEnum):
    """A resource a step consumes, in the reference's tie-break order."""

    SM = "sm"
    HBM = "hbm"
    NVLINK = "nvlink"
    NIC = "nic"
    HOST = "host"


RESOURCES: tuple[Resource, ...] = tuple(Resource)


class Direction(StrEnum):
    TO_TIER = "to_tier"  # eviction / write
    FROM_TIER = "from_tier"  # fetch / read


class _RequestFields(NamedTuple):
    scheduled: int
    computed: int
    prompt_len: int = 0
    cached_tokens: int = 0


def _count(v: object, what: str) -> int:
    """An integral value as a Python int: int, numpy integers, anything with ``__index__``.

    bool (and numpy.bool_) is refused although Python counts it as an integer: a flag passed
    where a token count belongs is a bug, not a count of one.
    """
    if type(v) is int:
        return v
    if not isinstance(v, bool) and type(v).__name__ != "bool" and (
            isinstance(v, numbers.Integral) or hasattr(type(v), "__index__")):
        try:
            return operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise ValueError(f"{what} must be an integer (int or an integral type such as "
                     f"numpy.int64; not a float or bool), got {v!r}")


class Request(_RequestFields):
    """One request's shape in a step.

    ``scheduled``: tokens scheduled this step; ``computed``: tokens already computed;
    ``prompt_len`` and ``cached_tokens`` are carried but not read by step pricing. Each is a
    non-negative integer of any integral type (int, numpy integers, ``__index__``), stored as
    a Python int; floats and bools are refused. A Request is checked once, when it is made,
    so a :class:`Batch` of Requests needs no per-field check.
    """

    __slots__ = ()

    def __new__(cls, scheduled: int, computed: int, prompt_len: int = 0,
                cached_tokens: int = 0) -> Request:
        if (type(scheduled) is not int or type(computed) is not int
                or type(prompt_len) is not int or type(cached_tokens) is not int
                or (scheduled | computed | prompt_len | cached_tokens) < 0):
            values = []
            for name, v in zip(_FIELDS, (scheduled, computed, prompt_len, cached_tokens),
                               strict=True):
                n = _count(v, name)
                if n < 0:
                    raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
                values.append(n)
            scheduled, computed, prompt_len, cached_tokens = values
        return _tuple_new(cls, (scheduled, computed, prompt_len, cached_tokens))

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Request:  # type: ignore[override]
        return cls(*iterable)

    def _replace(self, **changes: int) -> Request:
        return Request(**{**self._asdict(), **changes})


_FIELDS = _RequestFields._fields
_tuple_new = tuple.__new__
_ONLY_REQUEST = frozenset({Request})


def _requests(reqs: tuple[object, ...]) -> tuple[Request, ...]:
    """Requests from Request or (scheduled, computed[, prompt_len, cached_tokens]) tuples."""
    out = []
    for i, r in enumerate(reqs):
        if isinstance(r, Request):
            out.append(r)
            continue
        if type(r) is tuple and len(r) == 2:  # (scheduled, computed) of plain ints: no call
            s, c = r
            if type(s) is int and type(c) is int and (s | c) >= 0:
                out.append(_tuple_new(Request, (s, c, 0, 0)))
                continue
        try:
            out.append(Request(*r))  # type: ignore[misc]
        except ValueError as exc:
            raise ValueError(f"requests[{i}].{exc}") from None
        except TypeError as exc:
            raise ValueError(f"requests[{i}] must be a Request or a tuple (scheduled, "
                             f"computed[, prompt_len, cached_tokens]), got {r!r}: {exc}"
                             ) from None
    return tuple(out)


@dataclass(frozen=True)
class Batch:
    """The requests of one step, the engine's decode threshold and the SMs available.

    Counts may be any integral type (int, numpy integers, ``__index__``); they are stored as
    Python ints. Floats and bools are refused.
    """

    requests: tuple[Request, ...] = ()
    decode_threshold: int = 1
    sm_budget: int = 0

    def __init__(self, requests: Iterable[Any] = (), decode_threshold: int = 1,
                 sm_budget: int = 0):
        reqs = requests if type(requests) is tuple else tuple(requests)
        if reqs and set(map(type, reqs)) != _ONLY_REQUEST:  # every Request is already checked
            reqs = _requests(reqs)
        if type(decode_threshold) is not int:
            decode_threshold = _count(decode_threshold, "decode_threshold")
        if type(sm_budget) is not int:
            sm_budget = _count(sm_budget, "sm_budget (0 = all SMs)")
        if sm_budget < 0:
            raise ValueError(f"sm_budget must be a non-negative integer (0 = all SMs), "
                             f"got {sm_budget!r}")
        object.__setattr__(self, "requests", reqs)
        object.__setattr__(self, "decode_threshold", decode_threshold)
        object.__setattr__(self, "sm_budget", sm_budget)

    def tokens(self) -> int:
        """Σ scheduled over every request."""
        return sum(r.scheduled for r in self.requests)

    def uniform_decode(self, width: int) -> bool:
        """Non-empty and every request schedules exactly ``width`` tokens."""
        return bool(self.requests) and all(r.scheduled == width for r in self.requests)


@dataclass(frozen=True)
class StepEstimate:
    """One step's price: both estimates, the binding resource and the per-resource totals.

    ``calibrated`` is the third estimate of a kernel opened with a calibration
    (:mod:`kernel.model.calibration_law`), else None; it never changes the other two."""

    overlap: int
    no_overlap: int
    bottleneck: Resource
    per_resource: dict[Resource, int] | None = field(default=None)
    calibrated: int | None = None

    def _repr_html_(self) -> str:
        return step_html(self)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-rank bytes held before any request (model.md §12.9).

    ``total()`` is what sits inside vLLM's ``gpu_memory_utilization`` budget. The NCCL
    communicator reservation and the engine workspace are allocated before vLLM takes its
    memory snapshot (model.md §7.2), so they are not in ``comm_buffers`` (always 0 here)
    but in ``pre_snapshot``, which ``total()`` leaves out. ``with_pre_snapshot()`` adds them
    back: that is the figure the reference's older example prints (DeepSeek-V3 on 8 × H200:
    ``total()`` 80.0 GiB, ``with_pre_snapshot()`` 83.9 GiB).
    """

    weights: int
    activation_peak: int
    cuda_graph: int
    comm_buffers: int
    eplb_redundant: int
    pre_snapshot: int = 0  # communicator + workspace, outside the budget (not in total())

    def total(self) -> int:
        """Bytes inside the budget: weights, activations, graphs, comm buffers, EPLB."""
        return (self.weights + self.activation_peak + self.cuda_graph + self.comm_buffers
                + self.eplb_redundant)

    def with_pre_snapshot(self) -> int:
        """``total()`` plus the pre-snapshot communicator and workspace: every fixed byte."""
        return self.total() + self.pre_snapshot


@dataclass(frozen=True)
class Placement:
    """Where one end of a P/D handoff sits: node, rack and the pool's role."""

    node: int
    rack: int = 0
    pool: str = ""


@dataclass(frozen=True)
class Resolution:
    """The configuration after resolution (model.md §12.9 ``Resolution``)."""

    tensor_parallel_width: int
    data_parallel_width: int
    expert_parallel_width: int
    all_reduce_backend: str
    async_scheduling: bool
    cascade_attention: bool
    sequence_parallel_moe: bool
    overrides: tuple[Override, ...] = ()

    def tensor_parallel(self) -> int:
        return max(self.tensor_parallel_width, 1)

    def data_parallel(self) -> int:
        return max(self.data_parallel_width, 1)

    def expert_parallel(self) -> int:
        return max(self.expert_parallel_width, 1)


def refuse_empty(batch: Batch) -> None:
    """A batch with no request, or none that schedules a token, is no forward pass: pricing
    it would report the host's fixed cost as a step (docs/decisions.md RL8). The cost law
    itself (:func:`kernel.model.step.step_time_into`, model.md §1.5) still gives host time for it."""
    if not batch.requests:
        raise ValueError("an empty batch (no request) is no forward pass: give at least one "
                         "request that schedules a token")
    if not any(r.scheduled for r in batch.requests):
        raise ValueError(f"a batch of {len(batch.requests)} request(s) that schedule no token "
                         "is no forward pass: at least one request must schedule a token")
