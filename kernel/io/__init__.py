"""Layer 1, trace I/O: reading traces and measured columns, writing stamped tables, progress,
calibration documents. Imports only the cost model below it (docs/architecture.md)."""
