"""Mixtral decode, term by term: one all-decode step at each measured stage's concurrency,
priced three ways, against the stage's measured ITL (the sim-to-real study, issue 34).

    python benchmarks/moe_decode.py
    python benchmarks/moe_decode.py --moe-table aisim/aisimulate_core/systems/data/h100_sxm/moe/vllm/0.31.0/moe_perf.parquet

Concurrency is Little's law on the measured stage: rate x (TTFT + output tokens x ITL), with
TTFT taken as 60 ms (the measured whole-run TTFTs of the stages that do not queue are
54-69 ms); every request is at half its output (context = prompt + output / 2). The step
price plus the kernel's output-token overhead is what one inter-token latency costs at low
load (docs/replay.md); the mixed steps where prompts are chunked in are left out, so this is a
lower bound of the replay's ITL.

Pricings: "reference" (Repos(pricing="reference")), "measured w/o MO1" (the measured layer
without its vllm-moe set: the state before decision MO1), "MO1 only" (the vllm-moe set with
the tp split only: the state before decision MF1), "measured" (the default: MO1 and the fused
MoE law fitted from vLLM's MoE operator rows, MF1).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernel  # noqa: E402
from kernel.model import step  # noqa: E402
from pipeline.resources import data_dir  # noqa: E402

SCEN = data_dir() / "measurements" / "simtoreal" / "scenarios"
LAYER = data_dir() / "registry" / "layers" / "vllm-0.31.0" / "coefficients"
# workload: (prompt tokens, output tokens, stage rates req/s) from data/measurements/simtoreal
WORKLOADS = {"general": (547, 248, (8.0, 20.0)), "codegen": (566, 247, (5.0, 10.0)),
             "roleplay": (750, 251, (6.0,)), "general-lite": (547, 248, (2.5, 6.0)),
             "reasoning-lite": (1034, 1448, (1.0,))}
# exp -> (scenario file stem, workload, measured ITL ms per stage)
EXPERIMENTS = {
    27: ("mixtral-8x7b-v0.1-h100-tp2-mbt1024-gmu90", "general-lite", (16.375, 18.737)),
    10: ("mixtral-8x7b-v0.1-h100-tp2-mbt2048-gmu90", "codegen", (18.435, 19.361)),
    11: ("mixtral-8x7b-v0.1-h100-tp2-mbt2048-gmu90", "roleplay", (18.728,)),
    9: ("mixtral-8x7b-v0.1-h100-tp2-mbt2048-gmu90", "general", (19.377, 20.719)),
    31: ("mixtral-8x7b-v0.1-h100-tp4-mbt2048-gmu90", "general", (10.318, 11.630)),
    50: ("mixtral-8x22b-instruct-v0.1-h100-tp8-mbt2048-gmu90", "codegen", (17.965, 17.698)),
    51: ("mixtral-8x22b-instruct-v0.1-h100-tp8-mbt2048-gmu90", "roleplay", (17.760,)),
    53: ("mixtral-8x22b-v0.1-h100-tp8-mbt2048-gmu90", "reasoning-lite", (18.207,)),
    49: ("mixtral-8x22b-instruct-v0.1-h100-tp8-mbt2048-gmu90", "general", (17.806, 19.791)),
}
TTFT_S = 0.060


def _without_moe_layer(tmp: Path) -> kernel.Repos:
    where = tmp / "coefficients"
    where.mkdir(parents=True)
    for f in LAYER.glob("*.yaml"):
        if not f.name.startswith("vllm-moe-"):
            (where / f.name).write_text(f.read_text())
    return kernel.Repos(layer=str(tmp))


def _mo1_only(tmp: Path) -> kernel.Repos:
    """The measured layer with its vllm-moe sets as decision MO1 left them (the tp split only,
    without the fused MoE law of decision MF1)."""
    import yaml

    from kernel.registry_fit.layer import moe_engine_set
    where = tmp / "coefficients"
    where.mkdir(parents=True)
    for f in LAYER.glob("*.yaml"):
        text = f.read_text()
        if f.name.startswith("vllm-moe-"):
            chip = f.stem.removeprefix("vllm-moe-")
            text = yaml.safe_dump(moe_engine_set(chip, "vllm:0.31.0"), sort_keys=False)
        (where / f.name).write_text(text)
    return kernel.Repos(layer=str(tmp))


def score_moe_table(path: str) -> None:
    """The routed-expert law against vLLM's MoE operator rows (balanced routing, no expert
    parallelism, 1-512 tokens, fastest kernel per row): the reference's undivided FLOPs summed
    with the weight read, the FLOPs split by tp summed, and the larger of split FLOPs and read.
    Ramp (eps_max, m_half) and HBM rate are the H100 pool's as resolved; the peak is the fp8
    one the table's fp8-block rows run at (1,979 TFLOP/s, H100 SXM)."""
    import polars as pl
    import pyarrow.parquet as pq

    from kernel.model import laws
    r = kernel.open(str(SCEN / f"simtoreal-{EXPERIMENTS[27][0]}.yaml")).resolved_pool
    c = r.coefficients
    peak = 1979e12
    t = pl.from_arrow(pq.read_table(path))
    t = t.filter((pl.col("distribution") == "balanced") & (pl.col("moe_ep_size") == 1)
                 & (pl.col("num_tokens") <= 512))
    t = t.group_by(["moe_tp_size", "num_tokens", "hidden_size", "inter_size", "topk",
                    "num_experts"]).agg(pl.col("latency").min()).sort(["moe_tp_size", "num_tokens"])
    errs: dict[int, list[tuple[float, float, float]]] = {}
    for tp, tokens, h, inter, k, n_exp, ms in t.iter_rows():
        wbytes = 3 * h * inter / tp  # fp8: one byte a weight, a tp slice of each expert
        hbm = wbytes * laws.experts_touched(tokens, n_exp, k, n_exp) / c.hbm_bps
        sm_ref = tokens * k * 2 * 3 * h * inter / (peak * laws.efficiency(tokens, c.eps_max,
                                                                          c.m_half))
        meas = ms / 1e3
        errs.setdefault(tp, []).append(((hbm + sm_ref) / meas - 1, (hbm + sm_ref / tp) / meas - 1,
                                        max(hbm, sm_ref / tp) / meas - 1))
    print("| tp | rows | reference sum | split sum | split max |")
    print("|---|---|---|---|---|")
    for tp, e in sorted(errs.items()):
        cells = [f"{100 * sum(abs(x[i]) for x in e) / len(e):.1f}% "
                 f"({100 * sum(x[i] for x in e) / len(e):+.1f}%)" for i in range(3)]
        print(f"| {tp} | {len(e)} | " + " | ".join(cells) + " |")


