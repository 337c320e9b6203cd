"""Coefficient sets fitted from measured operator tables (issue 34, docs/registry_fit.md).

The tables are in the layout NVIDIA AISimulate publishes in its wheel:
``systems/data/<system>/<family>/<backend>/<version>/<table>.parquet``. Each family module
fits one coefficient family and scores it on operator rows the fit did not see; ``layer``
writes the fitted sets as a registry layer with provenance naming the table and version.
"""

from .allreduce import AllReduceFit, fit_all_reduce
from .layer import write_layer
from .moe import MoeFit, fit_moe
from .tables import SYSTEMS, OperatorTable, find_table

__all__ = ["SYSTEMS", "AllReduceFit", "MoeFit", "OperatorTable", "find_table", "fit_all_reduce",
           "fit_moe", "write_layer"]
