"""``registry fit``: every family the tables hold for one chip, written as a registry layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.load import Repos

from . import layer
from .allreduce import fit_all_reduce
from .attention import fit_attention_decode, fit_attention_prefill
from .gemm import fit_gemm
from .moe import find_moe_table, fit_moe, kernel_law_error
from .moe import report as moe_report
from .tables import find_table

# family -> (table directory, table name); more families add rows here.
FAMILIES = {"all_reduce": ("comm", "custom_allreduce_perf"),
            "attention_decode": ("attention", "generation_attention_perf"),
            "gemm": ("gemm", "gemm_perf"),
            "attention_prefill": ("attention", "context_attention_perf"),
            "moe": ("moe", "moe_perf")}
# GEMM dtypes scored, with the chip's catalog peak that prices each (decision AC8: GEMM is
# fitted and scored into fit-report.csv, but no set is written).
GEMM_DTYPES = (("bfloat16", "TFlopsPeak"), ("fp8", "TFlopsFP8"))


def fit_chip(root: str | Path, chip: str, engine: str, families: list[str] | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The coefficient sets and held-out scores for ``chip`` from the tables under ``root``
    (every family by default; a family named in ``families`` whose table is absent is an
    error, one not named is skipped when absent)."""
    sets, report = [], []
    family_dir, table_name = FAMILIES["all_reduce"]
    table = find_table(root, chip, family_dir, table_name, engine)
    fits = fit_all_reduce(table)
    sets.append(layer.all_reduce_set(chip, table, fits))
    report.extend(layer.report_rows(chip, table, fits))
    family_dir, table_name = FAMILIES["attention_decode"]
    if families is None or "attention_decode" in families:
        try:
            table = find_table(root, chip, family_dir, table_name, engine)
        except ValueError:
            if families is not None:
                raise
        else:
            f = fit_attention_decode(table)
            sets.append(layer.attention_decode_set(chip, table, f))
            report.append(layer.attention_report(chip, table, f))
    if families is None or "gemm" in families:
        report.extend(_gemm_scores(root, chip, engine, required=families is not None))
    if families is None or "attention_prefill" in families:
        prefill = _prefill(root, chip, engine, required=families is not None)
        if prefill is not None:
            sets.append(prefill[0])
            report.append(prefill[1])
    moe = (_moe(root, chip, engine, required=families is not None)
           if families is None or "moe" in families else None)
    if moe is None:
        sets.append(layer.moe_engine_set(chip, engine))
    else:
        table, fit = moe
        row = moe_report(chip, table, fit)
        kernel_mape = _kernel_moe_mape(chip, table, fit)
        if kernel_mape is not None and fit.mape >= kernel_mape:
            # decision MF1: shipped only where held out it beats the routed term it replaces
            sets.append(layer.moe_engine_set(chip, engine))
            row["group"] += f" not shipped: kernel law {100 * kernel_mape:.1f}% in sample"
        else:
            sets.append(layer.moe_engine_set(chip, engine, table, fit))
        report.append(row)
    return sets, report


def _kernel_moe_mape(chip: str, table: Any, fit: Any) -> float | None:
    """MAPE of the routed term the kernel prices without the fused law (the chip's bf16 ramp,
    touched bytes at the derated HBM rate) on the fit's rows; None without a bf16 ramp."""
    found = _catalog_and_ramp(chip)
    if found is None:
        return None
    hw, eps, m_half = found
    doc = yaml.safe_load((Repos().registry_root() / "coefficients" /
                          "cost-model-primitives.yaml").read_text())
    derate = [float(v["value"]) for e in doc["coefficients"] for k, v in e.items()
              if k == "hbm_derate" and chip in (v.get("scope") or {}).get("hardware", [])]
    if not derate:
        return None
    peak = float(hw["TFlopsPeak"]) * 1e12
    return kernel_law_error(table, peak, eps, m_half, float(hw["BwPeakTBs"]) * 1e12 * derate[0])[0]


