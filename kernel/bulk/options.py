"""Pricing options, documented once (issue 30 item 3).

**What to price** (user-facing; the same keyword-only parameters, with the same defaults, on
:func:`kernel.bulk.price`, :func:`kernel.bulk.price_result`, :func:`kernel.bulk.price_file`
and :meth:`Kernel.price <kernel.facade.kernel.Kernel.price>`; a test keeps them aligned):

* ``decode_threshold`` / ``sm_budget`` — the step's phase split and SM budget (model.md §1),
  or per batch from ``batches`` (a table of ``batch_id`` + either column);
* ``columns`` — the trace's own names for ``batch_id``, ``scheduled``, ``computed``,
  ``prompt_len``;
* ``keep`` — trace columns passed through (each batch takes its first row's value);
  ``producers`` — computed columns (:mod:`kernel.bulk.columns`);
* ``measured`` / ``measured_unit`` — a trace column of measured step times (adds
  ``measured_ns`` and each estimate's relative error);
* ``reject_over_limit`` — set over-limit batches aside instead of flagging them;
* ``identity`` — the ``scenario`` and ``pool`` columns (:mod:`kernel.bulk.identity`);
* ``on_reject`` — what a rejected row does besides being set aside and counted: ``"warn"``
  (a :class:`~kernel.bulk.api.RejectedRowsWarning`), ``"raise"`` (the first bad row stops the
  run) or ``"ignore"``. ``price_file`` writes its rejects to a file, so it defaults to
  ``"ignore"``; the in-memory calls default to ``"warn"``. ``strict=True`` is the deprecated
  spelling of ``on_reject="raise"``.

**How the engine runs** (advanced): :class:`Tuning`. Nothing in it changes a priced number;
every order and budget prices bit for bit the same (``tests/test_spill.py``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

__all__ = ["CHUNK_ROWS", "ON_REJECT", "ORDERS", "SORT_MEMORY", "OnReject", "Tuning",
           "reject_mode", "size_bytes"]

OnReject = Literal["warn", "raise", "ignore"]
ON_REJECT: tuple[str, ...] = ("warn", "raise", "ignore")
ORDERS: tuple[str, ...] = ("auto", "sort", "external")
CHUNK_ROWS = 1 << 20  # trace rows read and validated at once
SORT_MEMORY = "1GB"  # DuckDB's memory limit for the external sort (it spills beyond)


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def size_bytes(v: int | str, what: str) -> int:
    """``1GB``, ``512MiB``, ``2e9`` or an int: bytes (DuckDB's units: KB = 1000 B)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    text = str(v).strip().lower().replace(" ", "")
    unit = text.lstrip("0123456789.e+")
    try:
        return int(float(text[:len(text) - len(unit)]) * _UNITS[unit or "b"])
    except (KeyError, ValueError):
        raise ValueError(f"{what}={v!r}: expected bytes as an int or a size such as '1GB', "
                         f"'512MiB' (units {', '.join(_UNITS)})") from None


@dataclass(frozen=True)
class Tuning:
    """How a trace is read, ordered and priced: never what it prices to.

    ``chunk_rows`` rows are read and validated at once; ``workers`` threads price (None: the
    cores, at most 8); ``order`` is ``"auto"`` (grouped as it streams when the trace is in
    batch order, else in memory or spilled by batch-id range), ``"sort"`` (never the grouped
    path) or ``"external"`` (DuckDB sorts on disk with ``sort_memory``); ``memory_budget``
    (bytes, or a size such as ``"2GB"``; default ``sort_memory``) bounds the rows held before
    spilling; spill files go to ``tmp_dir`` (default: beside the output, or the system's
    temporary folder in memory). docs/traces.md has the modes."""

    chunk_rows: int = CHUNK_ROWS
    workers: int | None = None
    order: str = "auto"
    sort_memory: str = SORT_MEMORY
    memory_budget: int | str | None = None
    tmp_dir: str | Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.chunk_rows, bool) or not isinstance(self.chunk_rows, int) \
                or self.chunk_rows < 1:
            raise ValueError(f"Tuning.chunk_rows must be a positive integer, not "
                             f"{self.chunk_rows!r}")
        if self.workers is not None and (isinstance(self.workers, bool)
                                         or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ValueError(f"Tuning.workers must be None or a positive integer, not "
                             f"{self.workers!r}")
        size_bytes(self.sort_memory, "Tuning.sort_memory")  # a bad size says so now
        if self.memory_budget is not None:
            size_bytes(self.memory_budget, "Tuning.memory_budget")
        if self.order not in ORDERS:
            raise ValueError(f"Tuning.order must be one of {', '.join(map(repr, ORDERS))}, "
                             f"not {self.order!r}")


def reject_mode(on_reject: str, strict: bool | None, where: str) -> OnReject:
    """``on_reject`` checked, with the deprecated ``strict`` folded in (True → "raise")."""
    if strict is not None:
        warnings.warn(f"{where}(strict=...) is deprecated: pass on_reject='raise' (or "
                      "'warn' / 'ignore') instead", DeprecationWarning, stacklevel=3)
        if strict:
            on_reject = "raise"
    if on_reject not in ON_REJECT:
        raise ValueError(f"on_reject must be one of {', '.join(map(repr, ON_REJECT))}, not "
                         f"{on_reject!r}")
    return cast(OnReject, on_reject)
