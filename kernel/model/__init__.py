"""Layer 0, the cost model: pure functions of a resolved pool and a batch (step time, memory,
transfers, host overheads, caches, utilisation, limits) and the record types they use.
Imports nothing else from kernel/ (docs/architecture.md)."""
