"""The calibration law: a pure function of a priced step's per-resource terms.

    calibrated_ns = trunc(m_sm·sm_ns + m_hbm·hbm_ns + m_nvlink·nvlink_ns + m_nic·nic_ns
                          + m_host·host_ns + constant_ns)

with one set of non-negative multipliers and one non-negative constant per *phase class* of
the step: prefill-only, decode-only or mixed (an empty step counts as decode-only). The sum
is evaluated left to right in float64, one multiply and one add at a time, and truncated to
integer nanoseconds (saturating at 2^63−1), so a scalar step and a column of steps give the
same integer bit for bit. ``overlap`` and ``no_overlap`` are never touched: the calibrated
value is a third estimate beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..types import MAX_DURATION_NS

__all__ = ["PHASES", "TERMS", "Law", "PhaseCorrection", "calibrated_ns", "phase_code"]

TERMS = ("sm", "hbm", "nvlink", "nic", "host")
PHASES = ("prefill", "decode", "mixed")
PREFILL, DECODE, MIXED = 0, 1, 2
_TWO_63 = float(2**63)


@dataclass(frozen=True)
class PhaseCorrection:
    """One phase class's multipliers (in :data:`TERMS` order) and per-step constant (ns)."""

    multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    constant_ns: float = 0.0

    def __post_init__(self) -> None:
        if len(self.multipliers) != len(TERMS):
            raise ValueError(f"a phase correction needs {len(TERMS)} multipliers "
                             f"({', '.join(TERMS)}), got {len(self.multipliers)}")
        for name, v in zip(TERMS, self.multipliers, strict=True):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"multiplier {name} must be finite and >= 0, got {v!r}")
        if not (np.isfinite(self.constant_ns) and self.constant_ns >= 0):
            raise ValueError(f"constant_ns must be finite and >= 0, got {self.constant_ns!r}")

    @property
    def identity(self) -> bool:
        return self.multipliers == (1.0,) * len(TERMS) and self.constant_ns == 0.0


@dataclass(frozen=True)
class Law:
    """The three phase corrections (prefill-only, decode-only, mixed)."""

    prefill: PhaseCorrection = PhaseCorrection()
    decode: PhaseCorrection = PhaseCorrection()
    mixed: PhaseCorrection = PhaseCorrection()

    def phase(self, name: str) -> PhaseCorrection:
        if name not in PHASES:
            raise ValueError(f"phase {name!r} is not one of {list(PHASES)}")
        correction: PhaseCorrection = getattr(self, name)
        return correction

    def table(self) -> np.ndarray:
        """[3, 6] float64: per phase code, the five multipliers then the constant."""
        return np.array([[*c.multipliers, c.constant_ns]
                         for c in (self.prefill, self.decode, self.mixed)], np.float64)


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


@overload
def calibrated_ns(law: Law, terms: Sequence[int], prefill_requests: int,
                  decode_requests: int) -> int: ...
@overload
def calibrated_ns(law: Law, terms: Sequence[np.ndarray], prefill_requests: np.ndarray,
                  decode_requests: np.ndarray) -> np.ndarray: ...
def calibrated_ns(law: Law, terms: Any, prefill_requests: Any, decode_requests: Any) -> Any:
    """The calibrated step time from the five per-resource ns terms (in :data:`TERMS` order).

    Scalars give an ``int``; arrays an int64 array. Same operations in the same order either
    way, so the two agree bit for bit.
    """
    if len(terms) != len(TERMS):
        raise ValueError(f"calibrated_ns needs the {len(TERMS)} terms {TERMS}, got {len(terms)}")
    code = phase_code(prefill_requests, decode_requests)
    tab = law.table()
    if isinstance(code, np.ndarray):
        coef = tab[code.astype(np.intp)]  # [n, 6]
        acc = coef[:, 0] * np.asarray(terms[0], np.int64).astype(np.float64)
        for j in range(1, len(TERMS)):
            acc = acc + coef[:, j] * np.asarray(terms[j], np.int64).astype(np.float64)
        acc = acc + coef[:, len(TERMS)]
        big = acc >= _TWO_63
        out = np.where(big, 0.0, acc).astype(np.int64)
        return np.where(big, MAX_DURATION_NS, out)
    row = tab[code]
    x = float(row[0]) * float(int(terms[0]))
    for j in range(1, len(TERMS)):
        x = x + float(row[j]) * float(int(terms[j]))
    x = x + float(row[len(TERMS)])
    return MAX_DURATION_NS if x >= _TWO_63 else int(x)
