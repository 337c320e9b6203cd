"""The serving section of the HTML report: a replay's output directory (``blis-kernel replay``)
or a capacity sweep's (``replay --rates``) read back and drawn.

Every number comes from the files the replay wrote: the latency distributions and latency over
time from ``requests.parquet``, requests in flight and queued from its arrival, admission and
finish times, KV occupancy from ``engine_steps.parquet``, the summary table (goodput against
the SLOs) from ``summary.json``, the latency-throughput curve from ``curve.parquet``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..io.stamp import Stamp
from . import charts
from .blocks import Chart, chart_html
from .html import render

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["SERVING_CHART_IDS", "ServingData", "capacity_figure", "in_flight", "is_serving_dir",
           "read_serving", "serving_charts", "serving_report", "serving_section",
           "summary_rows"]

SERVING_CHART_IDS = {
    "latency": "chart-serving-latency",
    "latency_time": "chart-serving-latency-time",
    "in_flight": "chart-serving-in-flight",
    "kv": "chart-serving-kv",
    "capacity": "chart-capacity-curve",
}
NS = 1e9


@dataclass(frozen=True)
class ServingData:
    """What a replay (or capacity) directory holds; any part may be absent."""

    path: str
    requests: pa.Table | None = None
    engine_steps: pa.Table | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    scenario: str = ""
    curve: pa.Table | None = None
    max_rate: pa.Table | None = None
    curve_slo: dict[str, float] = field(default_factory=dict)  # the sweep's SLOs (its stamp)


def is_serving_dir(path: str | Path) -> bool:
    """A directory holding a replay's requests.parquet or a capacity sweep's curve.parquet."""
    p = Path(path)
    return p.is_dir() and ((p / "requests.parquet").is_file() or (p / "curve.parquet").is_file())


def read_serving(path: str | Path) -> ServingData:
    """Read a replay or capacity output directory; a clear error naming what is missing."""
    p = Path(path)
    if not is_serving_dir(p):
        raise ValueError(f"{p}: not a replay output directory (no requests.parquet from "
                         f"`blis-kernel replay`, no curve.parquet from `replay --rates`)")
    requests = engine = curve = best = None
    summary: dict[str, Any] = {}
    scenario = ""
    if (p / "requests.parquet").is_file():
        requests = pq.read_table(p / "requests.parquet")
        meta = requests.schema.metadata or {}
        scenario = (meta.get(b"blis.scenario") or b"").decode()
        need = {"arrival_ns", "admitted_ns", "finish_ns", "ttft_ns", "e2e_ns", "status"}
        missing = need - set(requests.column_names)
        if missing:
            raise ValueError(f"{p / 'requests.parquet'}: missing column(s) "
                             f"{', '.join(sorted(missing))}; not a replay's requests table")
        if (p / "engine_steps.parquet").is_file():
            engine = pq.read_table(p / "engine_steps.parquet")
        if (p / "summary.json").is_file():
            doc = json.loads((p / "summary.json").read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
                raise ValueError(f"{p / 'summary.json'}: expected an object with a 'summary' "
                                 f"mapping, as `blis-kernel replay` writes")
            summary = doc["summary"]
    curve_slo: dict[str, float] = {}
    if (p / "curve.parquet").is_file():
        curve = pq.read_table(p / "curve.parquet")
        st = Stamp.from_metadata(curve.schema.metadata)
        if st is not None and isinstance(st.options.get("slo"), dict):
            curve_slo = {str(k): float(v) for k, v in st.options["slo"].items()}
        if (p / "max_rate.parquet").is_file():
            best = pq.read_table(p / "max_rate.parquet")
    return ServingData(str(p), requests, engine, summary, scenario, curve, best, curve_slo)


# -- pure data --------------------------------------------------------------------------------

def _ns(table: pa.Table, name: str) -> np.ndarray:
    """An integer-ns column as float64 with NaN for nulls."""
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), np.float64)


def _finished(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("status").to_pylist()) == "finished"


def in_flight(requests: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step functions over time: (t_ns, in flight, queued) where each count holds from t[i]
    until t[i+1]. In flight: arrived and not finished; queued: arrived and not yet admitted
    (finished requests only)."""
    done = _finished(requests)
    arr = _ns(requests, "arrival_ns")[done].astype(np.int64)
    adm = _ns(requests, "admitted_ns")[done].astype(np.int64)
    fin = _ns(requests, "finish_ns")[done].astype(np.int64)
    t = np.unique(np.concatenate([arr, adm, fin]))
    # count(start <= t) - count(end <= t): the requests in [start, end) at each instant
    flying = np.searchsorted(np.sort(arr), t, "right") - np.searchsorted(np.sort(fin), t, "right")
    queued = np.searchsorted(np.sort(arr), t, "right") - np.searchsorted(np.sort(adm), t, "right")
    return t, flying.astype(np.int64), queued.astype(np.int64)