def _moe(root: str | Path, chip: str, engine: str, required: bool) -> tuple[Any, Any] | None:
    """The chip's MoE table and fitted fused MoE law (decision MF1), or None where the tables
    hold no usable rows (a100-sxm: no bf16 MoE rows) or the catalog no bf16 peak."""
    try:
        table = find_moe_table(root, chip, engine)
    except ValueError:
        if required:
            raise
        return None
    hw = yaml.safe_load(Repos().catalog_file(f"hardware/{chip}.yaml").read_text()) or {}
    peak = float(hw.get("TFlopsPeak") or 0.0) * 1e12
    if peak <= 0:
        if required:
            raise ValueError(f"{chip}: the fused MoE law needs the chip's bf16 peak "
                             "(TFlopsPeak in the catalog)")
        return None
    return table, fit_moe(table, peak)


def _catalog_and_ramp(chip: str) -> tuple[dict[str, Any], float, float] | None:
    """The chip's catalog entry and its bf16 GEMM ramp (eps_max, m_half) from the embedded
    registry: the prefill term is priced at that ramp (model.md §3.4)."""
    import yaml  # (heavy: PyYAML, loaded only on this path)


    repos = Repos()
    hw = yaml.safe_load(repos.catalog_file(f"hardware/{chip}.yaml").read_text()) or {}
    doc = yaml.safe_load((repos.registry_root() / "coefficients" /
                          "cost-model-primitives.yaml").read_text())
    ramp: dict[str, float] = {}
    for e in doc["coefficients"]:
        for name, v in e.items():
            if chip in (v.get("scope") or {}).get("hardware", []):
                ramp[name] = float(v["value"])
    if "gemm_eps_max_bf16" not in ramp or "gemm_m_half_bf16" not in ramp:
        return None
    return hw, ramp["gemm_eps_max_bf16"], ramp["gemm_m_half_bf16"]


def _prefill(root: str | Path, chip: str, engine: str, required: bool
             ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    family_dir, table_name = FAMILIES["attention_prefill"]
    try:
        table = find_table(root, chip, family_dir, table_name, engine)
    except ValueError:
        if required:
            raise
        return None
    found = _catalog_and_ramp(chip)
    peak = float((found[0] if found else {}).get("TFlopsPeak") or 0.0) * 1e12
    if found is None or peak <= 0:
        if required:
            raise ValueError(f"{chip}: the prefill term needs the chip's bf16 peak and GEMM "
                             "ramp (gemm_eps_max_bf16, gemm_m_half_bf16); the embedded "
                             "catalog and registry do not hold them")
        return None
    f = fit_attention_prefill(table, peak, found[1], found[2])
    return layer.attention_prefill_set(chip, table, f), layer.prefill_report(chip, table, f)

def _gemm_scores(root: str | Path, chip: str, engine: str, required: bool
                 ) -> list[dict[str, Any]]:
    import yaml  # (heavy: PyYAML, loaded only on this path)


    family_dir, table_name = FAMILIES["gemm"]
    try:
        table = find_table(root, chip, family_dir, table_name, engine)
    except ValueError:
        if required:
            raise
        return []
    hw = yaml.safe_load(Repos().catalog_file(f"hardware/{chip}.yaml").read_text()) or {}
    out = []
    for dtype, peak_key in GEMM_DTYPES:
        peak = float(hw.get(peak_key) or 0.0) * 1e12
        if peak <= 0:
            continue
        try:
            f = fit_gemm(table, dtype, peak)
        except ValueError:
            continue
        out.append({"chip": chip, "family": f"gemm_{dtype}", "group": f"{f.shapes}shapes",
                    "table": table.cite(), "version": table.version,
                    "requested": table.requested, "held_out_rows": f.rows,
                    "mape": round(f.mape, 5), "bias": round(f.bias, 5), "worst": None})
    return out


def fit_layer(root: str | Path, chips: list[str], engine: str, out: str | Path) -> Path:
    """Fit every chip in ``chips`` and write one layer under ``out``."""
    sets, report = [], []
    for chip in chips:
        s, r = fit_chip(root, chip, engine)
        sets.extend(s)
        report.extend(r)
    return layer.write_layer(out, sets, report)
