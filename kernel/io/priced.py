"""A priced file read back with its stamp: :func:`read_priced`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from html import escape
from pathlib import Path

import polars as pl

from pipeline import safe_output

from ..model.types import RESOURCES
from .stamp import Stamp, read_stamp

#: ``bottleneck`` as an enum, in the reference's tie-break order.
BOTTLENECK = pl.Enum([str(r) for r in RESOURCES])


def typed_bottleneck(frame: pl.DataFrame) -> pl.DataFrame:
    """``bottleneck`` as :data:`BOTTLENECK` (a plain string or categorical column is cast)."""
    if "bottleneck" in frame.columns and frame.schema["bottleneck"] != BOTTLENECK:
        return frame.with_columns(pl.col("bottleneck").cast(pl.String).cast(BOTTLENECK))
    return frame


@dataclass(frozen=True)
class PricedFile:
    """The rows of a priced file and the stamp saying what made them (None: unstamped)."""

    frame: pl.DataFrame
    stamp: Stamp | None
    path: Path

    @property
    def scenario(self) -> str | None:
        return self.stamp.scenario if self.stamp else None

    def _repr_html_(self) -> str:
        head = "".join(f"<li>{escape(line)}</li>" for line in
                       (self.stamp.lines() if self.stamp else ["no stamp (written elsewhere)"]))
        return (f"<div><b>{escape(self.path.name)}</b>: {self.frame.height:,} rows"
                f"<ul>{head}</ul>{self.frame._repr_html_()}</div>")


def read_priced(path: str | os.PathLike[str]) -> PricedFile:
    """A priced parquet/IPC/CSV file as a polars frame (``bottleneck`` an enum) with its stamp.

    The stamp (see :mod:`kernel.io.stamp`) carries the scenario, pool, document digests, options,
    trace and row counts the file was written with; a CSV or a foreign file has none.
    """

    p = Path(path)
    safe_output.note_read("the priced file", p)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        frame = pl.read_csv(p)
    elif suffix in (".arrow", ".ipc", ".feather"):
        frame = pl.read_ipc(p)
    else:
        frame = pl.read_parquet(p)
    return PricedFile(typed_bottleneck(frame), read_stamp(p), p)
