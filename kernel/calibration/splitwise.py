"""SplitwiseSim's profiled iteration times as a measured trace (``data/measurements/splitwise``).

Each row of ``perf_model.csv`` is a static batch of ``batch_size`` identical requests with
``prompt_size`` prompt tokens generating ``token_size`` tokens, with the measured prefill
iteration (``prompt_time``) and the mean decode iteration (``token_time``), in ms. Each row
becomes two steps:

* prefill: ``batch_size`` requests, scheduled = prompt_size, computed = 0;
* decode: ``batch_size`` requests, scheduled = 1, computed = prompt_size + token_size // 2 − 1
  (the file gives the mean over the generation, so the mean context, prompt + tokens/2).

Repeats are kept as separate steps. A static batch's step cannot get faster as the batch
grows with everything else equal, so a configuration whose mean measured time is more than 2%
below that of a smaller batch of the same (configuration, phase, prompt, tokens) series is
marked ``suspect`` (in this file: the TP 2 batch-64 rows, whose prefill is 3–8× faster than
batch 32's) and left out unless asked for. Only Llama-2-70B has a catalog model; the power-capped
H100 rows are priced as H100 (the kernel has no power model) and keep their own
configuration label. Scenarios are ``data/measurements/splitwise/scenarios/
llama-2-70b-{a100-sxm,h100}-tp{2,4,8}.yaml`` (DGX-A100 is SXM: the catalog's ``a100-sxm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kernel.bulk import price
from pipeline.resources import data_dir

from ..facade.factory import open as open_kernel
from ..io.measured import to_ns

__all__ = ["CHIPS", "MODELS", "scenario_path", "splitwise_dir", "splitwise_trace",
           "price_splitwise"]

CHIPS = {"a100-80gb": "a100-sxm", "h100-80gb": "h100", "h100-80gb-pcap": "h100"}
MODELS = {"llama2-70b": "llama-2-70b"}


def splitwise_dir() -> Path:
    return data_dir() / "measurements" / "splitwise"


def scenario_path(hardware: str, tp: int, model: str = "llama2-70b") -> Path:
    return splitwise_dir() / "scenarios" / f"{MODELS[model]}-{CHIPS[hardware]}-tp{tp}.yaml"


def splitwise_trace(csv: str | Path | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(request rows, per-batch table) for every row we can price.

    Request rows: batch_id, scheduled, computed, prompt_len. Per-batch table: batch_id,
    measured_ms, phase (prefill/decode), config (``<hardware>-tp<N>``), hardware, tp,
    scenario (path), prompt_size, batch_size, token_size, shape (``p<prompt>-b<batch>-t<tokens>``:
    one configuration of the sweep, shared by its repeats and by its prefill and decode steps),
    source_row.
    """
    path = Path(csv) if csv else splitwise_dir() / "perf_model.csv"
    raw = pl.read_csv(path)
    raw = raw.with_row_index("source_row").filter(pl.col("model").is_in(list(MODELS)))
    n = raw.height
    bid = np.arange(2 * n, dtype=np.int64)  # 2i prefill, 2i+1 decode of source row i
    prompt = raw["prompt_size"].to_numpy().astype(np.int64)
    bs = raw["batch_size"].to_numpy().astype(np.int64)
    tok = raw["token_size"].to_numpy().astype(np.int64)
    per_batch = np.repeat(bs, 2)
    rows_bid = np.repeat(bid, per_batch)
    is_pre = (rows_bid % 2) == 0
    src = rows_bid // 2
    scheduled = np.where(is_pre, prompt[src], 1)
    computed = np.where(is_pre, 0, prompt[src] + tok[src] // 2 - 1)
    requests = pl.DataFrame({"batch_id": rows_bid, "scheduled": scheduled,
                             "computed": computed, "prompt_len": prompt[src]})
    hw = raw["hardware"].to_list()
    tp = raw["tensor_parallel"].to_list()
    model = raw["model"].to_list()
    batches = pl.DataFrame({
        "batch_id": bid,
        "measured_ms": np.column_stack([raw["prompt_time"].to_numpy(),
                                        raw["token_time"].to_numpy()]).reshape(-1),
        "phase": ["prefill", "decode"] * n,
        "config": [f"{h}-tp{t}" for h, t in zip(hw, tp, strict=True) for _ in (0, 1)],
        "hardware": [h for h in hw for _ in (0, 1)],
        "chip": [CHIPS[h] for h in hw for _ in (0, 1)],
        "tp": np.repeat(np.asarray(tp, np.int64), 2),
        "scenario": [str(scenario_path(h, t, m)) for h, t, m in zip(hw, tp, model, strict=True)
                     for _ in (0, 1)],
        "prompt_size": np.repeat(prompt, 2), "batch_size": np.repeat(bs, 2),
        "token_size": np.repeat(tok, 2),
        "shape": [f"p{a}-b{b}-t{c}" for a, b, c in zip(prompt, bs, tok, strict=True)
                  for _ in (0, 1)],
        "source_row": np.repeat(raw["source_row"].to_numpy().astype(np.int64), 2),
    })
    series = ["config", "phase", "prompt_size", "token_size"]
    means = (batches.group_by([*series, "batch_size"])
             .agg(pl.col("measured_ms").mean().alias("_mean"))
             .sort([*series, "batch_size"])
             .with_columns(pl.col("_mean").cum_max().shift(1).over(series).alias("_prev")))
    means = means.with_columns(
        (pl.col("_prev").is_not_null() & (pl.col("_mean") < 0.98 * pl.col("_prev")))
        .alias("suspect"))
    batches = batches.join(means.select([*series, "batch_size", "suspect"]),
                           on=[*series, "batch_size"], how="left").sort("batch_id")
    return requests, batches


def price_splitwise(csv: str | Path | None = None, *, keep_suspect: bool = False,
                    repos: Any = None) -> pl.DataFrame:
    """Every Splitwise step priced on its scenario, with ``measured_ns`` and the per-batch
    labels joined on (one kernel per scenario; ``repos`` a ``Repos``, e.g. the
    reference's pricing)."""



    requests, batches = splitwise_trace(csv)
    if not keep_suspect:
        batches = batches.filter(~pl.col("suspect"))
    parts = []
    for scen, sub in batches.group_by("scenario", maintain_order=True):
        ids = sub["batch_id"]
        k = open_kernel(str(scen[0]), repos)
        priced = price(k, requests.filter(pl.col("batch_id").is_in(ids.implode())))
        parts.append(priced.join(sub, on="batch_id", how="left"))
    out = pl.concat(parts).sort("batch_id")
    ns, _ = to_ns(out["measured_ms"].to_numpy(), "ms")
    return out.with_columns(pl.Series("measured_ns", ns))
