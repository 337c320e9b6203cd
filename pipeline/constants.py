"""The kernel's fixed identities and limits, defined once for Python and SQL alike.

This module sits at the bottom of the import graph (``pipeline`` and ``kernel`` both read it),
and :func:`pipeline.db.open_db` hands the same values to SQL as the one-row table
``kernel_constants`` plus the macros ``engine_version()``, ``vllm()`` and ``assumption_set()``,
so no view spells a version or a set name as a literal.
"""

from __future__ import annotations

# The vLLM release whose behaviour the kernel prices, and the commit it was read from.
ENGINE_BEHAVIOUR_VERSION = "0.31.0"
ENGINE_BEHAVIOUR_COMMIT = "db9527a46873454610df6dbedf79a36d6bf1a7f6"
# The set name every kernel-level assumption is listed under in provenance.
KERNEL_ASSUMPTION_SET = "blis-latency-kernel"
# The FlashInfer release the engine's SM90 sparse-MLA backend needs (an assumption's reason).
FLASHINFER_SM90_SPARSE_MLA_VERSION = "0.6.18"
# Provenance methods that rest on evidence; the SQL `evidence` view counts these (through
# `kernel_constants`), and Kernel.evidence() reads that view's row.
EVIDENCED_METHODS = ("measured", "literature", "vendor_spec")
# Durations are int64 nanoseconds and saturate here, as Go's time.Duration does.
MAX_DURATION_NS = 2**63 - 1
