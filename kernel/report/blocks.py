"""The HTML building blocks every report section uses: a chart ready for the page and a
table, escaped. :mod:`kernel.report.html` lays them out; the sections fill them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from . import charts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CHART_IDS", "Chart", "chart_html", "table"]

# The element ids of the charts (tests and links rely on them).
CHART_IDS = {
    "anatomy": "chart-anatomy",
    "bottleneck_map": "chart-bottleneck-map",
    "step_time": "chart-step-time",
    "by_bottleneck": "chart-by-bottleneck",
    "compare": "chart-compare",
}


@dataclass(frozen=True)
class Chart:
    """One chart ready for the page: its element id, caption and inline markup."""

    id: str
    title: str
    caption: str
    markup: str  # an <svg id=…> element or an <img id=…> element

    @classmethod
    def of(cls, fig: Figure, element_id: str, title: str, caption: str = "",
           embed: str = "svg") -> Chart:
        if embed == "png":
            markup = (f'<img id="{escape(element_id)}" class="chart" alt="{escape(title)}" '
                      f'src="{charts.to_png_data_uri(fig)}">')
        else:
            markup = charts.to_svg(fig, element_id)
        return cls(element_id, title, caption, markup)



def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *,
           numeric: Sequence[int] = (), row_class: Sequence[str] | None = None,
           cls: str = "") -> str:
    out = [f'<table class="{escape(cls)}"><thead><tr>'
           + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        rc = f' class="{escape(row_class[i])}"' if row_class else ""
        cells = "".join(
            f'<td class="n">{escape(str(v))}</td>' if j in numeric else f"<td>{escape(str(v))}</td>"
            for j, v in enumerate(row))
        out.append(f"<tr{rc}>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def chart_html(c: Chart) -> str:
    cap = f"<figcaption>{escape(c.caption)}</figcaption>" if c.caption else ""
    return f'<figure data-chart="{escape(c.id)}"><h3>{escape(c.title)}</h3>{c.markup}{cap}</figure>'
