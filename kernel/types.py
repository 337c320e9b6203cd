"""The kernel's interface types (schemas.md §8), as Python values.

Durations are integer nanoseconds throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from .resolved import Origin as CoefficientOrigin
from .resolved import Override

MAX_DURATION_NS = 2**63 - 1

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


class Request(NamedTuple):
    """One request's shape in a step.

    ``scheduled``: tokens scheduled this step; ``computed``: tokens already computed;
    ``prompt_len`` and ``cached_tokens`` are carried but not read by step pricing.
    """

    scheduled: int
    computed: int
    prompt_len: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Batch:
    """The requests of one step, the engine's decode threshold and the SMs available."""

    requests: tuple[Request, ...] = ()
    decode_threshold: int = 1
    sm_budget: int = 0

    def __init__(self, requests: object = (), decode_threshold: int = 1, sm_budget: int = 0):
        reqs = tuple(r if isinstance(r, Request) else Request(*r) for r in requests)  # type: ignore[attr-defined]
        for i, r in enumerate(reqs):
            for name in ("scheduled", "computed", "prompt_len", "cached_tokens"):
                v = getattr(r, name)
                if type(v) is not int or v < 0:
                    raise ValueError(f"requests[{i}].{name} must be a non-negative integer, "
                                     f"got {v!r}")
        if type(decode_threshold) is not int:
            raise ValueError(f"decode_threshold must be an integer, got {decode_threshold!r}")
        if type(sm_budget) is not int or sm_budget < 0:
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
    """One step's price: both estimates, the binding resource and the per-resource totals."""

    overlap: int
    no_overlap: int
    bottleneck: Resource
    per_resource: dict[Resource, int] | None = field(default=None)

    def _repr_html_(self) -> str:
        from .notebook import step_html

        return step_html(self)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-rank bytes held before any request (schemas.md §8.2)."""

    weights: int
    activation_peak: int
    cuda_graph: int
    comm_buffers: int
    eplb_redundant: int

    def total(self) -> int:
        return (self.weights + self.activation_peak + self.cuda_graph + self.comm_buffers
                + self.eplb_redundant)


@dataclass(frozen=True)
class Placement:
    """Where one end of a P/D handoff sits: node, rack and the pool's role."""

    node: int
    rack: int = 0
    pool: str = ""


@dataclass(frozen=True)
class Resolution:
    """The configuration after resolution (schemas.md §8.2 ``Resolution``)."""

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
