"""A pricing progress display for a terminal (rich) and for Jupyter (an HTML bar updated in
place through IPython's display, so it needs no widget extension).

Both expose ``task_ids``, ``update(task_id, completed=…, rate=…)`` and ``stop()``; anywhere
else (a pipe, a log file, a worker) there is no display at all.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any, Protocol


class Progress(Protocol):
    task_ids: list[Any]

    def update(self, task_id: Any, *, completed: float, rate: str) -> None: ...

    def stop(self) -> None: ...


def open_progress(total: int | None, enabled: bool, label: str = "pricing"
                  ) -> Progress | None:
    """A progress display for ``total`` rows (None: unknown), or None when there is nowhere
    to show one."""
    if not enabled:
        return None
    from rich.console import Console  # (heavy: rich, loaded only on this path)

    console = Console(stderr=True)  # progress on stderr: stdout is for data (CF3)
    if console.is_jupyter:
        return NotebookProgress(total, label)
    if not console.is_terminal:
        return None
    from rich.progress import (  # (heavy: rich, loaded only on this path)
        BarColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress  # (heavy: rich, loaded only on this path)

    prog: Any = RichProgress(TextColumn(label), BarColumn(), TaskProgressColumn(),
                        TextColumn("{task.completed:,.0f} rows  {task.fields[rate]} rows/s"),
                        TimeElapsedColumn(), transient=False, console=console)
    prog.start()
    prog.add_task(label, total=total, rate="-")
    return prog


class NotebookProgress:
    """An HTML progress bar in a notebook cell, redrawn at most every ``interval`` seconds."""

    def __init__(self, total: int | None, label: str = "pricing", interval: float = 0.25):
        from IPython.display import HTML, display  # (optional: IPython, in notebooks only)

        self.total, self.label, self.interval = total, label, interval
        self.task_ids: list[Any] = [0]
        self.completed, self.rate = 0.0, "-"
        self._html = HTML
        self._t0 = time.perf_counter()
        self._last = 0.0
        self._handle = display(HTML(self._render()), display_id=True)

    def _render(self) -> str:
        elapsed = time.perf_counter() - self._t0
        if self.total:
            frac = min(max(self.completed / self.total, 0.0), 1.0)
            bar = (f"<progress value='{frac:.4f}' max='1' style='width:240px'></progress> "
                   f"{frac:.0%}")
        else:
            bar = ""
        return (f"<div style='font-family:monospace'>{escape(self.label)} {bar} "
                f"{self.completed:,.0f} rows, {escape(self.rate)} rows/s, {elapsed:.1f} s</div>")

    def update(self, task_id: Any, *, completed: float, rate: str) -> None:
        self.completed, self.rate = completed, rate
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self._draw()

    def _draw(self) -> None:
        if self._handle is not None:
            self._handle.update(self._html(self._render()))

    def stop(self) -> None:
        self._draw()
