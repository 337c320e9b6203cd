"""Checks shared by the step tests: the shared path's estimate and bit-for-bit equality."""

from __future__ import annotations

from kernel.facade.kernel import Kernel
from kernel.model import step
from kernel.model.types import Batch, StepEstimate


def shared(k: Kernel, b: Batch) -> StepEstimate:
    """``b`` priced by the shared path (summarise, compose, finish), the fast paths' oracle."""
    r = k.resolved_pool
    return step.finish(step.compose(r, step.summarise(r, b)), {})


def same(a: StepEstimate, b: StepEstimate) -> None:
    """The two estimates are equal bit for bit, their per-resource maps in the same order
    (none in ``a`` where ``b`` has none)."""
    assert (a.overlap, a.no_overlap, a.bottleneck, a.calibrated) == (
        b.overlap, b.no_overlap, b.bottleneck, b.calibrated)
    if b.per_resource is None:
        assert a.per_resource is None
    else:
        assert a.per_resource is not None
        assert list(a.per_resource.items()) == list(b.per_resource.items())


def same_with_maps(a: StepEstimate, b: StepEstimate) -> None:
    """:func:`same`, both estimates carrying their per-resource maps."""
    assert a.per_resource is not None and b.per_resource is not None
    same(a, b)
