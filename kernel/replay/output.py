"""Writing a replay: stamped parquet beside a summary, like every other output.

``OUT_DIR/requests.parquet`` (one row per request), ``steps.parquet`` (one row per request per
step, in the trace schema ``price`` reads), ``engine_steps.parquet`` (one row per engine core
per step: occupancy, queue), ``rejects.parquet`` and ``summary.json`` / ``summary.parquet``.
Every parquet file carries the stamp (:mod:`kernel.io.stamp`): scenario, documents, the replay
options (the step estimate among them) and the request source.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import safe_output

from ..io import stamp as _stamp

if TYPE_CHECKING:
    from ..facade.kernel import Kernel
    from .results import ReplayResult

__all__ = ["write_replay"]


def _plain_summary(summary: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(summary, default=str))


def write_replay(result: ReplayResult, out_dir: str | os.PathLike[str], k: Kernel, *,
                 source: object = None) -> dict[str, Path]:
    """Write ``result`` under ``out_dir`` (created); returns the path of each output."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = _plain_summary(result.summary)
    base = _stamp.for_kernel(k, "replay-requests", trace=source,
                             replay=result.options.to_dict(), slo=summary.get("slo"))
    tables: dict[str, tuple[str, pa.Table]] = {
        "requests": ("replay-requests", result.requests),
        "steps": ("replay-steps", result.steps),
        "rejects": ("replay-rejects", result.rejects),
    }
    if result.engine_steps is not None:
        tables["engine_steps"] = ("replay-engine-steps", result.engine_steps)
    flat = {k_: v for k_, v in summary.items() if not isinstance(v, dict | list)}
    tables["summary"] = ("replay-summary", pa.Table.from_pylist([flat]))
    paths: dict[str, Path] = {}
    for name, (kind, table) in tables.items():
        st = base.as_kind(kind).with_counts(rows=table.num_rows,
                                            requests=result.requests.num_rows)
        path = out / f"{name}.parquet"
        with safe_output.atomic(path) as tmp:  # never a half-written file under its name
            pq.write_table(_stamp.stamped(table, st), tmp)
        paths[name] = path
    js = out / "summary.json"
    with safe_output.atomic(js) as tmp:
        Path(tmp).write_text(json.dumps({"summary": summary, "stamp": base.as_kind(
            "replay-summary").to_metadata()}, indent=2, sort_keys=True) + "\n")
    paths["summary_json"] = js
    return paths
