"""A measured step-time column: unit conversion to integer ns and the reasons a value is bad.

A measured value must be a finite number > 0. Values are converted to nanoseconds by
multiplying by the unit's factor and rounding half up (a measurement is a quantity, not a
duration the kernel computed, so it is rounded rather than truncated: 35.2 ms is exactly
35,200,000 ns even though 35.2·10⁶ is 35,199,999.99… in float64). A value that rounds to
0 ns is rejected like a zero.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BAD_MEASURED", "UNITS", "to_ns"]

UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
BAD_MEASURED = "bad_measured"  # the rejects table's reason code
_MAX = float(2**63 - 1024)  # the largest float64 below 2^63


def to_ns(values: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """(int64 ns, detail per value: "" when good, else why it is bad).

    ``values`` may hold NaN for nulls (pass a float array with NaN where the column is null).
    """
    if unit not in UNITS:
        raise ValueError(f"measured unit {unit!r} is not one of {list(UNITS)}")
    v = np.asarray(values, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        x = v * UNITS[unit]
        ns = np.floor(x + 0.5)
    detail = np.full(v.size, "", dtype=object)
    nan = np.isnan(v)
    inf = np.isinf(v)
    neg = ~nan & (v < 0)
    zero = ~nan & (v == 0)
    tiny = ~nan & ~inf & (v > 0) & (ns < 1)
    big = ~nan & ~inf & (v > 0) & (ns > _MAX)
    detail[nan] = "the measured value is null or NaN"
    detail[inf] = "the measured value is not finite"
    detail[neg] = "the measured value is negative"
    detail[zero] = "the measured value is zero"
    detail[tiny] = f"the measured value rounds to 0 ns (unit {unit})"
    detail[big] = "the measured value does not fit int64 nanoseconds"
    good = detail == ""
    out = np.where(good, ns, 0.0).astype(np.int64)
    return out, detail
