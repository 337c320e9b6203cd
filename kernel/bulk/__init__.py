"""Bulk pricing: a recorded trace of millions of steps, priced as columns.

:func:`price` turns a request-level trace (``docs/traces.md``) into one row per batch with
the same numbers :meth:`Kernel.step_time` gives for each batch, without a Python loop per
batch. The package has one module per job:

=====================  =======================================================================
``groups``             batches of rows (grouped, or in place), whole-batch checks (rejects)
``batch_table``        the optional per-batch side table (``batches=``)
``walk``               the vectorised walk: per-row terms, per-batch sums, :func:`finish_columns`
``columns``            the priced table: :data:`PRICED_SCHEMA` and the **extension point**
``engine``             validate → group → check → price → count, shared by every entry point
``api``                in-memory :func:`price` / :func:`price_result`
``partition``          rows of any order cut into pieces of whole batches (``sorted`` mode)
``summed``             per-batch sums of rows that stream by (``summed`` mode)
``stream``             :func:`price_file`: any size, bounded memory, parquet out
``sink``               the output file, encoded on a writer thread, renamed into place at the end
``many``               one in-memory trace under several kernels, validated and grouped once
=====================  =======================================================================

Extension point (details in :mod:`kernel.bulk.columns`): a :class:`ColumnProducer` adds
per-batch columns computed from the resolved pool, the array summary, compose's totals, the
base priced columns and batch-level trace inputs, for the runs it is passed to as
``producers=[...]``. ``keep=[cols]`` passes trace columns through, keyed by
batch (the value of the batch's first row). ``price_file(metadata={...})`` stamps the
output's key-value metadata.
"""

from __future__ import annotations

from .api import ON_REJECT, RejectedRowsWarning, price, price_result
from .columns import (
    BOTTLENECK_TYPE,
    PRICED_SCHEMA,
    BatchContext,
    ColumnProducer,
)
from .engine import PriceCounts, PricedResult
from .engine import rows_of as _rows_of
from .groups import group as _group
from .options import Tuning
from .stream import ROW_GROUP_ROWS, price_file
from .walk import RESOURCE_NAMES, finish_columns, summarise_columns

__all__ = [
    "BOTTLENECK_TYPE",
    "ON_REJECT",
    "PRICED_SCHEMA",
    "RESOURCE_NAMES",
    "ROW_GROUP_ROWS",
    "BatchContext",
    "ColumnProducer",
    "PriceCounts",
    "PricedResult",
    "RejectedRowsWarning",
    "Tuning",
    "finish_columns",
    "price",
    "price_file",
    "price_result",
    "summarise_columns",
]

# (tests reach these two private helpers)
_ = (_group, _rows_of)
