"""The notebook surface: HTML views of a kernel, a step and a priced trace, and
:func:`connect` for the resolved DuckDB database.

The HTML is small and self-contained (no scripts, no external styles), so it renders the same
in Jupyter, VS Code and a static export.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline import db
from pipeline.constants import ENGINE_BEHAVIOUR_VERSION

from ..model.display import table_html

if TYPE_CHECKING:
    import duckdb

    from pipeline.load import Repos

    from .kernel import Kernel

def connect(scenarios: Iterable[str | os.PathLike[str]] | None = None,
            repos: Repos | None = None,
            database: str | os.PathLike[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the named scenarios (default: every embedded one) with the
    resolution views applied (docs/tables.md); ``database`` keeps it in a file. Writable: it
    is the caller's own connection."""
    from kernel.pool import sql_laws  # noqa: F401  (installs the cost laws the views call)

    con = db.open_db(database, apply=False) if database else None
    return db.load_scenarios(scenarios, repos, con)


def _bytes(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} B)"


def kernel_html(k: Kernel) -> str:
    r = k.resolved_pool
    lay = r.layout
    fixed = k.fixed_bytes()
    evidenced, total, assumed = k.evidence()
    rows = [
        ("scenario", f"{r.scenario} (pool {r.pool_index}, {r.role or 'aggregated'})"),
        ("model", f"{r.model_name} ({r.served_dtype})"),
        ("chip", f"{r.chip_name} × {max(lay.tp, 1) * max(lay.pp, 1) * max(lay.dp, 1)}"),
        ("layout", f"tp {lay.tp}, pp {lay.pp}, dp {lay.dp}, ep {lay.expert_width}, "
                   f"dcp {lay.dcp}, pcp {lay.pcp}"),
        ("graphs", "decode {}, other {}; capture ≤ {:,} tokens".format(
            *k.graph_modes(), k.capture_tokens())),
        ("fixed bytes/rank", _bytes(fixed.total())),
    ]
    try:
        cap = k.kv_capacity()
        conc = ("" if cap.max_concurrency is None
                else f", {cap.max_concurrency:,.1f} requests at max_model_len")
        rows.append(("KV capacity", f"{cap.num_blocks:,} blocks, {cap.tokens:,} tokens{conc}"))
    except (ValueError, ArithmeticError) as exc:  # a pool that does not fit says so
        rows.append(("KV capacity", f"does not fit: {exc}"))
    rows.append(("evidence", f"{evidenced}/{total} provenance entries rest on evidence; "
                             f"{len(assumed)} assumed"))
    rows.append(("behaviour", _behaviour()))
    return table_html(rows, "blis-kernel Kernel")


def _behaviour() -> str:
    return f"vLLM v{ENGINE_BEHAVIOUR_VERSION}"


