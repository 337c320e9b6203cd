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
    "new": "kernel.build",
    "open": "kernel.build",
    "open_pool": "kernel.build",
    "Kernel": "kernel.kernel",
    "Request": "kernel.types",
    "Batch": "kernel.types",
    "StepBatch": "kernel.step_batch",
    "Resource": "kernel.types",
    "StepEstimate": "kernel.types",
    "MemoryBreakdown": "kernel.types",
    "Placement": "kernel.types",
    "Direction": "kernel.types",
    "Resolution": "kernel.types",
    "Override": "kernel.types",
    "CoefficientOrigin": "kernel.types",
    "PDTransferDemand": "kernel.transfer",
    "Link": "kernel.transfer",
    "KVCapacity": "kernel.memory",
    "price_file": "kernel.bulk",
    "calibrate": "kernel.calibration.make",
    "load_kernel": "kernel.saved",
    "save_kernel": "kernel.saved",
    "derive_graph": "pipeline.derive",
    "DeriveError": "pipeline.derive",
    "read_priced": "kernel.priced",
    "PricedFile": "kernel.priced",
    "Stamp": "kernel.stamp",
    "read_stamp": "kernel.stamp",
    "connect": "kernel.notebook",
    # errors: every one a ValueError, so one `except ValueError` catches them all
    "DocumentError": "pipeline.errors",
    "RefusalError": "pipeline.errors",
    "Problem": "pipeline.errors",
    "TraceError": "kernel.trace",
    "RejectedRowError": "kernel.trace",
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
