"""Structural types for the public signatures: what a trace argument may be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    import os

    import polars as pl
    import pyarrow.dataset as ds


@runtime_checkable
class ArrowStreamExportable(Protocol):
    """Anything that speaks the Arrow C stream interface: a pyarrow Table or
    RecordBatchReader, a polars or pandas DataFrame, a DuckDB relation, …"""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...


#: A trace to price: a path (a file, a directory, a glob), an Arrow stream producer, a polars
#: LazyFrame (streamed in batches), or a pyarrow Dataset or Scanner (``kernel.io.sources``).
TraceInput: TypeAlias = ("str | os.PathLike[str] | ArrowStreamExportable | pl.LazyFrame | "
                          "ds.Dataset | ds.Scanner")
