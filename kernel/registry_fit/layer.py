"""Write fitted coefficient families as a registry layer: ``<dir>/coefficients/<set>.yaml``
(one coefficient set per chip and family) and ``<dir>/fit-report.csv`` (held-out scores)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from pipeline import safe_output

from .allreduce import AllReduceFit
from .attention import AttentionDecodeFit, AttentionPrefillFit
from .moe import MoeFit
from .tables import OperatorTable


def knot_name(ranks: int, chip: str, nbytes: int) -> str:
    """The registry name of one all-reduce knot (read by sql/55_collectives.sql)."""
    return f"collective_knot_all_reduce_{ranks}rank_{chip.replace('-', '_')}_{nbytes}B"


def all_reduce_set(chip: str, table: OperatorTable, fits: Iterable[AllReduceFit]) -> dict[str, Any]:
    """The coefficient set of one chip's fitted all-reduce curves."""
    cite = f"{table.cite()} ({table.backend} {table.version}, graph-mode rows)"
    nearest = ("" if table.exact else
               f" Measured at {table.backend} {table.version}, the nearest version the tables "
               f"have to the priced {table.requested}.")
    entries = []
    for f in fits:
        for b, us in zip(f.knot_bytes, f.knot_us, strict=True):
            entries.append({knot_name(f.ranks, chip, b): {
                "value": round(float(us), 4),
                "units": "us_per_transfer",
                "method": "measured",
                "fitted": True,
                "scope": {"hardware": [chip], "tp": [f.ranks]},
                "sources": [{"kind": "model", "cite": cite, "role": "primary"}],
                "rationale": (
                    f"Latency of vLLM's {f.ranks}-rank tensor-parallel all-reduce of a "
                    f"{b}-byte bfloat16 message on {chip} (CUDA graph), made non-decreasing "
                    f"in message size; the kernel interpolates between knots. Held out: "
                    f"{100 * f.mape:.1f}% MAPE over {f.held_out} rows." + nearest),
            }})
    return {"kind": "CoefficientSet", "name": set_name(chip), "coefficients": entries}


def set_name(chip: str) -> str:
    return f"vllm-all-reduce-{chip}"


def _fitted_entry(chip: str, cite: str, held: str
                  ) -> Callable[[str, float, str, str], dict[str, Any]]:
    """A builder of one coefficient fitted on ``chip`` from the operator table ``cite``
    names, its rationale (``what``) ending with the fit's held-out score (``held``)."""

    def entry(name: str, value: float, units: str, what: str) -> dict[str, Any]:
        return {name: {"value": round(value, 4), "units": units, "method": "measured",
                       "fitted": True, "scope": {"hardware": [chip]},
                       "sources": [{"kind": "model", "cite": cite, "role": "primary"}],
                       "rationale": what + held}}

    return entry


def _attention_entry(chip: str, table: OperatorTable, f: AttentionDecodeFit | AttentionPrefillFit,
                     rows: str) -> Callable[[str, float, str, str], dict[str, Any]]:
    """A builder of one fitted attention coefficient: measured on ``chip`` from ``table``'s
    ``rows``, its rationale ending with the held-out score (and the version actually measured
    when the tables lack the priced one)."""
    cite = f"{table.cite()} ({table.backend} {table.version}, {rows})"
    nearest = ("" if table.exact else
               f" Measured at {table.backend} {table.version}, the nearest version the tables "
               f"have to the priced {table.requested}.")
    held = (f" Fitted jointly on {f.rows} rows of {f.shapes} head shapes; held out by shape: "
            f"{100 * f.mape:.1f}% MAPE ({100 * f.bias:+.1f}% bias).") + nearest

    return _fitted_entry(chip, cite, held)


def attention_decode_set(chip: str, table: OperatorTable, f: AttentionDecodeFit
                         ) -> dict[str, Any]:
    """The coefficient set of one chip's fitted decode attention law (floor, rate and the
    per-request term, fitted jointly; they replace the scenario's part-wide pair)."""
    entry = _attention_entry(chip, table, f, "full-attention rows")

    return {"kind": "CoefficientSet", "name": f"vllm-attention-decode-{chip}", "coefficients": [
        entry("attention_decode_floor", f.floor_us, "us_per_layer",
              f"Request-independent time of vLLM's decode attention kernel on {chip}."),
        entry("attention_decode_per_request", f.per_request_us, "us_per_request",
              f"Time each decode request adds to vLLM's decode attention kernel on {chip}, "
              "beyond its KV read (per layer)."),
        entry("attention_decode_rate", f.rate_bytes_per_us, "bytes_per_us",
              f"Rate at which vLLM's decode attention kernel reads KV on {chip}."),
    ]}


def attention_report(chip: str, table: OperatorTable, f: AttentionDecodeFit
                     ) -> dict[str, Any]:
    return {"chip": chip, "family": "attention_decode", "group": f"{f.shapes}shapes",
            "table": table.cite(), "version": table.version, "requested": table.requested,
            "held_out_rows": f.rows, "mape": round(f.mape, 5), "bias": round(f.bias, 5),
            "worst": round(f.worst, 5)}


