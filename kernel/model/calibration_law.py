"""The calibration law: a pure function of a priced step's per-resource terms.

From the NoOverlap start (the default, and every calibration written before issue 32)::

    x = m_sm·sm_ns + m_hbm·hbm_ns + m_nvlink·nvlink_ns + m_nic·nic_ns + m_host·host_ns

from the Overlap start (``Law.start == "overlap"``), the same corrections on top of Overlap::

    x = overlap_ns + (m_sm − 1)·sm_ns + … + (m_host − 1)·host_ns

then, either way::

    x = x + r·requests + constant_ns            (requests = prefill + decode requests)
    calibrated_ns = trunc(max(x, max_j m_j·t_j))

with one set of non-negative multipliers, one per-running-request slope ``r`` (ns) and one
constant (ns, which may be negative: a calibration can remove per-step time the model
over-charges) per *phase class* of the step: prefill-only, decode-only or mixed (an empty step
counts as decode-only). The floor ``max_j m_j·t_j`` is the step's largest calibrated resource
term: whatever the constant, no calibrated step is faster than its slowest resource (decision
CH3). Every operation is float64, one multiply or add at a time in the order written, and the
result is truncated to integer nanoseconds (saturating at 2^63−1), so a scalar step and a
column of steps give the same integer bit for bit. ``overlap`` and ``no_overlap`` are never
touched: the calibrated value is a third estimate beside them. With every multiplier 1, the
slope and the constant 0, the law is ``no_overlap_ns`` (NoOverlap start) or ``overlap_ns``
(Overlap start) exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .types import MAX_DURATION_NS

__all__ = ["PHASES", "STARTS", "TERMS", "Law", "PhaseCorrection", "calibrated_ns",
           "phase_code"]

TERMS = ("sm", "hbm", "nvlink", "nic", "host")
PHASES = ("prefill", "decode", "mixed")
STARTS = ("no_overlap", "overlap")
PREFILL, DECODE, MIXED = 0, 1, 2
_TWO_63 = float(2**63)
_R, _C = len(TERMS), len(TERMS) + 1  # the table's per-request and constant columns


@dataclass(frozen=True)
class PhaseCorrection:
    """One phase class's multipliers (in :data:`TERMS` order), per-step constant (ns, any
    sign) and per-running-request slope (ns per request in the step)."""

    multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    constant_ns: float = 0.0
    per_request_ns: float = 0.0

    def __post_init__(self) -> None:
        if len(self.multipliers) != len(TERMS):
            raise ValueError(f"a phase correction needs {len(TERMS)} multipliers "
                             f"({', '.join(TERMS)}), got {len(self.multipliers)}")
        for name, v in zip(TERMS, self.multipliers, strict=True):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"multiplier {name} must be finite and >= 0, got {v!r}")
        if not np.isfinite(self.constant_ns):
            raise ValueError(f"constant_ns must be finite, got {self.constant_ns!r}")
        if not np.isfinite(self.per_request_ns):
            raise ValueError(f"per_request_ns must be finite, got {self.per_request_ns!r}")

    @property
    def identity(self) -> bool:
        return (self.multipliers == (1.0,) * len(TERMS) and self.constant_ns == 0.0
                and self.per_request_ns == 0.0)


@dataclass(frozen=True)
class Law:
    """The three phase corrections (prefill-only, decode-only, mixed) and the estimate they
    start from (``no_overlap`` or ``overlap``)."""

    prefill: PhaseCorrection = PhaseCorrection()
    decode: PhaseCorrection = PhaseCorrection()
    mixed: PhaseCorrection = PhaseCorrection()
    start: str = "no_overlap"

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            raise ValueError(f"a law starts from one of {list(STARTS)}, got {self.start!r}")

    def phase(self, name: str) -> PhaseCorrection:
        if name not in PHASES:
            raise ValueError(f"phase {name!r} is not one of {list(PHASES)}")
        correction: PhaseCorrection = getattr(self, name)
        return correction

    def table(self) -> np.ndarray:
        """[3, 7] float64: per phase code, the five multipliers, the per-request slope, the
        constant."""
        return np.array([[*c.multipliers, c.per_request_ns, c.constant_ns]
                         for c in (self.prefill, self.decode, self.mixed)], np.float64)

    @classmethod
    def from_table(cls, table: Any, start: str = "no_overlap") -> Law:
        """The inverse of :meth:`table` (an outer optimiser's parameter vector, reshaped to
        [3, 7]); every value is checked as :class:`PhaseCorrection` checks it."""
        t = np.asarray(table, np.float64)
        if t.shape != (len(PHASES), len(TERMS) + 2):
            raise ValueError(f"a law table is [3, 7] (phases × five multipliers, slope, "
                             f"constant), got shape {t.shape}")
        rows = [PhaseCorrection(tuple(float(v) for v in r[:len(TERMS)]),  # type: ignore[arg-type]
                                float(r[_C]), float(r[_R])) for r in t]
        return cls(rows[0], rows[1], rows[2], start)


@overload
def phase_code(prefill_requests: int, decode_requests: int) -> int: ...
@overload
def phase_code(prefill_requests: np.ndarray, decode_requests: np.ndarray) -> np.ndarray: ...
def phase_code(prefill_requests: Any, decode_requests: Any) -> Any:
    """0 prefill-only, 1 decode-only (and the empty step), 2 mixed."""
    if isinstance(prefill_requests, np.ndarray) or isinstance(decode_requests, np.ndarray):
        p = np.asarray(prefill_requests) > 0
        d = np.asarray(decode_requests) > 0
        return np.where(p & d, MIXED, np.where(p, PREFILL, DECODE)).astype(np.int8)
    p, d = prefill_requests > 0, decode_requests > 0
    return MIXED if (p and d) else PREFILL if p else DECODE


def _missing_overlap() -> ValueError:
    return ValueError("this calibration starts from Overlap: calibrated_ns needs overlap_ns "
                      "(the step's Overlap estimate)")


@overload
def calibrated_ns(law: Law, terms: Sequence[int], prefill_requests: int,
                  decode_requests: int, overlap_ns: int | None = None) -> int: ...
@overload
def calibrated_ns(law: Law, terms: Sequence[np.ndarray], prefill_requests: np.ndarray,
                  decode_requests: np.ndarray, overlap_ns: np.ndarray | None = None
                  ) -> np.ndarray: ...
def calibrated_ns(law: Law, terms: Any, prefill_requests: Any, decode_requests: Any,
                  overlap_ns: Any = None) -> Any:
    """The calibrated step time from the five per-resource ns terms (in :data:`TERMS` order),
    the step's request counts and (for a law that starts from Overlap) its Overlap estimate.

    Scalars give an ``int``; arrays an int64 array. Same operations in the same order either
    way, so the two agree bit for bit.
    """
    if len(terms) != len(TERMS):
        raise ValueError(f"calibrated_ns needs the {len(TERMS)} terms {TERMS}, got {len(terms)}")
    from_overlap = law.start == "overlap"
    if from_overlap and overlap_ns is None:
        raise _missing_overlap()
    code = phase_code(prefill_requests, decode_requests)
    tab = law.table()
    if isinstance(code, np.ndarray):
        coef = tab[code.astype(np.intp)]  # [n, 7]
        t = [np.asarray(terms[j], np.int64).astype(np.float64) for j in range(len(TERMS))]
        scaled = [coef[:, j] * t[j] for j in range(len(TERMS))]
        if from_overlap:
            acc = np.asarray(overlap_ns, np.int64).astype(np.float64)
            for j in range(len(TERMS)):
                acc = acc + (coef[:, j] - 1.0) * t[j]
        else:
            acc = scaled[0]
            for j in range(1, len(TERMS)):
                acc = acc + scaled[j]
        n = (np.asarray(prefill_requests, np.int64)
             + np.asarray(decode_requests, np.int64)).astype(np.float64)
        acc = acc + coef[:, _R] * n
        acc = acc + coef[:, _C]
        floor = scaled[0]
        for j in range(1, len(TERMS)):
            floor = np.maximum(floor, scaled[j])
        acc = np.maximum(acc, floor)
        big = acc >= _TWO_63
        out = np.where(big, 0.0, acc).astype(np.int64)
        return np.where(big, MAX_DURATION_NS, out)
    row = tab[code]
    ts = [float(int(terms[j])) for j in range(len(TERMS))]
    sc = [float(row[j]) * ts[j] for j in range(len(TERMS))]
    x: float
    if from_overlap:
        x = float(int(overlap_ns))
        for j in range(len(TERMS)):
            x = x + (float(row[j]) - 1.0) * ts[j]
    else:
        x = sc[0]
        for j in range(1, len(TERMS)):
            x = x + sc[j]
    x = x + float(row[_R]) * float(int(prefill_requests) + int(decode_requests))
    x = x + float(row[_C])
    low = sc[0]
    for j in range(1, len(TERMS)):
        low = low if low >= sc[j] else sc[j]
    x = x if x >= low else low
    return MAX_DURATION_NS if x >= _TWO_63 else int(x)
