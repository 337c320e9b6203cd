"""How the model's records read: durations, counts and spans as text, and small
self-contained HTML tables (no scripts, no external styles) for notebooks. Integer
nanoseconds stay the data; only the text converts to µs / ms / s."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import StepEstimate

_STYLE = ("border-collapse:collapse;font-family:monospace;font-size:12px;"
          "text-align:left")


def fmt_duration(ns: float) -> str:
    """A duration in the unit that reads best: ns, µs, ms (three significant digits) or
    seconds — three significant digits below 100 s, then whole seconds to four significant
    digits with thousands separators (195,100 s), never scientific notation."""
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms"
    secs = ns / 1e9
    if a < 100e9:
        return f"{secs:.3g} s"
    digits = len(str(int(abs(secs))))
    return f"{round(secs, 4 - digits):,.0f} s"


_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(value: float, unit: str) -> str:
    """A count with an SI prefix and three significant digits: 1.06 EFLOP, 4.08 PB."""
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


_SPANS = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def fmt_span(ns: float) -> str:
    """A long duration as its two largest calendar units ("2 d 6 h", "3 h 12 min", "4 min
    10 s"); under a minute, :func:`fmt_duration`."""
    if abs(ns) < 60e9:
        return fmt_duration(ns)
    left = int(round(abs(ns) / 1e9))
    parts: list[str] = []
    for unit, size in _SPANS:
        n, left = divmod(left, size)
        if n or parts:
            parts.append(f"{n} {unit}")
        if len(parts) == 2:
            break
    parts = [p for p in parts if not p.startswith("0 ")] or parts[:1]
    return ("-" if ns < 0 else "") + " ".join(parts)


def fmt_long(ns: float) -> str:
    """``fmt_span`` with the exact seconds alongside once it exceeds a minute:
    "2 d 6 h (195,100 s)"."""
    if abs(ns) < 60e9:
        return fmt_duration(ns)
    return f"{fmt_span(ns)} ({fmt_duration(ns)})"


def table_html(rows: Iterable[tuple[str, str]], title: str = "") -> str:
    """Two columns of already-formatted text, escaped."""
    body = "".join(f"<tr><th style='padding:1px 8px'>{escape(k)}</th>"
                   f"<td style='padding:1px 8px'>{escape(v)}</td></tr>" for k, v in rows)
    caption = f"<caption style='text-align:left'><b>{escape(title)}</b></caption>" \
        if title else ""
    return f"<table style='{_STYLE}'>{caption}{body}</table>"



def step_html(est: StepEstimate) -> str:
    rows = [("NoOverlap", fmt_duration(est.no_overlap)), ("Overlap", fmt_duration(est.overlap)),
            ("bottleneck", str(est.bottleneck))]
    for res, ns in (est.per_resource or {}).items():
        share = ns / est.no_overlap if est.no_overlap else 0.0
        rows.append((f"  {res}", f"{fmt_duration(ns)} ({share:.0%})"))
    return table_html(rows, "StepEstimate")


