"""Building a :class:`Kernel`: resolve one pool (:mod:`kernel.pool.build`) and wrap it with
its inputs, resolution and document digests (model.md §9.1 ``New``)."""

from __future__ import annotations

import copy
import os
from typing import Any

import duckdb

from pipeline.load import Inputs, Repos, open_inputs

from ..io.stamp import document_digests
from ..pool.build import resolve
from .kernel import Kernel


def new(inputs: Inputs, con: duckdb.DuckDBPyConnection | None = None) -> Kernel:
    """Validate, resolve and precompute one pool (model.md §9.1 ``New``)."""
    resolved, resolution = resolve(inputs, con)
    return Kernel(resolved, copy.deepcopy(inputs.pool), resolution, document_digests(inputs))


def open(scenario: str | os.PathLike[str], repos: Repos | None = None,  # noqa: A001
         pool: int = 0, *, calibration: Any = None, force_calibration: bool = False) -> Kernel:
    """Load a scenario and everything it names, and build a kernel for its first pool (or
    for pool ``pool``: ``open(s, repos, i)`` is ``open_pool(s, repos, i)``).

    ``calibration`` (a path, a document or a ``Calibration``) adds the calibrated estimate;
    one made for another model or chip is refused unless ``force_calibration``."""
    k = new(open_inputs(scenario, repos, pool))
    if calibration is not None:
        k = k.with_calibration(calibration, force_calibration)
    return k


def open_pool(scenario: str | os.PathLike[str], repos: Repos | None, i: int) -> Kernel:
    """The same for pool ``i`` of a disaggregated deployment."""
    return new(open_inputs(scenario, repos, i))
