"""Layer 5, sweeps: many scenarios or pools priced as partitioned, possibly distributed runs
(docs/architecture.md)."""
