"""Layer 2, building: resolved rows (from pipeline/ and sql/) to a resolved pool, with the
cost laws installed into DuckDB and a calibration bound to it (docs/architecture.md)."""
