"""``blis-kernel replay REQUESTS --scenario S -o OUT_DIR``: a serving replay.

REQUESTS is a request file (any source ``kernel.replay.read_requests`` reads) or a load spec
(``kernel.replay.generate``); writes requests.parquet, steps.parquet, engine_steps.parquet,
rejects.parquet and summary.json/.parquet under OUT_DIR (stamped) and prints the summary.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from kernel.cli.common import make_repos, with_repos

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)?\s*$")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def parse_slo(text: str | None) -> dict[str, float] | None:
    """``ttft=2s,itl=50ms`` → {"ttft": 2.0, "itl": 0.05} (seconds; a bare number is seconds)."""
    if not text:
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        m = _DURATION.match(value)
        if not sep or not key or m is None or float(m.group(1)) <= 0:
            raise click.BadParameter(
                f"{part.strip()!r}: expected KEY=DURATION with KEY one of ttft, itl, tpot, e2e "
                f"and DURATION a positive number with an optional unit ns, us, ms or s "
                f"(e.g. ttft=2s,itl=50ms)", param_hint="--slo")
        if key not in ("ttft", "itl", "tpot", "e2e"):
            raise click.BadParameter(f"unknown SLO {key!r}; allowed: ttft, itl, tpot, e2e",
                                     param_hint="--slo")
        out[key] = float(m.group(1)) * _UNIT[m.group(2)]
    return out


def load_requests(source: str, arrival_unit: str, seed: int, max_model_len: int | None
                  ) -> Any:
    """A RequestSet from a file (read_requests) or a load spec (generate)."""
    import importlib

    def find(module: str, name: str) -> Any:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None

    read = find("kernel.replay", "read_requests") or find("kernel.replay.formats",
                                                          "read_requests")
    generate = find("kernel.replay", "generate") or find("kernel.replay.loads", "generate")
    if Path(source).exists():
        if read is None:  # the request sources are not merged: parquet/CSV in the contract
            return _contract_table(source, arrival_unit)
        return read(source, arrival_unit=arrival_unit, max_model_len=max_model_len)
    if "=" not in source:
        raise click.BadParameter(f"{source}: no such file, and not a load spec (key=value "
                                 f"pairs such as rate=8,duration=60)", param_hint="REQUESTS")
    if generate is None:
        raise click.BadParameter(f"{source}: no such file (a load spec needs the request "
                                 f"sources of kernel.replay)", param_hint="REQUESTS")
    return generate(source, seed=seed)


def _contract_table(source: str, arrival_unit: str) -> Any:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(source)
    table = pacsv.read_csv(path) if path.suffix.lower() in (".csv", ".tsv") else pq.read_table(
        path)
    if "arrival_ns" not in table.column_names:
        if "arrival" not in table.column_names:
            raise click.BadParameter(f"{source}: needs an arrival_ns or arrival column",
                                     param_hint="REQUESTS")
        scale = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}[arrival_unit]
        import numpy as np

        arr = np.asarray(table.column("arrival").to_numpy(zero_copy_only=False), np.float64)
        table = table.append_column("arrival_ns", pa.array((arr * scale).astype(np.int64)))
    return table


def register(group: click.Group) -> None:
    @group.command("replay")
    @click.argument("requests")
    @click.option("--scenario", required=True, help="The deployment to replay on.")
    @click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
                  help="Directory for the outputs (created).")
    @click.option("--estimate", type=click.Choice(["no_overlap", "overlap", "calibrated"]),
                  default="no_overlap", show_default=True,
                  help="The step estimate the engine clock advances by.")
    @click.option("--calibration", type=click.Path(dir_okay=False, exists=True),
                  help="A calibration document (needed by --estimate calibrated).")
    @click.option("--router", type=click.Choice(["least_loaded", "round_robin"]),
                  default="least_loaded", show_default=True, help="DP request routing.")
    @click.option("--slo", help="SLOs for goodput, e.g. ttft=2s,itl=50ms (ttft, itl, tpot, "
                                "e2e).")
    @click.option("--async-scheduling/--no-async-scheduling", default=True, show_default=True,
                  help="vLLM's async scheduling (one-step lag; on by default in v0.31).")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index (a prefill+decode deployment replays both pools unless "
                       "a pool other than 0 is named).")
    @click.option("--dp", type=click.IntRange(1), help="Engine cores (default: the "
                                                        "deployment's DP width).")
    @click.option("--max-num-seqs", type=click.IntRange(1))
    @click.option("--max-num-batched-tokens", type=click.IntRange(1))
    @click.option("--long-prefill-token-threshold", type=click.IntRange(0), default=0,
                  show_default=True)
    @click.option("--prefix-caching/--no-prefix-caching", default=None,
                  help="Default: the deployment's setting (vLLM: on).")
    @click.option("--arrival-unit", type=click.Choice(["s", "ms", "us", "ns"]), default="s",
                  show_default=True, help="Unit of a request file's arrival column.")
    @click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
                  help="Seed of a generated load.")
    @with_repos
    def replay_cmd(requests: str, scenario: str, out_dir: str, estimate: str,
                   calibration: str | None, router: str, slo: str | None,
                   async_scheduling: bool, pool: int, dp: int | None,
                   max_num_seqs: int | None, max_num_batched_tokens: int | None,
                   long_prefill_token_threshold: int, prefix_caching: bool | None,
                   arrival_unit: str, seed: int, scenarios_root: str | None,
                   catalog_root: str | None, registry_root: str | None) -> None:
        """Replay REQUESTS (a request file or a load spec) on SCENARIO."""
        import kernel
        from kernel.replay import ReplayOptions, replay, write_replay
        from pipeline.load import open_inputs

        slos = parse_slo(slo)
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        k = kernel.open(scenario, repos, pool, calibration=calibration)
        target: Any = k
        roles = ([p.role for p in open_inputs(scenario, repos, 0).deployment.pools]
                 if pool == 0 else [])
        if roles == ["prefill", "decode"]:  # disaggregated: both pools, P/D replay
            target = [k, kernel.open(scenario, repos, 1, calibration=calibration)]
        reqs = load_requests(requests, arrival_unit, seed,
                             int(k.resolved_pool.max_model_len) or None)
        opts = ReplayOptions(estimate=estimate, router=router,
                             async_scheduling=async_scheduling, seed=seed, dp=dp,
                             max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             long_prefill_token_threshold=long_prefill_token_threshold,
                             enable_prefix_caching=prefix_caching)
        result = replay(target, reqs, opts, slo=slos)
        rejected_in = getattr(reqs, "rejects", None)
        if rejected_in is not None and rejected_in.num_rows:
            click.echo(f"{rejected_in.num_rows:,} input rows rejected by the reader "
                       f"(kernel.replay.read_requests; see its rejects)", err=True)
        paths = write_replay(result, out_dir, k, source=requests)
        s = result.summary
        click.echo(f"replayed {s['requests']:,} requests ({s['finished']:,} finished, "
                   f"{s['rejected']:,} rejected) in {s['engine_steps']:,} engine steps on "
                   f"{s['engine_cores']} engine core(s)")
        for key in ("duration_s", "throughput_rps", "throughput_output_tps", "ttft_s_mean",
                    "ttft_s_p50", "ttft_s_p99", "itl_s_mean", "itl_s_p50", "itl_s_p99",
                    "e2e_s_mean", "e2e_s_p99", "queue_s_mean", "kv_occupancy_mean",
                    "preemptions", "prefix_hit_rate", "goodput_rps", "slo_attainment"):
            if key in s and s[key] is not None:
                v = s[key]
                click.echo(f"  {key:<24} {v:,.6g}" if isinstance(v, float) else
                           f"  {key:<24} {v:,}")
        click.echo(f"wrote {', '.join(str(p) for p in paths.values())}")
