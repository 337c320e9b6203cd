"""The accuracy tables of docs/accuracy.md, recomputed: every measured dataset we can price,
priced three ways (NoOverlap, Overlap, calibrated on held-out folds).

    python benchmarks/accuracy.py            # prints the markdown tables

SplitwiseSim's profile (``data/measurements/splitwise``) is priced on its scenarios; the
calibrated column scores each step with a calibration fitted without its configuration
(leave one TP out, per hardware), and, separately, a calibration fitted on TP 2 and 4 scores
TP 8. Same numbers as ``blis-kernel price … --measured`` and ``blis-kernel calibrate …
--fold-by config`` (the commands are in docs/accuracy.md). Last, one calibration per
(hardware, TP), fitted on half the configurations and scored on the other half (issue 32;
``blis-kernel calibrate … --split shape:0.5``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cell(rel: np.ndarray) -> str:
    if rel.size == 0:
        return "–"
    return f"{np.abs(rel).mean():.1%} ({rel.mean():+.1%})"


def main() -> None:
    import kernel
    from kernel.calibration.accuracy import relative_error
    from kernel.calibration.fit import fit
    from kernel.calibration.splitwise import price_splitwise
    from kernel.model.calibration_law import TERMS, calibrated_ns

    p = price_splitwise(repos=kernel.Repos(pricing="reference"))  # the reference's terms
    held = np.zeros(p.height, np.int64)
    for hw in p["hardware"].unique().sort().to_list():
        sel = (p["hardware"] == hw).to_numpy()
        sub = p.filter(pl.Series(sel))
        r = fit(sub, folds=3, groups=sub["config"].to_numpy(), fold_by="config")
        assert r.held_out_predictions is not None
        held[sel] = r.held_out_predictions
    p = p.with_columns(pl.Series("held_out_ns", held))
    print("| hardware | TP | phase | steps | NoOverlap MAPE (bias) | Overlap MAPE (bias) | "
          "calibrated, TP held out: MAPE (bias) |")
    print("|---|---|---|---|---|---|---|")
    groups: list[tuple[str, str, str, pl.Expr]] = []
    for hw in p["hardware"].unique().sort().to_list():
        for tp in ("all", 2, 4, 8):
            for phase in ("all", "prefill", "decode"):
                e = pl.col("hardware") == hw
                if tp != "all":
                    e &= pl.col("tp") == tp
                if phase != "all":
                    e &= pl.col("phase") == phase
                groups.append((hw, str(tp), phase, e))
    groups.append(("all", "all", "all", pl.lit(True)))
    for hw, tp, phase, e in groups:
        s = p.filter(e)
        m = s["measured_ns"].to_numpy()
        print(f"| {hw} | {tp} | {phase} | {s.height:,} | "
              f"{_cell(relative_error(s['no_overlap_ns'].to_numpy(), m))} | "
              f"{_cell(relative_error(s['overlap_ns'].to_numpy(), m))} | "
              f"{_cell(relative_error(s['held_out_ns'].to_numpy(), m))} |")
    print()
    print("| hardware | TP 8 steps | NoOverlap MAPE (bias) | Overlap MAPE (bias) | "
          "calibrated on TP 2+4: MAPE (bias) |")
    print("|---|---|---|---|---|")
    for hw in p["hardware"].unique().sort().to_list():
        sub = p.filter(pl.col("hardware") == hw)
        train, test = sub.filter(pl.col("tp") < 8), sub.filter(pl.col("tp") == 8)
        law = fit(train, folds=0).law
        pred = calibrated_ns(law, [test[f"{t}_ns"].to_numpy() for t in TERMS],
                             test["prefill_requests"].to_numpy(),
                             test["decode_requests"].to_numpy(), test["overlap_ns"].to_numpy())
        m = test["measured_ns"].to_numpy()
        print(f"| {hw} | {test.height:,} | "
              f"{_cell(relative_error(test['no_overlap_ns'].to_numpy(), m))} | "
              f"{_cell(relative_error(test['overlap_ns'].to_numpy(), m))} | "
              f"{_cell(relative_error(pred, m))} |")

    per_deployment(p)


def per_deployment(p: pl.DataFrame) -> None:
    """Issue 32: one calibration per (hardware, TP), fitted on half the sweep's
    configurations (``shape``: prompt, batch, tokens; a deterministic hash split) and scored
    on the other half, from both starts."""
    from kernel.calibration.fit import fit
    from kernel.calibration.make import split_mask

    print()
    print("| hardware | TP | fitted / scored steps | start kept | NoOverlap MAPE (bias) | "
          "Overlap MAPE (bias) | calibrated from NoOverlap | calibrated from Overlap | "
          "calibrated, prefill | calibrated, decode | p90 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (hw, tp), sub in p.sort(["hardware", "tp"]).group_by(["hardware", "tp"],
                                                              maintain_order=True):
        held = split_mask(sub["shape"].to_numpy(), 0.5)
        train, test = sub.filter(~pl.Series(held)), sub.filter(pl.Series(held))
        r = fit(train, holdout=test)
        s = r.starts

        def cell(x: object) -> str:
            return f"{x.mape:.1%} ({x.bias:+.1%})"  # type: ignore[attr-defined]

        mine = s[r.law.start]["calibrated"]
        print(f"| {hw} | {tp} | {train.height} / {test.height} | {r.law.start} | "
              f"{cell(s['no_overlap']['uncalibrated']['all'])} | "
              f"{cell(s['overlap']['uncalibrated']['all'])} | "
              f"{cell(s['no_overlap']['calibrated']['all'])} | "
              f"{cell(s['overlap']['calibrated']['all'])} | {cell(mine['prefill'])} | "
              f"{cell(mine['decode'])} | {mine['all'].p90:.1%} |")
        assert r.improved, (hw, tp, r.warning)


if __name__ == "__main__":
    main()