def main() -> None:
    if "--moe-table" in sys.argv:
        score_moe_table(sys.argv[sys.argv.index("--moe-table") + 1])
        return
    tmp = Path(tempfile.mkdtemp())
    pricings = {"reference": kernel.Repos(pricing="reference"),
                "measured w/o MO1": _without_moe_layer(tmp / "none"),
                "MO1 only": _mo1_only(tmp / "mo1"), "measured": None}
    print("| exp | model, TP | stage rate | requests | measured ITL | pricing | routed SM | "
          "routed HBM | SM | HBM | NVLink | host | Overlap + otok | NoOverlap + otok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for exp, (stem, work, itls) in EXPERIMENTS.items():
        prompt, out, rates = WORKLOADS[work]
        scen = str(SCEN / f"simtoreal-{stem}.yaml")
        kernels = {name: kernel.open(scen, repos) for name, repos in pricings.items()}
        for rate, itl in zip(rates, itls, strict=True):
            n = max(1, round(rate * (TTFT_S + out * itl / 1000)))
            batch = kernel.Batch([kernel.Request(1, prompt + out // 2)] * n)
            for name, k in kernels.items():
                e = k.step_time(batch)
                rows = step.layer_breakdown(k.resolved_pool, batch)
                rsm = sum(r["routed_sm"] * r["count"] for r in rows) * 1e3
                rhbm = sum(r["routed_hbm"] * r["count"] for r in rows) * 1e3
                per = {r.value: v / 1e6 for r, v in e.per_resource.items()}
                otok = k.output_token_overhead() / 1e6
                ov, no = e.overlap / 1e6 + otok, e.no_overlap / 1e6 + otok
                print(f"| {exp} | {stem.split('-h100')[0]}, {stem.split('-tp')[1][0]} | "
                      f"{rate:g} | {n} | {itl:.1f} | {name} | {rsm:.2f} | {rhbm:.2f} | "
                      f"{per.get('sm', 0):.2f} | {per.get('hbm', 0):.2f} | "
                      f"{per.get('nvlink', 0):.2f} | {per.get('host', 0):.2f} | "
                      f"{ov:.2f} ({100 * (ov - itl) / itl:+.0f}%) | "
                      f"{no:.2f} ({100 * (no - itl) / itl:+.0f}%) |")


if __name__ == "__main__":
    main()
