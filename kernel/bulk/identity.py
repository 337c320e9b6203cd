"""The ``scenario`` and ``pool`` columns every priced row carries (issue 30 item 4), so that
priced files of several deployments join in SQL without reading their key-value metadata.

``scenario`` is dictionary-encoded (one string per table, an int32 index per row) and ``pool``
an int32; parquet stores both as a single dictionary entry per row group, so they cost almost
nothing. They come after the base columns and every other producer's columns, before kept
trace columns, so no existing column moves among the base and producer columns. A sweep's
hive-partitioned files leave them out: the partition path already says the scenario, and two
sources for one column would disagree in type (``identity=False``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .columns import DICTIONARY_ON_DISK, BatchContext, ColumnProducer

__all__ = ["IDENTITY", "POOL_FIELD", "SCENARIO_FIELD", "identity_producer"]

IDENTITY = "identity"  # the producer's name
SCENARIO_FIELD = pa.field("scenario", pa.dictionary(pa.int32(), pa.string()))
POOL_FIELD = pa.field("pool", pa.int32(), metadata=DICTIONARY_ON_DISK)


def _produce(ctx: BatchContext) -> dict[str, Any]:
    n = ctx.n
    scenario = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                              pa.array([str(ctx.pool.scenario)], pa.string()))
    return {"scenario": scenario, "pool": np.full(n, int(ctx.pool.pool_index), np.int32)}


def identity_producer() -> ColumnProducer:
    """The producer of the ``scenario`` and ``pool`` columns (per-batch constants: it never
    needs the rows kept by batch)."""
    return ColumnProducer(IDENTITY, (SCENARIO_FIELD, POOL_FIELD), _produce, needs_rows=False)