def attention_prefill_set(chip: str, table: OperatorTable, f: AttentionPrefillFit
                          ) -> dict[str, Any]:
    """The coefficient set of one chip's fitted prefill attention term (floor and work scale,
    at the chip's bf16 GEMM ramp: model.md §3.4)."""
    entry = _attention_entry(chip, table, f, "full-attention bf16 rows")

    return {"kind": "CoefficientSet", "name": f"vllm-attention-prefill-{chip}", "coefficients": [
        entry("attention_prefill_floor", f.floor_us, "us_per_layer",
              f"Minimum time of vLLM's prefill attention kernel on {chip}."),
        entry("attention_prefill_work_scale", f.work_scale, "dimensionless",
              f"Fraction of the bf16 GEMM ramp vLLM's prefill attention reaches on {chip}."),
    ]}


def prefill_report(chip: str, table: OperatorTable, f: AttentionPrefillFit) -> dict[str, Any]:
    return {"chip": chip, "family": "attention_prefill", "group": f"{f.shapes}shapes",
            "table": table.cite(), "version": table.version, "requested": table.requested,
            "held_out_rows": f.rows, "mape": round(f.mape, 5), "bias": round(f.bias, 5),
            "worst": None}


def moe_engine_set(chip: str, engine: str, table: OperatorTable | None = None,
                   fit: MoeFit | None = None) -> dict[str, Any]:
    """The MoE set of one chip: the engine fact of the priced vLLM (decision MO1, not fitted:
    every chip carries it), then, where the chip's tables hold vLLM MoE rows, the fitted fused
    MoE law (decision MF1)."""
    fitted = _moe_fitted(chip, table, fit) if table is not None and fit is not None else []
    return {"kind": "CoefficientSet", "name": f"vllm-moe-{chip}", "coefficients": [
        {"moe_expert_tp_split": {
            "value": 1.0, "units": "dimensionless", "method": "literature", "fitted": False,
            "scope": {"hardware": [chip]},
            "sources": [{"kind": "model", "role": "primary", "cite": (
                "vLLM v0.31.0 vllm/model_executor/layers/fused_moe/layer.py (FusedMoE: "
                "intermediate_size_per_partition = intermediate_size // tp_size without "
                "expert parallelism)")}],
            "rationale": (
                f"Under {engine}, each rank of a tensor-parallel group runs its tp slice of every "
                "expert (w13 and w2 sharded on the intermediate size), so a routed token's "
                "expert FLOPs divide by tp as its weight bytes do. The reference keeps them "
                "undivided (model.md §4.2, a documented over-charge). 1 = divide; the kernel "
                "reads it only with expert parallelism off.")}},
        *fitted,
    ]}


def _moe_fitted(chip: str, table: OperatorTable, f: MoeFit) -> list[dict[str, Any]]:
    """The fused MoE law's three coefficients (kernel/registry_fit/moe.py), each citing the
    table and version and carrying the held-out score."""
    cite = (f"{table.cite()} ({table.backend} {table.version}, bfloat16 rows, moe_ep_size 1, "
            "balanced routing, fastest kernel per row)")
    nearest = ("" if table.exact else
               f" Measured at {table.backend} {table.version}, the newest version at or below "
               f"the priced {table.requested} whose tables time several bf16 MoE shapes.")
    held = (f" Fitted jointly on {f.rows} rows of {f.shapes} MoE shapes (hidden, intermediate, "
            f"experts, top k) at tp 1-32; held out by shape: {100 * f.mape:.1f}% MAPE "
            f"({100 * f.bias:+.1f}% bias).") + nearest

    entry = _fitted_entry(chip, cite, held)
    return [
        entry("moe_fused_floor", f.floor_us, "us_per_layer",
              f"Token-independent time of vLLM's fused MoE layer on {chip} (routing, launches)."),
        entry("moe_fused_weight_rate", f.rate_bytes_per_us, "bytes_per_us",
              f"Rate at which vLLM's fused MoE reads the touched experts' weights on {chip} "
              "(replaces the derated HBM rate for routed weights)."),
        entry("moe_fused_efficiency", f.efficiency, "dimensionless",
              f"Fraction of {chip}'s bf16 peak vLLM's fused MoE GEMMs reach on the routed FLOPs "
              "(replaces the dense GEMM ramp for routed FLOPs)."),
    ]


def report_rows(chip: str, table: OperatorTable, fits: Iterable[AllReduceFit]
                ) -> list[dict[str, Any]]:
    return [{"chip": chip, "family": "all_reduce", "group": f"{f.ranks}rank",
             "table": table.cite(), "version": table.version, "requested": table.requested,
             "held_out_rows": f.held_out, "mape": round(f.mape, 5), "bias": round(f.bias, 5),
             "worst": round(f.worst, 5)} for f in fits]


def write_layer(out: str | Path, sets: list[dict[str, Any]], report: list[dict[str, Any]]) -> Path:
    """Write each set under ``out/coefficients`` and the scores to ``out/fit-report.csv``."""
    root = Path(out)
    (root / "coefficients").mkdir(parents=True, exist_ok=True)
    for s in sets:
        text = yaml.safe_dump(s, sort_keys=False, width=120, allow_unicode=True)
        safe_output.write_text(root / "coefficients" / f"{s['name']}.yaml", text)
    buf = io.StringIO()
    if report:
        w = csv.DictWriter(buf, fieldnames=list(report[0]))
        w.writeheader()
        w.writerows(report)
    safe_output.write_text(root / "fit-report.csv", buf.getvalue())
    return root
