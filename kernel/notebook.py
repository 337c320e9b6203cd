"""The notebook surface: HTML views of a kernel, a step and a priced trace, and
:func:`connect` for the resolved DuckDB database.

The HTML is small and self-contained (no scripts, no external styles), so it renders the same
in Jupyter, VS Code and a static export.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from pipeline.load import Repos

    from .kernel import Kernel
    from .stamp import Stamp
    from .types import StepEstimate

_STYLE = ("border-collapse:collapse;font-family:monospace;font-size:12px;"
          "text-align:left")


def connect(scenarios: Iterable[str | os.PathLike[str]] | None = None,
            repos: Repos | None = None,
            database: str | os.PathLike[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the named scenarios (default: every embedded one) with the
    resolution views applied (docs/tables.md); ``database`` keeps it in a file. Writable: it
    is the caller's own connection."""
    from kernel import sql_laws  # noqa: F401  (installs the cost laws the views call)
    from pipeline import db

    con = db.open_db(database, apply=False) if database else None
    return db.load_scenarios(scenarios, repos, con)


def _ns(ns: int) -> str:
    from .report.summary import fmt_duration

    return fmt_duration(ns)


def _bytes(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} B)"


def table_html(rows: Iterable[tuple[str, str]], title: str = "") -> str:
    """Two columns of already-formatted text, escaped."""
    body = "".join(f"<tr><th style='padding:1px 8px'>{escape(k)}</th>"
                   f"<td style='padding:1px 8px'>{escape(v)}</td></tr>" for k, v in rows)
    caption = f"<caption style='text-align:left'><b>{escape(title)}</b></caption>" \
        if title else ""
    return f"<table style='{_STYLE}'>{caption}{body}</table>"


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
    import kernel

    return f"vLLM v{kernel.ENGINE_BEHAVIOUR_VERSION}"


def step_html(est: StepEstimate) -> str:
    rows = [("NoOverlap", _ns(est.no_overlap)), ("Overlap", _ns(est.overlap)),
            ("bottleneck", str(est.bottleneck))]
    for res, ns in (est.per_resource or {}).items():
        share = ns / est.no_overlap if est.no_overlap else 0.0
        rows.append((f"  {res}", f"{_ns(ns)} ({share:.0%})"))
    return table_html(rows, "StepEstimate")


def priced_html(frame: pl.DataFrame, stamp: Stamp | None = None, title: str = "priced trace",
                extra: Iterable[tuple[str, str]] = ()) -> str:
    """A priced frame: the headline numbers, the stamp, then polars' own table."""
    from .report.summary import summarise

    s = summarise(frame) if {"no_overlap_ns", "overlap_ns", "bottleneck"} <= set(
        frame.columns) else None
    rows: list[tuple[str, str]] = [("batches", f"{frame.height:,}")]
    if s is not None and frame.height:
        rows += [("NoOverlap", f"total {_ns(s.total_no_overlap_ns)}, p50 "
                               f"{_ns(s.p50_no_overlap_ns)}, p99 {_ns(s.p99_no_overlap_ns)}"),
                 ("Overlap", f"total {_ns(s.total_overlap_ns)}, p99 {_ns(s.p99_overlap_ns)}")]
        shares = s.bottleneck_share("time")
        rows.append(("bottleneck (time)", ", ".join(f"{k} {v:.0%}" for k, v in shares.items()
                                                    if v)))
    rows += list(extra)
    if stamp is not None:
        rows += [("made by", line) for line in stamp.lines()]
    return f"<div>{table_html(rows, title)}{frame._repr_html_()}</div>"
