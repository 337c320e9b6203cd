"""The utilisation columns as a bulk column producer (``price(..., producers=[column_producer()])``):
per batch MFU/MBU and the rest of :mod:`kernel.model.utilisation`, computed from the batch
summaries bulk pricing already holds."""

from __future__ import annotations

import pyarrow as pa

from ..model.utilisation import EXTRA_COLUMNS, UTILISATION_COLUMNS, batch_columns
from .columns import KV_BLOCKS_HELD, ColumnProducer

__all__ = ["column_producer"]


def column_producer() -> ColumnProducer:
    """The bulk column producer of the utilisation columns."""
    fields = tuple(pa.field(c, pa.float64()) for c in UTILISATION_COLUMNS) + tuple(
        pa.field(c, pa.int64()) for c in EXTRA_COLUMNS)
    return ColumnProducer("utilisation", fields, batch_columns, totals=(KV_BLOCKS_HELD,),
                          needs_rows=False)