_ROWS = (  # (summary key, label, kind): kind s = seconds shown in ms
    ("requests", "requests", "int"), ("finished", "finished", "int"),
    ("rejected", "rejected", "int"), ("duration_s", "duration (s)", "float"),
    ("throughput_rps", "throughput (requests/s)", "float"),
    ("throughput_output_tps", "output tokens/s", "float"),
    *((f"{m}_s_{q}", f"{m.upper()} {q}", "s") for m in ("ttft", "itl", "e2e", "queue")
      for q in ("mean", "p50", "p90", "p99")),
    ("kv_occupancy_mean", "KV occupancy mean", "share"),
    ("kv_occupancy_max", "KV occupancy max", "share"),
    ("preemptions", "preemptions", "int"), ("prefix_hit_rate", "prefix hit rate", "share"),
    ("goodput_requests", "requests within every SLO", "int"),
    ("goodput_rps", "goodput (requests/s within every SLO)", "float"),
    ("slo_attainment", "SLO attainment (of finished)", "share"),
)


def _fmt(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "int":
        return f"{int(v):,}"
    if kind == "s":
        return f"{float(v) * 1e3:,.3f} ms"
    if kind == "share":
        return f"{float(v):.1%}"
    return f"{float(v):,.4g}"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """(key, label, shown, raw value) for each summary figure the replay wrote."""
    return [(k, label, _fmt(summary[k], kind), summary[k]) for k, label, kind in _ROWS
            if k in summary]


# -- figures ----------------------------------------------------------------------------------

def _hist(ax: Any, values_ns: np.ndarray, label: str) -> None:
    v = values_ns[np.isfinite(values_ns)] / 1e6
    if v.size:
        ax.hist(v, bins=min(60, max(5, int(np.sqrt(v.size)))), color="#1f77b4", alpha=0.85)
        for q, style in ((50, "--"), (99, ":")):
            x = float(np.percentile(v, q))
            ax.axvline(x, color="#d62728", linestyle=style, linewidth=1.2, label=f"p{q} {x:,.2f}")
        ax.legend(fontsize=8)
    ax.set_xlabel(f"{label} (ms)")
    ax.set_ylabel("requests")


def latency_figure(requests: pa.Table) -> Figure:
    """Histograms of TTFT, per-request mean inter-token latency (TPOT) and E2E."""
    done = _finished(requests)
    fig = charts._new(12.0, 3.8)
    axes = fig.subplots(1, 3)
    with charts._rc():
        _hist(axes[0], _ns(requests, "ttft_ns")[done], "TTFT")
        _hist(axes[1], _ns(requests, "tpot_mean_ns")[done], "ITL (per-request mean)")
        _hist(axes[2], _ns(requests, "e2e_ns")[done], "E2E")
    return fig


def latency_time_figure(requests: pa.Table) -> Figure:
    """TTFT and E2E of each request against its arrival time."""
    done = _finished(requests)
    t = _ns(requests, "arrival_ns")[done] / NS
    fig = charts._new(10.0, 4.0)
    ax = fig.subplots()
    with charts._rc():
        ax.scatter(t, _ns(requests, "e2e_ns")[done] / 1e6, s=6, alpha=0.5, label="E2E",
                   color="#ff7f0e")
        ax.scatter(t, _ns(requests, "ttft_ns")[done] / 1e6, s=6, alpha=0.6, label="TTFT",
                   color="#1f77b4")
        if done.any():  # a log axis needs a value (a replay may reject every request)
            ax.set_yscale("log")
        ax.set_xlabel("arrival (s from the trace start)")
        ax.set_ylabel("latency (ms)")
        ax.legend(fontsize=8)
    return fig


def in_flight_figure(requests: pa.Table) -> Figure:
    t, flying, queued = in_flight(requests)
    fig = charts._new(10.0, 3.8)
    ax = fig.subplots()
    with charts._rc():
        ax.step(t / NS, flying, where="post", label="in flight (arrived, not finished)",
                color="#1f77b4")
        ax.step(t / NS, queued, where="post", label="queued (arrived, not admitted)",
                color="#d62728")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests")
        ax.legend(fontsize=8)
    return fig


def kv_figure(engine_steps: pa.Table) -> Figure:
    """KV blocks used / blocks per engine core at each step (one line per core, up to 8)."""
    fig = charts._new(10.0, 3.8)
    ax = fig.subplots()
    start = _ns(engine_steps, "start") / NS
    occ = _ns(engine_steps, "kv_used") / np.maximum(_ns(engine_steps, "kv_blocks"), 1)
    key = (np.asarray(engine_steps.column("pool")) * 1_000_000
           + np.asarray(engine_steps.column("engine")))
    with charts._rc():
        for i, k in enumerate(np.unique(key)[:8]):
            m = key == k
            ax.step(start[m], occ[m] * 100, where="post", linewidth=1,
                    label=f"pool {k // 1_000_000} core {k % 1_000_000}", color=f"C{i}")
        ax.set_ylim(0, 100)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV blocks used (%)")
        ax.legend(fontsize=8)
    return fig


def capacity_figure(curve: pa.Table, max_rate: pa.Table | None = None,
                    slo: dict[str, float] | None = None) -> Figure:
    """The latency-throughput curve: TTFT p50/p99 and ITL p99 against achieved throughput,
    one colour per scenario; the highest rate within the SLOs circled, the SLOs as lines."""
    fig = charts._new(12.0, 4.2)
    axes = fig.subplots(1, 2)
    names = list(dict.fromkeys(curve.column("scenario").to_pylist()))
    best = ({r["scenario"]: r["max_rate"] for r in max_rate.to_pylist()}
            if max_rate is not None else {})
    with charts._rc():
        for i, name in enumerate(names):
            rows = [r for r in curve.to_pylist() if r["scenario"] == name]
            x = np.array([r["throughput_rps"] or np.nan for r in rows])
            for ax, (key, style) in ((axes[0], ("ttft_s_p50", "--")), (axes[0], ("ttft_s_p99", "-")),
                                     (axes[1], ("itl_s_p99", "-"))):
                y = np.array([(r[key] if r[key] is not None else np.nan) * 1e3 for r in rows])
                ax.plot(x, y, style, marker="o", markersize=3, color=f"C{i}",
                        label=f"{name} {key.split('_')[-1]}")
                b = best.get(name)
                if b is not None:
                    j = [r["rate"] for r in rows].index(b)
                    ax.plot([x[j]], [y[j]], "o", markersize=10, fillstyle="none",
                            color=f"C{i}")
        for ax, key in ((axes[0], "ttft"), (axes[1], "itl")):
            if slo and key in slo:
                ax.axhline(slo[key] * 1e3, color="#555555", linestyle=":", linewidth=1,
                           label=f"{key.upper()} SLO")
        axes[0].set_ylabel("TTFT (ms)")
        axes[1].set_ylabel("ITL p99 (ms)")
        for ax in axes:
            ax.set_xlabel("achieved throughput (requests/s)")
            if any(np.isfinite(line.get_ydata()).any() for line in ax.get_lines()):
                ax.set_yscale("log")
            ax.legend(fontsize=7)
    return fig


# -- the section ------------------------------------------------------------------------------

def serving_charts(data: ServingData, embed: str = "svg") -> list[Chart]:
    out: list[Chart] = []
    ids = SERVING_CHART_IDS
    if data.requests is not None and data.requests.num_rows:
        out.append(Chart.of(latency_figure(data.requests), ids["latency"],
                            "Latency distributions",
                            "TTFT, per-request mean inter-token latency and E2E of every "
                            "finished request (requests.parquet); dashed p50, dotted p99.",
                            embed))
        out.append(Chart.of(latency_time_figure(data.requests), ids["latency_time"],
                            "Latency over time", "Each request's TTFT and E2E at its arrival.",
                            embed))
        out.append(Chart.of(in_flight_figure(data.requests), ids["in_flight"],
                            "Requests in flight and queued",
                            "From each request's arrival, admission (its first step) and "
                            "finish.", embed))
    if data.engine_steps is not None and data.engine_steps.num_rows:
        out.append(Chart.of(kv_figure(data.engine_steps), ids["kv"], "KV occupancy",
                            "KV blocks in use per engine core at each step "
                            "(engine_steps.parquet).", embed))
    if data.curve is not None and data.curve.num_rows:
        out.append(Chart.of(capacity_figure(data.curve, data.max_rate, data.curve_slo), ids["capacity"],
                            "Latency-throughput curve",
                            "One point per swept rate (curve.parquet); circled: the highest "
                            "rate within the SLOs; dotted: the SLOs (a request meets the ITL SLO by its own p99 ITL).", embed))
    return out


def _summary_table(summary: dict[str, Any]) -> str:
    rows = "".join(f'<tr><td>{escape(label)}</td><td class="n" data-key="{escape(k)}" '
                   f'data-value="{escape(json.dumps(raw))}">{escape(shown)}</td></tr>'
                   for k, label, shown, raw in summary_rows(summary))
    slo = summary.get("slo") or {}
    slo_text = (", ".join(f"{k} ≤ {float(v) * 1e3:,.3f} ms" for k, v in slo.items())
                if slo else "none given (--slo ttft=…,itl=…)")
    return (f"<p>SLOs: {escape(slo_text)}.</p><table id='serving-summary'><thead><tr>"
            f"<th>figure</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>")


def _curve_table(curve: pa.Table, max_rate: pa.Table | None) -> str:
    head = ("scenario", "rate", "throughput_rps", "ttft_s_p50", "ttft_s_p99", "itl_s_p50",
            "itl_s_p99", "e2e_s_p99", "goodput_rps", "meets_slo")
    body = []
    for r in curve.to_pylist():
        cells = []
        for h in head:
            v = r.get(h)
            shown = ("-" if v is None else f"{v * 1e3:,.3f}" if h.endswith(("_p50", "_p99"))
                     else f"{v:,.4g}" if isinstance(v, float) else str(v))
            cells.append(f'<td class="n" data-key="{h}">{escape(shown)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    best = ""
    if max_rate is not None:
        best = "<ul>" + "".join(
            f"<li data-scenario='{escape(r['scenario'])}'>{escape(r['scenario'])}: "
            + ("no swept rate meets the SLOs" if r["max_rate"] is None
               else f"highest rate within the SLOs {r['max_rate']:g} requests/s") + "</li>"
            for r in max_rate.to_pylist()) + "</ul>"
    labels = [h.replace("_s_", " ") + (" (ms)" if h.endswith(("_p50", "_p99")) else "")
              for h in head]
    return (best + "<table id='capacity-curve'><thead><tr>"
            + "".join(f"<th>{escape(x)}</th>" for x in labels)
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def serving_section(data: ServingData, embed: str = "svg") -> str:
    """The section's HTML (trusted fragment for :func:`kernel.report.html.render`)."""
    parts = ["<section id='serving'><h2>Serving</h2>"]
    if data.summary:
        parts.append(_summary_table(data.summary))
    if data.curve is not None:
        parts.append("<h3>Capacity</h3>" + _curve_table(data.curve, data.max_rate))
    parts.extend(chart_html(c) for c in serving_charts(data, embed))
    parts.append("</section>")
    return "".join(parts)


def serving_report(data: ServingData, *, title: str = "", embed: str = "svg") -> str:
    """A whole page: the serving section."""
    name = data.scenario or Path(data.path).name
    return render(title=title or f"blis-kernel: serving replay on {name}",
                  subtitle=str(data.path), extra_sections=[serving_section(data, embed)])
