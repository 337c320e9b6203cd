"""Charts and reports: step anatomy, bottleneck maps, priced-trace summaries, HTML.

* :mod:`kernel.report.summary` — the numbers (sweeps over a kernel, a priced trace's summary);
* :mod:`kernel.report.charts` — matplotlib figures (Agg), saved as PNG or inlined as SVG;
* :mod:`kernel.report.html` — a self-contained HTML report (no scripts, no network);
* :mod:`kernel.report.sections` — the report's trace sections and the hook for optional ones;
* :mod:`kernel.report.trace_stats` / :mod:`kernel.report.trace_figures` — the along-the-trace
  numbers (windows, limits, median steps) and their figures.
"""

from __future__ import annotations

from .summary import (
    AnatomyPoint,
    BottleneckGrid,
    TraceSummary,
    anatomy_sweep,
    bottleneck_grid,
    fmt_duration,
    summarise,
)

__all__ = [
    "AnatomyPoint",
    "BottleneckGrid",
    "TraceSummary",
    "anatomy_sweep",
    "bottleneck_grid",
    "fmt_duration",
    "summarise",
]
