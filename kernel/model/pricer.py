"""What the layers below the facade may use of a kernel: a structural type that
:class:`kernel.facade.kernel.Kernel` satisfies, so bulk pricing, stamps, limits and the
in-place batch take a kernel without importing the facade (docs/architecture.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .limits import Limits
    from .memory import KVCapacity
    from .resolved import ResolvedPool
    from .types import Batch, StepEstimate


class Pricer(Protocol):
    """One pool's pricer: its resolved pool, capacity and limits, and its step pricing."""

    _r: ResolvedPool  # the resolved pool, read directly on the per-step path
    _cal: Any  # the calibration it applies, or None

    @property
    def resolved_pool(self) -> ResolvedPool: ...

    @property
    def limits(self) -> Limits: ...

    def kv_capacity(self) -> KVCapacity: ...

    def evidence(self) -> tuple[int, int, list[str]]: ...

    def documents(self) -> dict[str, dict[str, str]]: ...

    def step_time(self, batch: Batch) -> StepEstimate: ...

    def step_time_arrays(self, scheduled: Any, computed: Any, prompt_len: Any = None, *,
                         decode_threshold: int = 1, sm_budget: int = 0,
                         per_resource: bool = True) -> StepEstimate: ...
