"""``blis-kernel sweep``: price one partitioned trace under many deployments on a cluster."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import click
import polars as pl
from rich.table import Table

from pipeline import safe_output
from pipeline.load import Repos

from .common import CLUSTER, connect_timeout_option, make_repos, with_repos
from .dialect import DialectCommand, complete_scenario
from .output import TEXT_FORMATS, emit, format_options, protect_key, resolve_format
from .output import console as output_console


def match_scenarios(patterns: tuple[str, ...], repos: Repos) -> list[str]:
    """Scenario names under the scenarios root matching any glob, or paths that exist."""
    known = sorted(p.stem for p in repos.scenarios_root().glob("*.yaml"))
    chosen: list[str] = []
    for pattern in patterns:
        if Path(pattern).is_file():
            chosen.append(pattern)
            continue
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise click.BadParameter(f"{pattern!r}: a glob is relative to the current directory "
                                     "and has no '..' (give an existing file path instead)",
                                     param_hint="--scenario")
        hits = [p for p in sorted(Path().glob(pattern)) if p.suffix in (".yaml", ".yml")]
        hits_names = [str(p) for p in hits] or fnmatch.filter(known, pattern)
        if not hits_names:
            raise click.BadParameter(f"{pattern!r} matches no scenario; known: {known}",
                                     param_hint="--scenario")
        chosen.extend(h for h in hits_names if h not in chosen)
    return chosen


def summary_table(frame: pl.DataFrame) -> Table:
    table = Table(title="Sweep summary (NoOverlap; shares are of wall time, as compare reports)")
    for col in ("scenario", "batches", "wall time s", "p50 µs", "p99 µs",
                "binds most (share of wall time)"):
        table.add_column(col)
    shares = ["sm", "hbm", "nvlink", "nic", "host"]
    for row in frame.iter_rows(named=True):
        top = max(shares, key=lambda s: row[f"share_{s}"])
        table.add_row(row["scenario"], f"{row['batches']:,}",
                      f"{row['total_no_overlap_ns'] / 1e9:,.2f}", f"{row['p50_ns'] / 1e3:,.1f}",
                      f"{row['p99_ns'] / 1e3:,.1f}", f"{top} ({row[f'share_{top}']:.0%})")
    return table


def register(group: click.Group) -> None:
    @group.command("sweep", cls=DialectCommand,
                   renamed={"--out": "--output", "--scenarios": "--scenario"})
    @click.argument("trace", type=click.Path(exists=True))
    @click.option("-s", "--scenario", "patterns", multiple=True, required=True, shell_complete=complete_scenario,
                  help="Scenario name glob (repeatable) or scenario file path.")
    @click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False),
                  help="Output directory (partitioned parquet + summary.parquet).")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index in each deployment.")
    @click.option("--cluster", default="local:2", show_default=True, type=CLUSTER,
                  help="local[:N]: N local worker processes; dask-local:N: a local Dask "
                       "cluster; or a Dask scheduler ADDRESS.")
    @click.option("--decode-threshold", default=1, show_default=True, type=click.IntRange(0))
    @connect_timeout_option
    @format_options(TEXT_FORMATS, output=False)
    @with_repos
    def sweep(trace: str, patterns: tuple[str, ...], out: str, pool: int, cluster: str,
              decode_threshold: int, connect_timeout: float, fmt: str | None,
              scenarios_root: str | None, catalog_root: str | None,
              registry_root: str | None) -> None:
        """Price TRACE (a parquet file or a directory of partitions) under every scenario."""
        from kernel.sweep.distributed import price_dataset

        repos = make_repos(scenarios_root, catalog_root, registry_root)
        names = match_scenarios(patterns, repos)
        if safe_output.same_file(trace, out):
            raise click.UsageError("-o is TRACE: write the sweep elsewhere")
        safe_output.check_output_dir("-o", out, [("TRACE", trace), *(
            ("--scenario", n) for n in names if Path(n).is_file())])
        try:
            result = price_dataset(trace, out, names, cluster, pool=pool, repos=repos,
                                   decode_threshold=decode_threshold,
                                   connect_timeout=connect_timeout)
        except RuntimeError as exc:  # partitions that could not be priced, each named
            raise click.ClickException(str(exc)) from None
        if resolve_format(fmt, None, TEXT_FORMATS) != "table":
            emit(result.summary.to_arrow(), fmt, None)
            return
        console = output_console()
        console.print(protect_key(summary_table(result.summary)))
        console.print(f"rows in {result.rows_in:,} = priced {result.rows_priced:,} + rejected "
                      f"{result.rows_rejected:,}; {len(result.tasks)} tasks in "
                      f"{result.seconds:.1f} s; summary in {Path(out) / 'summary.parquet'}")
