"""Held-out error of every fitted family against the reference's law on the same operator rows
(docs/registry_fit.md): vLLM's all-reduce, decode and prefill attention, GEMM, fused MoE.

    pip download aisimulate==0.13.0.dev202610270000000085 --no-deps -d aisim_wheel
    unzip -q -d aisim aisim_wheel/*.whl
    python benchmarks/registry_fit_scores.py aisim      # prints the markdown tables

"NCCL law" is the registry's max(floor + b/transition, b/peak) all-reduce triple for the
same chip and width (what the reference charges for every TP all-reduce), read at every
graph-mode row; "fitted, held out" is each interior row predicted by the curve refitted
without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(root: str) -> None:
    import polars as pl

    from kernel.model import laws
    from kernel.registry_fit import SYSTEMS, find_table, fit_all_reduce
    from kernel.registry_fit.allreduce import ELEMENT_BYTES, GRAPH_MODE

    reg = Path(__file__).resolve().parents[1] / "data/registry/coefficients"
    doc = yaml.safe_load((reg / "cost-model-collectives.yaml").read_text())
    coeffs = {k: v["value"] for e in doc["coefficients"] for k, v in e.items()}
    print("| chip | table | ranks | rows | NCCL law (reference): MAPE (bias) | "
          "fitted curve, held out: MAPE (bias) | small message: NCCL floor / measured |")
    print("|---|---|---|---|---|---|---|")
    for chip in sorted(SYSTEMS):
        t = find_table(root, chip, "comm", "custom_allreduce_perf", "vllm:0.31.0")
        rows = t.frame.filter(pl.col("backend") == GRAPH_MODE)
        for f in fit_all_reduce(t):
            w = rows.filter(pl.col("num_gpus") == f.ranks)
            b = w["message_size"].to_numpy() * ELEMENT_BYTES
            m = w["latency"].to_numpy() * 1e3
            stem = f"all_reduce_fp16_{f.ranks}rank_{chip.replace('-', '_')}"
            try:
                floor, peak, trans = (coeffs[f"collective_{p}_{stem}"]
                                      for p in ("floor", "peak_rate", "transition_rate"))
            except KeyError:
                ref = "no registry triple"
                small = "–"
            else:
                pred = laws.collective_time(b.astype(np.float64), trans, peak, floor)
                rel = (pred - m) / m
                ref = f"{np.abs(rel).mean():.1%} ({rel.mean():+.1%})"
                small = f"{floor:.1f} / {m[np.argmin(b)]:.1f} µs"
            print(f"| {chip} | {t.system} vllm {t.version} | {f.ranks} | {w.height} | {ref} | "
                  f"{f.mape:.1%} ({f.bias:+.1%}) | {small} |")


def attention(root: str) -> None:
    from kernel.registry_fit import SYSTEMS, find_table
    from kernel.registry_fit.attention import fit_attention_decode, law_error

    reg = Path(__file__).resolve().parents[1] / "data/registry/coefficients"
    doc = yaml.safe_load((reg / "cost-model-attention.yaml").read_text())
    pairs: dict[str, dict[str, float]] = {}
    for e in doc["coefficients"]:
        for k, v in e.items():
            if k in ("attention_decode_floor", "attention_decode_rate") \
                    and len(v.get("scope", {}).get("hardware", [])) == 1:
                pairs.setdefault(v["scope"]["hardware"][0], {})[k] = v["value"]
    print("| chip | table | rows (shapes) | reference floor + bytes/rate, in sample: MAPE (bias) "
          "| fitted floor + per-request + bytes/rate, held out by shape: MAPE (bias) | "
          "floor µs, per request µs, rate GB/s |")
    print("|---|---|---|---|---|---|")
    for chip in sorted(SYSTEMS):
        t = find_table(root, chip, "attention", "generation_attention_perf", "vllm:0.31.0")
        f = fit_attention_decode(t)
        p = pairs.get(chip, {})
        if "attention_decode_floor" in p and "attention_decode_rate" in p:
            m, b = law_error(t, p["attention_decode_floor"], p["attention_decode_rate"])
            ref = f"{m:.1%} ({b:+.1%})"
        else:
            ref = "no registry pair"
        print(f"| {chip} | {t.system} vllm {t.version} | {f.rows:,} ({f.shapes}) | {ref} | "
              f"{f.mape:.1%} ({f.bias:+.1%}) | {f.floor_us:.2f}, {f.per_request_us:.4f}, "
              f"{f.rate_bytes_per_us / 1e3:,.0f} |")


def gemm(root: str) -> None:
    import numpy as np

    from kernel.registry_fit import SYSTEMS, find_table
    from kernel.registry_fit.gemm import fit_gemm, law_error, rows

    base = Path(__file__).resolve().parents[1] / "data"
    doc = yaml.safe_load((base / "registry/coefficients/cost-model-primitives.yaml").read_text())
    coeff: dict[tuple[str, str], float] = {}
    for e in doc["coefficients"]:
        for name, v in e.items():
            for chip in v.get("scope", {}).get("hardware", []):
                coeff[(chip, name)] = v["value"]
    print("| chip | table | dtype | rows (shapes) | reference eps·M/(M+m_half): MAPE (bias) | "
          "refit, held out by shape: MAPE (bias) | refit eps_max, m_half | reference with "
          "HBM: NoOverlap sum / Overlap max, MAPE (bias) |")
    print("|---|---|---|---|---|---|---|---|")
    for chip in sorted(SYSTEMS):
        hw = yaml.safe_load((base / f"catalog/hardware/{chip}.yaml").read_text())
        t = find_table(root, chip, "gemm", "gemm_perf", "vllm:0.31.0")
        for dtype, suffix, peak_key, width in (("bfloat16", "bf16", "TFlopsPeak", 2.0),
                                               ("fp8", "fp8", "TFlopsFP8", 1.0)):
            peak = float(hw.get(peak_key) or 0) * 1e12
            eps = coeff.get((chip, f"gemm_eps_max_{suffix}"))
            mh = coeff.get((chip, f"gemm_m_half_{suffix}"))
            if peak <= 0 or eps is None or mh is None:
                continue
            try:
                f = fit_gemm(t, dtype, peak)
            except ValueError:
                continue
            m, n, k, fp, y = rows(t, dtype, peak)
            ref = law_error(fp, m, y, eps, mh)
            sm = fp / (eps * m / (m + mh))
            derate = coeff.get((chip, "hbm_derate"), 1.0)
            hbm = (m * k * 2.0 + k * n * width + m * n * 2.0) / (
                float(hw["BwPeakTBs"]) * 1e12 * derate) * 1e6
            cells = []
            for pred in (sm + hbm, np.maximum(sm, hbm)):
                rel = pred / y - 1.0
                cells.append(f"{np.mean(np.abs(rel)):.1%} ({np.mean(rel):+.1%})")
            print(f"| {chip} | {t.system} vllm {t.version} | {dtype} | {f.rows:,} ({f.shapes}) | "
                  f"{ref[0]:.1%} ({ref[1]:+.1%}) | {f.mape:.1%} ({f.bias:+.1%}) | "
                  f"{f.eps_max:.3f}, {f.m_half:.0f} | {cells[0]} / {cells[1]} |")


def prefill(root: str) -> None:
    from kernel.registry_fit import SYSTEMS, find_table
    from kernel.registry_fit.attention import fit_attention_prefill, prefill_law_error
    from kernel.registry_fit.run import _catalog_and_ramp

    reg = Path(__file__).resolve().parents[1] / "data/registry/coefficients"
    doc = yaml.safe_load((reg / "cost-model-attention.yaml").read_text())
    pairs: dict[str, dict[str, float]] = {}
    for e in doc["coefficients"]:
        for k, v in e.items():
            if k.startswith("attention_prefill_") and len(v.get("scope", {}).get("hardware",
                                                                               [])) == 1:
                pairs.setdefault(v["scope"]["hardware"][0], {})[k] = v["value"]
    print("| chip | table | rows (shapes) | reference floor + work/(P·ε·s), in sample: MAPE "
          "(bias) | fitted, held out by shape: MAPE (bias) | floor µs, work scale |")
    print("|---|---|---|---|---|---|")
    for chip in sorted(SYSTEMS):
        found = _catalog_and_ramp(chip)
        if found is None:
            print(f"| {chip} | – | – | – | no bf16 GEMM ramp in the registry: not fitted | – |")
            continue
        hw, eps, mh = found
        peak = float(hw["TFlopsPeak"]) * 1e12
        t = find_table(root, chip, "attention", "context_attention_perf", "vllm:0.31.0")
        f = fit_attention_prefill(t, peak, eps, mh)
        p = pairs.get(chip, {})
        if "attention_prefill_floor" in p and p.get("attention_prefill_work_scale"):
            m, b = prefill_law_error(t, peak, eps, mh, p["attention_prefill_floor"],
                                     p["attention_prefill_work_scale"])
            ref = f"{m:.1%} ({b:+.1%})"
        else:  # absent: the work on the dense ramp, no floor (model.md §3.4)
            m, b = prefill_law_error(t, peak, eps, mh, 0.0, 1.0)
            ref = f"{m:.1%} ({b:+.1%}), absent: dense ramp, no floor"
        print(f"| {chip} | {t.system} vllm {t.version} | {f.rows:,} ({f.shapes}) | {ref} | "
              f"{f.mape:.1%} ({f.bias:+.1%}) | {f.floor_us:.2f}, {f.work_scale:.3f} |")


def moe(root: str) -> None:
    """The fused MoE law (decision MF1) against the routed term the kernel prices without it
    (MO1: FLOPs split by tp on the chip's bf16 ramp at the step's tokens, touched bytes at the
    derated HBM rate), and on Mixtral-8x7B's decode rows (8-64 tokens, tp 2-8) held out."""
    import dataclasses

    import polars as pl

    from kernel.registry_fit import SYSTEMS
    from kernel.registry_fit.moe import features, find_moe_table, fit_moe, kernel_law_error
    from kernel.registry_fit.run import _catalog_and_ramp
    print("| chip | table | rows (shapes) | kernel routed term (MO1), in sample: MAPE (bias) | "
          "fitted, held out by shape: MAPE (bias) | floor µs, rate TB/s, efficiency | "
          "Mixtral-8x7B decode rows, kernel / fitted held out: MAPE (bias) |")
    print("|---|---|---|---|---|---|---|")
    for chip in sorted(SYSTEMS):
        try:
            t = find_moe_table(root, chip, "vllm:0.31.0")
        except ValueError:
            print(f"| {chip} | – | – | – | no bf16 MoE rows in the tables: not fitted | – | – |")
            continue
        found = _catalog_and_ramp(chip)
        hw = found[0] if found else yaml.safe_load(
            (Path(__file__).resolve().parents[1] / f"data/catalog/hardware/{chip}.yaml")
            .read_text())
        peak = float(hw["TFlopsPeak"]) * 1e12
        hbm = float(hw["BwPeakTBs"]) * 1e12 * 0.8  # the registry's hbm_derate on every chip
        f = fit_moe(t, peak)
        ref = "no bf16 ramp" if found is None else "{:.1%} ({:+.1%})".format(
            *kernel_law_error(t, peak, found[1], found[2], hbm))
        mix = (pl.col("hidden_size") == 4096) & (pl.col("inter_size") == 14336)
        held = fit_moe(dataclasses.replace(t, frame=t.frame.filter(~mix)), peak)
        rows = dataclasses.replace(t, frame=t.frame.filter(
            mix & pl.col("num_tokens").is_between(8, 64) & pl.col("moe_tp_size").is_between(2, 8)))
        x = features(rows.frame.filter((pl.col("moe_dtype") == "bfloat16")
                                       & (pl.col("moe_ep_size") == 1)
                                       & (pl.col("distribution") == "balanced"))
                     .group_by(["hidden_size", "inter_size", "num_experts", "topk",
                                "moe_tp_size", "num_tokens"]).agg(pl.col("latency").min()))
        pred = (held.floor_us + x["bytes"] / held.rate_bytes_per_us
                + x["flops"] / (peak * held.efficiency) * 1e6)
        rel = pred / x["us"] - 1
        kmix = "–" if found is None else "{:.1%} ({:+.1%})".format(
            *kernel_law_error(rows, peak, found[1], found[2], hbm))
        print(f"| {chip} | {t.system} vllm {t.version} | {f.rows:,} ({f.shapes}) | {ref} | "
              f"{f.mape:.1%} ({f.bias:+.1%}) | {f.floor_us:.1f}, "
              f"{f.rate_bytes_per_us / 1e6:.2f}, {f.efficiency:.3f} | {kmix} / "
              f"{np.mean(np.abs(rel)):.1%} ({np.mean(rel):+.1%}) |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "aisim")
    print()
    attention(sys.argv[1] if len(sys.argv) > 1 else "aisim")
    print()
    prefill(sys.argv[1] if len(sys.argv) > 1 else "aisim")
    print()
    gemm(sys.argv[1] if len(sys.argv) > 1 else "aisim")
    print()
    moe(sys.argv[1] if len(sys.argv) > 1 else "aisim")
