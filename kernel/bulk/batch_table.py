"""The optional per-batch side table (``batches=``): batch_id + decode_threshold / sm_budget.

Its rows are validated like trace rows; a bad or duplicated row bans its batch (the trace's
rows of that batch are rejected), and a row naming no batch of the trace is rejected at the
end of the run (``unknown_batch_id``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..io.sources import open_trace
from ..io.trace import (
    BATCH_COLUMNS,
    BATCH_REJECTED,
    DUPLICATE_BATCH,
    UNKNOWN_BATCH,
    Rows,
    coerce,
    record_rejects,
    reject_table,
)

__all__ = ["BatchTable"]


class BatchTable:
    """An optional per-batch table (batch_id, decode_threshold, sm_budget) as sorted arrays."""

    def __init__(self, src: Any, columns: Mapping[str, str] | None,
                 rejects: list[pa.Table], strict: bool, decode_threshold: int, sm_budget: int):
        ts = open_trace(src, columns=columns, chunk_rows=1 << 62, required=("batch_id",),
                        optional=BATCH_COLUMNS)
        self.present = tuple(c for c in BATCH_COLUMNS if c in ts.names)
        parts = [coerce(t, 0, rejects=rejects, strict=strict, source="batches")
                 for t in ts.chunks()]
        rows = Rows.concat(parts) if parts else Rows.empty()
        self.rows_in = ts.num_rows or 0
        # bad rows: their batches are rejected in the trace (banned ids)
        self.banned = np.unique(rows.batch_id[rows.bad])
        self.banned_row = {int(b): int(rw) for b, rw in
                           zip(rows.batch_id[rows.bad][::-1], rows.row[rows.bad][::-1],
                               strict=True)}
        ok = rows.take(np.flatnonzero(~rows.bad))
        order = np.argsort(ok.batch_id, kind="stable")
        ids = ok.batch_id[order]
        dup = np.zeros(ids.size, bool)
        if ids.size > 1:
            same = ids[1:] == ids[:-1]
            dup[1:] |= same
            dup[:-1] |= same
        if dup.any():
            d = order[dup]
            record_rejects(reject_table(
                ok.row[d], ok.batch_id[d], DUPLICATE_BATCH, "batch_id",
                "the per-batch table names this batch more than once",
                [f"batch_id={b}" for b in ok.batch_id[d].tolist()], source="batches"),
                rejects, strict)
            for b, rw in zip(ok.batch_id[d].tolist(), ok.row[d].tolist(), strict=True):
                self.banned_row.setdefault(int(b), int(rw))
            self.banned = np.union1d(self.banned, ok.batch_id[d])
            keep = order[~dup]
        else:
            keep = order
        self.ids = ok.batch_id[keep]
        self.rows = ok.row[keep]
        self.thr = (ok.decode_threshold[keep] if ok.decode_threshold is not None
                    else np.full(keep.size, decode_threshold, np.int64))
        self.sm = (ok.sm_budget[keep] if ok.sm_budget is not None
                   else np.full(keep.size, sm_budget, np.int64))
        self.defaults = (int(decode_threshold), int(sm_budget))
        self.seen = np.zeros(self.ids.size, bool)
        self.rows_rejected = 0

    def apply(self, rows: Rows, rejects: list[pa.Table] | None, strict: bool) -> None:
        """Set per-batch values from the table; mark rows of banned batches bad."""
        if len(rows) == 0:
            return
        if self.ids.size:
            rows.widened()  # the table's values need not fit the trace column's type
            j = np.searchsorted(self.ids, rows.batch_id)
            jc = np.minimum(j, self.ids.size - 1)
            hit = self.ids[jc] == rows.batch_id
            self.seen[jc[hit]] = True
            if "decode_threshold" in self.present:
                if rows.decode_threshold is None:
                    rows.decode_threshold = np.full(len(rows), self.defaults[0], np.int64)
                rows.decode_threshold[hit] = self.thr[jc[hit]]
            if "sm_budget" in self.present:
                if rows.sm_budget is None:
                    rows.sm_budget = np.full(len(rows), self.defaults[1], np.int64)
                rows.sm_budget[hit] = self.sm[jc[hit]]
        if self.banned.size:
            ban = np.isin(rows.batch_id, self.banned) & ~rows.bad
            if ban.any():
                idx = np.flatnonzero(ban)
                bids = rows.batch_id[idx].tolist()
                record_rejects(reject_table(
                    rows.row[idx], rows.batch_id[idx], BATCH_REJECTED, "",
                    [f"row {self.banned_row[b]} of the per-batch table was rejected"
                     for b in bids], [f"batch_id={b}" for b in bids]), rejects, strict)
                rows.bad[idx] = True  # bad rows are already reported

    def unknown(self, rejects: list[pa.Table] | None, strict: bool) -> int:
        miss = np.flatnonzero(~self.seen)
        if miss.size == 0:
            return 0
        record_rejects(reject_table(
            self.rows[miss], self.ids[miss], UNKNOWN_BATCH, "batch_id",
            "no request row of the trace has this batch id",
            [f"batch_id={b}" for b in self.ids[miss].tolist()], source="batches"),
            rejects, strict)
        return int(miss.size)

