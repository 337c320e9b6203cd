"""Charts and reports: step anatomy, bottleneck maps, priced-trace summaries, HTML.

* :mod:`kernel.facade.summary` — the numbers (sweeps over a kernel, a priced trace's summary);
* :mod:`kernel.report.charts` — matplotlib figures (Agg), saved as PNG or inlined as SVG;
* :mod:`kernel.report.html` — a self-contained HTML report (no scripts, no network);
* :mod:`kernel.report.sections` — the report's trace sections and the hook for optional ones;
* :mod:`kernel.report.trace_stats` / :mod:`kernel.report.trace_figures` — the along-the-trace
  numbers (windows, limits, median steps) and their figures.
"""

from __future__ import annotations

from ..bulk.summary import TraceSummary, summarise
from ..facade.summary import AnatomyPoint, BottleneckGrid, anatomy_sweep, bottleneck_grid
from ..model.display import fmt_duration

__all__ = [
    "AnatomyPoint",
    "BottleneckGrid",
    "TraceSummary",
    "anatomy_sweep",
    "bottleneck_grid",
    "fmt_duration",
    "summarise",
]
