"""``blis-kernel replay REQUESTS --scenario S -o OUT_DIR``: a serving replay.

REQUESTS is a request file (any source ``kernel.replay.read_requests`` reads) or a load spec
(``kernel.replay.generate``); writes requests.parquet, steps.parquet, engine_steps.parquet,
rejects.parquet and summary.json/.parquet under OUT_DIR (stamped) and prints the summary;
``--report`` adds OUT_DIR/report.html. With ``--rates`` (and ``--scenario`` repeated for a grid)
it is a capacity sweep (``kernel.replay.capacity.sweep_rates``): curve.parquet and
max_rate.parquet under OUT_DIR, the curve and each scenario's highest rate within the SLOs
printed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from kernel.cli.common import connect_timeout_option, make_repos, with_repos
from kernel.cli.replay_capacity import SWEEP_CLUSTER

from .dialect import DialectCommand, complete_scenario

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


def parse_rates(text: str) -> list[float]:
    """``2,4,8`` → [2.0, 4.0, 8.0]: positive, finite, distinct requests/s."""
    out: list[float] = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            v = float("nan")
        if not (v > 0 and v != float("inf")):
            raise click.BadParameter(f"{part.strip()!r}: expected comma-separated rates in "
                                     f"requests/s, each a number > 0 (e.g. 2,4,8,16)",
                                     param_hint="--rates")
        if v in out:
            raise click.BadParameter(f"rate {part.strip()} is given twice", param_hint="--rates")
        out.append(v)
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
    @group.command("replay", cls=DialectCommand, renamed={"--out": "--output"})
    @click.argument("requests")
    @click.option("-s", "--scenario", "scenarios", required=True, multiple=True, shell_complete=complete_scenario,
                  help="The deployment to replay on (repeat with --rates for a grid).")
    @click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
                  help="Directory for the outputs (created).")
    @click.option("--estimate", type=click.Choice(["no_overlap", "overlap", "calibrated"]),
                  default="overlap", show_default=True,
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
    @click.option("--report", "with_report", is_flag=True,
                  help="Also write OUT_DIR/report.html (the serving report).")
    @click.option("--rates", default=None,
                  help="Capacity sweep: replay at each arrival rate (requests/s, comma-separated, "
                       "e.g. 2,4,8,16) on every --scenario.")
    @click.option("--min-attainment", default=0.9, show_default=True,
                  type=click.FloatRange(0, 1, min_open=True),
                  help="With --rates: a rate meets the SLOs when this share of its requests "
                       "meets every one.")
    @click.option("--cluster", default="local:2", show_default=True, type=SWEEP_CLUSTER,
                  help="With --rates: inline (this process), local[:N] (N local processes), "
                       "dask-local:N, or a Dask scheduler ADDRESS.")
    @connect_timeout_option
    @with_repos
    def replay_cmd(requests: str, scenarios: tuple[str, ...], out_dir: str, estimate: str,
                   calibration: str | None, router: str, slo: str | None,
                   async_scheduling: bool, pool: int, dp: int | None,
                   max_num_seqs: int | None, max_num_batched_tokens: int | None,
                   long_prefill_token_threshold: int, prefix_caching: bool | None,
                   arrival_unit: str, seed: int, with_report: bool, rates: str | None,
                   min_attainment: float, cluster: str, connect_timeout: float,
                   scenarios_root: str | None, catalog_root: str | None,
                   registry_root: str | None) -> None:
        """Replay REQUESTS (a request file or a load spec) on SCENARIO; with --rates, at
        every rate on every scenario (a capacity sweep)."""
        import kernel
        from kernel.replay import ReplayOptions, replay, write_replay
        from pipeline.load import open_inputs

        slos = parse_slo(slo)
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        opts = ReplayOptions(estimate=estimate, router=router,
                             async_scheduling=async_scheduling, seed=seed, dp=dp,
                             max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             long_prefill_token_threshold=long_prefill_token_threshold,
                             enable_prefix_caching=prefix_caching)
        if rates is not None:
            from kernel.cli.replay_capacity import run_capacity

            run_capacity(requests, list(scenarios), parse_rates(rates), out_dir, opts, slos,
                         min_attainment=min_attainment, cluster=cluster,
                         connect_timeout=connect_timeout, repos=repos, pool=pool,
                         calibration=calibration, arrival_unit=arrival_unit, seed=seed,
                         with_report=with_report)
            return
        if len(scenarios) > 1:
            raise click.UsageError("--scenario is repeated: a grid of scenarios needs --rates "
                                   "(one replay takes one scenario)")
        scenario = scenarios[0]
        k = kernel.open(scenario, repos, pool, calibration=calibration)
        target: Any = k
        roles = ([p.role for p in open_inputs(scenario, repos, 0).deployment.pools]
                 if pool == 0 else [])
        if roles == ["prefill", "decode"]:  # disaggregated: both pools, P/D replay
            target = [k, kernel.open(scenario, repos, 1, calibration=calibration)]
        reqs = load_requests(requests, arrival_unit, seed,
                             int(k.resolved_pool.max_model_len) or None)
        result = replay(target, reqs, opts, slo=slos)
        rejected_in = getattr(reqs, "rejects", None)
        if rejected_in is not None and rejected_in.num_rows:
            click.echo(f"{rejected_in.num_rows:,} input rows rejected by the reader "
                       f"(kernel.replay.read_requests; see its rejects)", err=True)
        paths = write_replay(result, out_dir, k, source=requests)
        s = result.summary
        click.echo(f"replayed {s['requests']:,} requests ({s['finished']:,} finished, "
                   f"{s['rejected']:,} rejected) in {s['engine_steps']:,} engine steps on "
                   f"{s['engine_cores']} engine core(s)", err=True)  # summaries: stderr (CF3)
        for key in ("duration_s", "throughput_rps", "throughput_output_tps", "ttft_s_mean",
                    "ttft_s_p50", "ttft_s_p99", "itl_s_mean", "itl_s_p50", "itl_s_p99",
                    "e2e_s_mean", "e2e_s_p99", "queue_s_mean", "kv_occupancy_mean",
                    "preemptions", "prefix_hit_rate", "goodput_rps", "slo_attainment"):
            if key in s and s[key] is not None:
                v = s[key]
                click.echo(f"  {key:<24} {v:,.6g}" if isinstance(v, float) else
                           f"  {key:<24} {v:,}", err=True)
        if with_report:
            from kernel.report.html import write
            from kernel.report.serving import read_serving, serving_report

            paths["report"] = write(serving_report(read_serving(out_dir)),
                                    Path(out_dir) / "report.html")
        click.echo(f"wrote {', '.join(str(p) for p in paths.values())}", err=True)
