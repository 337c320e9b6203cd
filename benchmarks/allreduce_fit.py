"""Held-out error of the fitted all-reduce curves against the reference's NCCL law, on vLLM's
own all-reduce rows (docs/registry_fit.md).

    pip download aisimulate==0.13.0.dev202610270000000085 --no-deps -d /tmp/aisim_wheel
    (cd /tmp/aisim && unzip -q /tmp/aisim_wheel/*.whl)
    python benchmarks/allreduce_fit.py /tmp/aisim      # prints the markdown table

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

    from kernel import laws
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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/aisim")
