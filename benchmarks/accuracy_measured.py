"""Issue 34's before/after tables (docs/accuracy.md, "Accurate on modern vLLM"): every
measured Splitwise step priced uncalibrated under the reference's coefficients
(``Repos(pricing="reference")``) and under the default measured layer, MAPE and signed bias
by hardware, phase and TP.

    python benchmarks/accuracy_measured.py          # prints the markdown tables
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def price_all(pricing: str) -> pl.DataFrame:
    """Every kept Splitwise step priced with ``Repos(pricing=pricing)``."""
    import kernel
    from kernel.bulk import price
    from kernel.calibration.splitwise import splitwise_trace
    from kernel.io.measured import to_ns

    requests, batches = splitwise_trace()
    batches = batches.filter(~pl.col("suspect"))
    parts = []
    for scen, sub in batches.group_by("scenario", maintain_order=True):
        k = kernel.open(str(scen[0]), kernel.Repos(pricing=pricing))
        priced = price(k, requests.filter(pl.col("batch_id").is_in(sub["batch_id"].implode())))
        parts.append(priced.join(sub, on="batch_id", how="left"))
    out = pl.concat(parts).sort("batch_id")
    ns, _ = to_ns(out["measured_ms"].to_numpy(), "ms")
    return out.with_columns(pl.Series("measured_ns", ns))


def cell(est: np.ndarray, measured: np.ndarray) -> str:
    if measured.size == 0:
        return "–"
    rel = (est.astype(np.float64) - measured) / measured
    return f"{np.abs(rel).mean():.1%} ({rel.mean():+.1%})"


def main() -> None:
    ref, new = price_all("reference"), price_all("measured")
    print("| hardware | TP | phase | steps | reference NoOverlap | reference Overlap | "
          "measured NoOverlap | measured Overlap |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [("all", "all", "all")]
    for hw in ref["hardware"].unique().sort().to_list():
        for tp in ("all", 2, 4, 8):
            for phase in ("all", "prefill", "decode"):
                rows.append((hw, str(tp), phase))
    for hw, tp, phase in rows:
        e = pl.lit(True)
        if hw != "all":
            e &= pl.col("hardware") == hw
        if tp != "all":
            e &= pl.col("tp") == int(tp)
        if phase != "all":
            e &= pl.col("phase") == phase
        a, b = ref.filter(e), new.filter(e)
        m = a["measured_ns"].to_numpy()
        print(f"| {hw} | {tp} | {phase} | {a.height:,} | "
              f"{cell(a['no_overlap_ns'].to_numpy(), m)} | {cell(a['overlap_ns'].to_numpy(), m)} | "
              f"{cell(b['no_overlap_ns'].to_numpy(), m)} | {cell(b['overlap_ns'].to_numpy(), m)} |")


if __name__ == "__main__":
    main()
