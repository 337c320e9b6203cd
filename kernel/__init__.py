"""blis-kernel: the BLIS latency kernel in Python.

Price one vLLM forward pass (:meth:`Kernel.step_time`) or a whole recorded trace
(:meth:`Kernel.price`), size memory per rank, price KV transfers and offload reads, and say
where every number came from (:meth:`Kernel.provenance`).
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.constants import (
    ENGINE_BEHAVIOUR_COMMIT,
    ENGINE_BEHAVIOUR_VERSION,
    KERNEL_ASSUMPTION_SET,
)

# Public names, imported on first use so that `import kernel` stays cheap.
_EXPORTS = {
    "Repos": "pipeline.load",
    "Inputs": "pipeline.load",
    "load_bundle": "pipeline.load",
    "open_inputs": "pipeline.load",
    "new": "kernel.facade.factory",
    "open": "kernel.facade.factory",
    "open_pool": "kernel.facade.factory",
    "Kernel": "kernel.facade.kernel",
    "Request": "kernel.model.types",
    "Batch": "kernel.model.types",
    "StepBatch": "kernel.model.step_batch",
    "Resource": "kernel.model.types",
    "StepEstimate": "kernel.model.types",
    "MemoryBreakdown": "kernel.model.types",
    "Placement": "kernel.model.types",
    "Direction": "kernel.model.types",
    "Resolution": "kernel.model.types",
    "Override": "kernel.model.types",
    "CoefficientOrigin": "kernel.model.types",
    "PDTransferDemand": "kernel.model.transfer",
    "Link": "kernel.model.transfer",
    "KVCapacity": "kernel.model.memory",
    "price_file": "kernel.bulk",
    "Tuning": "kernel.bulk.options",
    "calibrate": "kernel.calibration.make",
    "load_kernel": "kernel.facade.saved",
    "save_kernel": "kernel.facade.saved",
    "derive_graph": "pipeline.derive",
    "DeriveError": "pipeline.derive",
    "read_priced": "kernel.io.priced",
    "PricedFile": "kernel.io.priced",
    "Stamp": "kernel.io.stamp",
    "read_stamp": "kernel.io.stamp",
    "connect": "kernel.facade.notebook",
    # errors: every one a ValueError, so one `except ValueError` catches them all
    "DocumentError": "pipeline.errors",
    "RefusalError": "pipeline.errors",
    "Problem": "pipeline.errors",
    "TraceError": "kernel.io.trace",
    "RejectedRowError": "kernel.io.trace",
}

__all__ = ["ENGINE_BEHAVIOUR_COMMIT", "ENGINE_BEHAVIOUR_VERSION", "KERNEL_ASSUMPTION_SET",
           *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads (kernel.Batch per step)
    return value
