"""Coefficient units: what each declared ``units`` value measures and its factor to SI, and
the quantity each coefficient name must measure.

Defined once here and handed to SQL as two tables (``coefficient_units``,
``coefficient_quantities``; :func:`pipeline.db.register_units`). ``sql/50_coefficients.sql``
lifts each coefficient by its declared units, and ``sql/90_refusals.sql`` refuses a pool whose
coefficient declares units that do not measure what its name does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Unit:
    """A declared unit as it measures one quantity: ``value * factor`` is in ``si_unit``.

    A duration lifts through ``us_to_ns`` (the kernel's law, truncating as the reference does)
    rather than a bare product; ``factor`` records the same scale.
    """

    unit: str
    quantity: str
    si_unit: str
    factor: float


_DURATIONS = ("us_per_transfer", "us_per_token", "us_per_request", "us_per_layer",
              "us_per_step", "us_per_hop", "us_per_load")

# Every unit of the registry's vocabulary (validate_common.UNITS), with the quantity it measures.
UNITS: tuple[Unit, ...] = (
    Unit("dimensionless", "dimensionless", "dimensionless", 1.0),
    *(Unit(u, "duration", "ns", 1e3) for u in _DURATIONS),
    Unit("bytes_per_us", "byte_rate", "bytes/s", 1e6),
    Unit("bytes_per_rank", "bytes", "bytes", 1.0),
    Unit("tokens", "tokens", "tokens", 1.0),
    # The vocabulary has no tokens-per-µs unit: a token rate is declared `tokens` (the
    # registry's recurrent rates say "tokens per microsecond"), so for a token-rate name
    # `tokens` means tokens/µs (decisions SM5).
    Unit("tokens", "token_rate", "tokens/s", 1e6),
    Unit("sm_count", "count", "sm", 1.0),
)

# How a refusal names each quantity.
QUANTITY_LABELS = {"dimensionless": "a dimensionless factor", "duration": "a duration",
                   "byte_rate": "a byte rate", "bytes": "a byte count", "tokens": "a token count",
                   "token_rate": "a token rate", "count": "a count"}

# What a coefficient name measures: glob patterns (`*` = any text), the first match wins.
# Names no pattern matches are not read by the kernel; they lift by the quantity their units
# name first in UNITS and are not checked.
QUANTITIES: tuple[tuple[str, str], ...] = (
    ("host_link_bandwidth", "byte_rate"),
    ("host_*", "duration"),
    ("collective_floor_*", "duration"),
    ("collective_knot_*", "duration"),
    ("attention_decode_floor*", "duration"),
    ("attention_decode_per_request", "duration"),
    ("attention_prefill_floor", "duration"),
    ("recurrent_decode_floor_*", "duration"),
    ("*_latency", "duration"),
    ("collective_peak_rate_*", "byte_rate"),
    ("collective_transition_rate_*", "byte_rate"),
    ("attention_decode_rate*", "byte_rate"),
    ("recurrent_decode_rate_*", "token_rate"),
    ("*_bytes*", "bytes"),
    ("gemm_m_half_*", "tokens"),
    ("gemm_n_half_*", "tokens"),
    ("gemm_k_half_*", "tokens"),
    ("gemm_eps_max_*", "dimensionless"),
    ("hbm_derate", "dimensionless"),
    ("attention_prefill_work_scale", "dimensionless"),
    ("activation_buffer_count_*", "dimensionless"),
    ("moe_fused_floor", "duration"),  # the fitted fused MoE law (decision MF1)
    ("moe_fused_weight_rate", "byte_rate"),
    ("moe_*", "dimensionless"),
)


def units_table() -> pa.Table:
    """``UNITS`` as rows: unit, quantity (and its label), si_unit, factor, and ``position``
    (table order)."""
    return pa.table({
        "unit": [u.unit for u in UNITS], "quantity": [u.quantity for u in UNITS],
        "quantity_label": [QUANTITY_LABELS[u.quantity] for u in UNITS],
        "si_unit": [u.si_unit for u in UNITS], "factor": [u.factor for u in UNITS],
        "position": list(range(len(UNITS)))})


def quantities_table() -> pa.Table:
    """``QUANTITIES`` as rows: pattern (a DuckDB GLOB), quantity, ``position`` (first wins)."""
    return pa.table({"pattern": [p for p, _ in QUANTITIES],
                     "quantity": [q for _, q in QUANTITIES],
                     "position": list(range(len(QUANTITIES)))})
