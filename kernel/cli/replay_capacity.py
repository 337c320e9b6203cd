"""``blis-kernel replay REQUESTS --scenario S [--scenario T …] --rates 2,4,8 -o OUT_DIR``:
the capacity sweep behind ``replay --rates`` (``kernel.replay.capacity.sweep_rates``), its
printed curve and highest rates, and the stamped files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from kernel.cli.common import ClusterParam
from kernel.cli.output import console as output_console
from kernel.cli.output import protect_key


class SweepCluster(ClusterParam):
    """``inline`` (every replay in this process) or anything ``--cluster`` takes elsewhere."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        if str(value).strip() == "inline":
            return "inline"
        return super().convert(value, param, ctx)


SWEEP_CLUSTER = SweepCluster()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.2f}"


def curve_table(curve: Any) -> Table:
    table = Table(title="Latency-throughput curve (latencies in ms)")
    for col in ("scenario", "rate", "achieved rps", "TTFT p50", "TTFT p90", "TTFT p99",
                "ITL p50", "ITL p90", "ITL p99", "E2E p50", "E2E p90", "E2E p99", "goodput rps",
                "meets SLO"):
        table.add_column(col, justify="left" if col == "scenario" else "right", no_wrap=True)
    for r in curve.to_pylist():
        table.add_row(r["scenario"], f"{r['rate']:g}",
                      "-" if r["throughput_rps"] is None else f"{r['throughput_rps']:,.3g}",
                      *(_ms(r[f"{m}_s_{q}"]) for m in ("ttft", "itl", "e2e")
                        for q in ("p50", "p90", "p99")),
                      "-" if r["goodput_rps"] is None else f"{r['goodput_rps']:,.3g}",
                      "-" if r["meets_slo"] is None else ("yes" if r["meets_slo"] else "no"))
    return table


def run_capacity(requests: str, scenarios: list[str], rates: list[float], out_dir: str,
                 options: Any, slo: dict[str, float] | None, *, min_attainment: float,
                 cluster: str, connect_timeout: float, repos: Any, pool: int,
                 calibration: str | None, arrival_unit: str, seed: int,
                 with_report: bool) -> None:
    """The sweep, printed and written (the library call plus printing)."""
    from kernel.cli.replay import load_requests
    from kernel.replay import parse_load
    from kernel.replay.capacity import sweep_rates, write_capacity

    if Path(requests).exists():
        source: Any = load_requests(requests, arrival_unit, seed, None)
        rejected_in = getattr(source, "rejects", None)
        if rejected_in is not None and rejected_in.num_rows:
            click.echo(f"{rejected_in.num_rows:,} input rows rejected by the reader "
                       f"(kernel.replay.read_requests; see its rejects)", err=True)
    elif "=" in requests:
        source = parse_load(requests)
    else:
        raise click.BadParameter(f"{requests}: no such file, and not a load spec (key=value "
                                 f"pairs such as rate=8,duration=60)", param_hint="REQUESTS")
    try:
        result = sweep_rates(scenarios, source, rates, options=options, slo=slo,
                             min_attainment=min_attainment, cluster=cluster, seed=seed,
                             repos=repos, pool=pool, calibration=calibration,
                             connect_timeout=connect_timeout)
    except RuntimeError as exc:  # lost workers, named by the executor
        raise click.ClickException(str(exc)) from None
    paths = write_capacity(result, out_dir)
    console = output_console()
    console.print(protect_key(curve_table(result.curve)))
    click.echo(f"{result.curve.num_rows} replays of {result.source} (base rate "
               f"{result.base_rate:,.4g}/s) on {result.executor} in {result.seconds:,.1f} s")
    for r in result.max_rate.to_pylist():
        if not result.slo:
            click.echo(f"{r['scenario']}: no --slo given, so no highest rate within SLOs")
        elif r["max_rate"] is None:
            click.echo(f"{r['scenario']}: no swept rate meets the SLOs "
                       f"(at least {result.min_attainment:.0%} of requests within every one)")
        else:
            click.echo(f"{r['scenario']}: highest rate within the SLOs {r['max_rate']:g} "
                       f"requests/s (at least {result.min_attainment:.0%} of requests within "
                       f"every one)")
    if with_report:
        from kernel.report.html import write
        from kernel.report.serving import read_serving, serving_report

        paths["report"] = write(serving_report(read_serving(out_dir),
                                               title="blis-kernel: capacity"),
                                Path(out_dir) / "report.html")
    click.echo(f"wrote {', '.join(str(p) for p in paths.values())}")
