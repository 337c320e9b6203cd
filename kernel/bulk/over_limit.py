"""Deployment limits in bulk: the ``limits`` column and ``reject_over_limit``.

The arithmetic is :mod:`kernel.model.limits` (shared with the scalar ``Kernel.check``); this module
only plugs it into bulk pricing: :func:`limits_producer` is a column producer
(:mod:`kernel.bulk.columns`) naming, per priced batch, the limits it breaks ("" for none), and
:func:`reject_over_limit` moves every row of such a batch to the rejects (reason
``over_limit``, the limits and both values in ``detail``) instead of pricing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..io.trace import Rows, record_rejects, reject_table, row_values
from ..model import limits
from ..model.resolved import ResolvedPool
from .columns import KV_BLOCKS_HELD, LONGEST_CONTEXT, BatchContext, ColumnProducer
from .groups import Groups, groups_of_grouped
from .identity import IDENTITY, identity_producer

if TYPE_CHECKING:
    from ..model.pricer import Pricer

__all__ = ["LIMITS_FIELD", "OVER_LIMIT", "limits_producer", "reject_over_limit",
           "default_producers"]

OVER_LIMIT = "over_limit"
LIMITS_FIELD = pa.field("limits", pa.string())


def limits_producer(lim: limits.Limits) -> ColumnProducer:
    """The ``limits`` column for a pool with limits ``lim`` (per-batch totals only, so it
    never needs the rows kept by batch)."""
    def produce(ctx: BatchContext) -> dict[str, Any]:
        masks = limits.check_batches(lim, ctx.summary.n_requests, ctx.summary.tokens_all,
                                     ctx.row_totals[LONGEST_CONTEXT.name],
                                     ctx.row_totals[KV_BLOCKS_HELD.name],
                                     np.asarray(ctx.priced["no_overlap_ns"]))
        return {"limits": limits.label_array(masks)}

    return ColumnProducer("limits", (LIMITS_FIELD,), produce,
                          totals=(LONGEST_CONTEXT, KV_BLOCKS_HELD), needs_rows=False)


def default_producers(k: Any, producers: Any, identity: bool = True) -> list[ColumnProducer]:
    """``producers`` with the ``limits`` column first when ``k`` is a kernel (a bare
    ResolvedPool does not know its KV capacity, so it gets no column) and, unless
    ``identity`` is false, the ``scenario`` and ``pool`` columns last
    (:mod:`kernel.bulk.identity`)."""
    given = list(producers or ())
    names = {p.name for p in given}
    out = given if isinstance(k, ResolvedPool) or "limits" in names else [
        limits_producer(k.limits), *given]
    return [*out, identity_producer()] if identity and IDENTITY not in names else out


def over_limit_of(k: Pricer | Any, reject: bool) -> limits.Limits | None:
    """The limits to reject by (None: keep over-limit batches, flagged)."""

    if not reject:
        return None
    if isinstance(k, ResolvedPool):
        raise ValueError("reject_over_limit needs a Kernel (a ResolvedPool does not carry "
                         "its KV capacity)")
    return k.limits


def reject_over_limit(lim: limits.Limits, out: pa.Table, rows: Rows, g: Groups, strict: bool
                      ) -> tuple[pa.Table, Rows, Groups, list[pa.Table]]:
    """Move the rows of every batch ``out`` flags to the rejects; the rest, re-grouped."""
    labels = np.asarray(out.column("limits").to_pylist(), dtype=object)
    flagged = labels != ""
    if not flagged.any():
        return out, rows, g, []
    no_overlap = out.column("no_overlap_ns").to_numpy()
    ends = np.append(g.starts[1:], len(rows))
    detail = {}
    for b in np.flatnonzero(flagged).tolist():
        lo, hi = int(g.starts[b]), int(ends[b])
        found = limits.check_slice(lim, rows.scheduled[lo:hi], rows.computed[lo:hi],
                                   int(no_overlap[b]))
        detail[b] = "; ".join(str(x) for x in found)
    row_flag = flagged[g.inv]
    idx = np.flatnonzero(row_flag)
    sub = rows.take(idx)
    batch = g.inv[idx]
    tbl = reject_table(sub.row, sub.batch_id, OVER_LIMIT, labels[batch].tolist(),
                       [detail[int(b)] for b in batch], row_values(sub))
    record_rejects(tbl, None, strict)
    keep = np.flatnonzero(~row_flag)
    kept = rows.take(keep)
    return out.filter(pa.array(~flagged)), kept, groups_of_grouped(kept.batch_id), [tbl]
