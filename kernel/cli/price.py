"""``blis-kernel price`` (a recorded trace → parquet) and ``blis-kernel trace synth``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kernel.bulk.options import ORDERS, Tuning
from kernel.facade.priced_db import write_db
from kernel.io.outputs import TABLE_FORMATS, is_stdout
from pipeline import safe_output
from pipeline.load import Repos

from .calibrate import MeasuredRun, price_options
from .common import (
    CLUSTER,
    FiniteFloatRange,
    connect_timeout_option,
    make_repos,
    parse_column_options,
    with_repos,
)
from .dialect import DialectCommand, complete_scenario

if TYPE_CHECKING:
    pass

DEFAULT_SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
TRACE_SUFFIXES = (".parquet", ".csv", ".arrow", ".ipc", ".feather")


def _open_kernel(scenario: str, pool: int, repos: Any) -> Any:
    from kernel.facade import factory
    from pipeline.errors import DocumentError, RefusalError

    try:
        return factory.open(scenario, repos, pool)
    except (DocumentError, RefusalError, IndexError, ValueError) as exc:
        from .errors import describe

        raise click.ClickException(f"cannot open scenario {scenario!r} pool {pool}: "
                                   f"{describe(exc)}") from None


def _check_formats(output: str, out_format: str | None, rejects: str | None) -> None:
    """Every table output's format, from its suffix, before anything is read (RL3)."""
    from kernel.io.outputs import FormatError, table_format

    try:
        table_format(output, out_format, label="-o", default="csv")
        if rejects:
            table_format(rejects, label="--rejects")
    except FormatError as exc:
        raise click.BadParameter(str(exc), param_hint="-o/--rejects") from None


_CREATED: set[str] = set()  # --db files this process created (removed if its run fails)


def _lock_db(db: str) -> Any:
    """The --db connection, opened (and so locked) before anything is written."""
    from pipeline import db as pdb

    existed = Path(db).exists()
    con = pdb.open_db(db)
    if not existed:
        _CREATED.add(db)
    return con


def _unlock_db(con: Any, db: str | None) -> None:
    """Close a --db connection after a failed run; a file this run created is removed."""
    if con is None or db is None:
        return
    con.close()
    if db in _CREATED:
        _CREATED.discard(db)
        for path in (Path(db), Path(db + ".wal")):
            path.unlink(missing_ok=True)


def _price_on_cluster(trace: str, scenario: str, pool: int, output: str, cluster: str,
                      decode_threshold: int, repos: Repos, connect_timeout: float) -> None:
    from kernel.sweep.distributed import price_dataset

    if safe_output.same_file(trace, output):
        raise click.UsageError("OUTPUT is TRACE: write the priced partitions elsewhere")
    safe_output.check_output_dir("-o", output, [("TRACE", trace), ("--scenario", scenario)])
    try:
        result = price_dataset(trace, output, [scenario], cluster, pool=pool, repos=repos,
                               decode_threshold=decode_threshold,
                               connect_timeout=connect_timeout)
    except RuntimeError as exc:  # partitions that could not be priced, each named
        raise click.ClickException(str(exc)) from None
    click.echo(f"rows in {result.rows_in:,} = priced {result.rows_priced:,} + rejected "
               f"{result.rows_rejected:,}; {sum(t.batches for t in result.tasks):,} batches in "
               f"{len(result.tasks)} partition(s), {result.seconds:.2f}s -> {output}")


def _trace_files(trace: str) -> list[str]:
    """The files TRACE names (a file, a directory of parts, a glob), to keep outputs off them."""
    import glob

    path = Path(trace)
    if path.is_dir():
        return [str(p) for p in sorted(path.rglob("*")) if p.is_file()]
    if not path.exists() and any(ch in trace for ch in "*?["):
        return sorted(glob.glob(trace, recursive=True))
    return [trace]


def register(group: click.Group) -> None:
    @group.command("price", cls=DialectCommand, renamed={"--batches": "--batches-file"})
    @click.argument("trace")
    @click.option("-s", "--scenario", required=True, shell_complete=complete_scenario,
                  help="Scenario name or path.")
    @click.option("--pool", default=0, show_default=True, type=click.IntRange(0),
                  help="Pool index.")
    @click.option("-o", "--output", required=True, type=click.Path(allow_dash=True),
                  help="Priced table, one row per batch: .parquet, .arrow (.ipc, .feather), "
                       ".csv or .jsonl by suffix; '-' streams to stdout (--format, default "
                       "csv); a directory with --cluster.")
    @click.option("--format", "out_format", default=None, type=click.Choice(TABLE_FORMATS),
                  help="The output's format (default: from -o's suffix; csv for '-').")
    @click.option("--rejects", type=click.Path(dir_okay=False),
                  help="Where rejected rows go, format by suffix (default: OUTPUT with "
                       ".rejects.parquet, written only if there are any; none with -o -).")
    @click.option("--strict", is_flag=True, help="Fail on the first bad row, with its reason.")
    @click.option("--reject-over-limit", is_flag=True,
                  help="Set aside (reason over_limit) every batch that breaks a deployment "
                       "limit, instead of pricing it flagged in the limits column.")
    @click.option("--decode-threshold", default=1, show_default=True, type=click.IntRange(0),
                  help="scheduled > N is a prefill (unless the trace has decode_threshold).")
    @click.option("--sm-budget", default=0, show_default=True, type=click.IntRange(0),
                  help="SMs a step may use, 0 = all (unless the trace has sm_budget).")
    @click.option("--batches-file", "batches_path", type=click.Path(exists=True, dir_okay=False),
                  help="Optional per-batch table: batch_id, decode_threshold, sm_budget.")
    @click.option("--column", "column_map", multiple=True, metavar="NAME=SOURCE",
                  help="Map a trace column, e.g. --column scheduled=num_scheduled_tokens.")
    @click.option("--chunk-rows", default=1 << 20, show_default=True,
                  type=click.IntRange(1, 1 << 31), help="Rows read per chunk (memory bound).")
    @click.option("--order", "order", default="auto", show_default=True,
                  type=click.Choice(ORDERS), help="Engine tuning: auto, sort (never the "
                  "streamed path) or external (DuckDB sorts on disk); never changes a price.")
    @click.option("--memory-budget", default=None, metavar="SIZE",
                  help="Engine tuning: rows held before spilling, e.g. 2GB (default: 1GB).")
    @click.option("--workers", default=None, type=click.IntRange(1, 256),
                  help="Engine tuning: pricing threads (default: the cores, at most 8).")
    @click.option("--tmp-dir", default=None, type=click.Path(file_okay=False),
                  help="Engine tuning: where spill files go (default: beside OUTPUT).")
    @click.option("--db", type=click.Path(dir_okay=False),
                  help="Also store the priced table in this DuckDB file, beside provenance.")
    @click.option("--utilisation", is_flag=True,
                  help="Add per-step flops, hbm_bytes, nvlink_bytes, nic_bytes, mfu, mbu, "
                       "prefill_tokens and kv_blocks (the report's utilisation, throughput "
                       "and KV sections read them).")
    @click.option("--no-progress", is_flag=True, help="No progress bar.")
    @click.option("--cluster", default=None, type=CLUSTER,
                  help="Price partitions in parallel: local[:N] worker processes, "
                       "dask-local:N, or a Dask ADDRESS; TRACE may then be a directory of "
                       "parquet partitions and OUTPUT is a directory.")
    @connect_timeout_option
    @price_options
    @with_repos
    def price_cmd(trace: str, scenario: str, pool: int, output: str, out_format: str | None,
                  rejects: str | None,
                  strict: bool, reject_over_limit: bool, decode_threshold: int,
                  sm_budget: int, batches_path: str | None, column_map: tuple[str, ...],
                  chunk_rows: int, order: str, memory_budget: str | None,
                  workers: int | None, tmp_dir: str | None,
                  db: str | None, utilisation: bool, no_progress: bool, cluster: str | None,
                  connect_timeout: float, scenarios_root: str | None, catalog_root: str | None,
                  registry_root: str | None, **measured: Any) -> None:
        """Price every batch of a recorded TRACE (a file, a directory, a glob) into parquet
        (docs/traces.md)."""
        from kernel.bulk import price_file
        from kernel.bulk.utilisation import column_producer
        from kernel.io import stamp
        from kernel.io.trace import RejectedRowError, TraceError

        repos = make_repos(scenarios_root, catalog_root, registry_root)
        if cluster is not None:
            unsupported = [name for name, given in (
                ("--rejects", rejects), ("--strict", strict), ("--sm-budget", sm_budget),
                ("--batches-file", batches_path), ("--column", column_map), ("--db", db),
                ("--chunk-rows", chunk_rows != 1 << 20), ("--order", order != "auto"),
                ("--memory-budget", memory_budget), ("--workers", workers),
                ("--tmp-dir", tmp_dir),
                ("--reject-over-limit", reject_over_limit),
                ("--measured", measured.get("measured")),
                ("--calibration", measured.get("calibration")),
                ("--trace-format fpm", measured.get("trace_format") == "fpm"),
                ("--utilisation", utilisation), ("--format", out_format),
                ("-o -", is_stdout(output))) if given]
            if unsupported:
                raise click.UsageError(f"{', '.join(unsupported)} cannot be combined with "
                                       "--cluster (rejects go to OUTPUT/rejects/)")
            _price_on_cluster(trace, scenario, pool, output, cluster, decode_threshold, repos,
                              connect_timeout)
            return
        out = Path(output)
        streamed = is_stdout(output)
        _check_formats(output, out_format, rejects)
        if streamed:
            for name, given in (("--db", db), ("--measured", measured.get("measured"))):
                if given:
                    raise click.UsageError(f"{name} reads the priced file back: give -o FILE, "
                                           "not -o -")
        rej: Path | None = (Path(rejects) if rejects else None if streamed
                            else out.with_name(out.stem + ".rejects.parquet"))
        safe_output.check_outputs(
            [*(("TRACE", f) for f in _trace_files(trace)), ("--batches-file", batches_path),
             ("--calibration", measured.get("calibration"))],
            [("-o", None if streamed else out), ("--rejects", rej), ("--db", db)])
        for label, path in (("-o", None if streamed else out), ("--rejects", rej)):
            if path is not None and Path(trace).is_dir() and safe_output.inside(path, trace):
                raise click.UsageError(f"{label} {path} is inside the TRACE directory, where it "
                                       "would become part of the trace: write it elsewhere")
        for label, read in (("--batches-file", batches_path), ("--scenario", scenario),
                            ("--calibration", measured.get("calibration"))):
            if read and Path(read).is_file():
                safe_output.note_read(label, read)
        if db:
            safe_output.check_reads(db, "--db")
        if not streamed:
            out = safe_output.check_target(out, "-o")
        if rej is not None:
            rej = safe_output.check_target(rej, "--rejects")
        # the database's lock first: a run that cannot store its rows writes nothing (RL6)
        con = _lock_db(db) if db else None
        k = _open_kernel(scenario, pool, repos)
        run = MeasuredRun(k, trace, measured, rej)  # --measured, --calibration, fpm
        k = run.k
        # the library's stamp (what price_file writes by default) plus the command line
        made = stamp.for_pricing(k, trace, decode_threshold=decode_threshold,
                                 sm_budget=sm_budget, columns=parse_column_options(column_map),
                                 batches=batches_path, measured=run.measured,
                                 measured_unit=run.unit or "ns",
                                 # the library's reading ("requests") goes unstated
                                 trace_format=(measured.get("trace_format")
                                               if measured.get("trace_format") != "requests"
                                               else None))
        made = made.with_command(click.get_current_context().meta.get("blis.argv", ()))
        try:
            counts = price_file(k, run.src, out, rejects=rej,
                                on_reject="raise" if strict else "ignore",
                                tuning=Tuning(chunk_rows=chunk_rows, order=order,
                                              memory_budget=memory_budget, workers=workers,
                                              tmp_dir=tmp_dir),
                                progress=not no_progress,
                                decode_threshold=decode_threshold, sm_budget=sm_budget,
                                columns=parse_column_options(column_map), batches=batches_path,
                                producers=[*(run.producers or ()),
                                           *([column_producer()] if utilisation else [])],
                                keep=run.keep or None, metadata=made.to_metadata(),
                                rejects_metadata=made.as_kind("rejects").to_metadata(),
                                reject_over_limit=reject_over_limit, out_format=out_format)
        except RejectedRowError as exc:
            _unlock_db(con, db)
            raise click.ClickException(f"--strict: {exc}") from None
        except TraceError as exc:
            _unlock_db(con, db)
            raise click.ClickException(str(exc)) from None
        except BaseException:
            _unlock_db(con, db)
            raise
        rejected = counts.rows_rejected + counts.batch_table_rows_rejected
        if not rejects and rejected == 0 and rej is not None:
            rej.unlink(missing_ok=True)
        click.echo(f"rows in {counts.rows_in:,} = priced {counts.rows_priced:,} + rejected "
                   f"{counts.rows_rejected:,}; {counts.batches_priced:,} batches priced in "
                   f"{counts.seconds:.2f}s ({counts.steps_per_second:,.0f} steps/s, "
                   f"{counts.rows_per_second:,.0f} rows/s, {counts.mode}) -> {out}",
                   err=True)  # a summary: stderr, stdout is for data (CF3)
        if rejected and rej is None:
            click.echo(f"{counts.rows_rejected:,} rejected rows not kept: give --rejects FILE "
                       "to keep them with their reasons", err=True)
        elif rejected:
            extra = (f" (+{counts.batch_table_rows_rejected:,} per-batch table rows)"
                     if counts.batch_table_rows_rejected else "")
            click.echo(f"{counts.rows_rejected:,} rejected rows{extra} -> {rej}", err=True)
        if counts.batches_over_limit:
            click.echo(f"warning: {counts.batches_over_limit:,} priced batches are over a "
                       "deployment limit (named in the limits column; --reject-over-limit sets "
                       "them aside)", err=True)
        run.report(out)
        if db and con is not None:
            _CREATED.discard(db)
            write_db(db, k, scenario, pool, out, str(trace), repos, con=con)
            click.echo(f"stored in {db}: priced_steps, kernel_provenance", err=True)

    @group.group("trace")
    def trace_group() -> None:
        """Trace utilities."""

    @trace_group.command("synth")
    @click.option("-n", "--batches", default=100_000, show_default=True,
                  type=click.IntRange(1, 1 << 40), help="Steps.")
    @click.option("--mix", default=0.05, show_default=True,
                  type=FiniteFloatRange(0, 1, max_open=True),
                  help="Prefill share: the fraction of request rows that are prefill chunks.")
    @click.option("--requests", default=32.0, show_default=True,
                  type=FiniteFloatRange(0, 1 << 20, min_open=True),
                  help="Mean requests per batch.")
    @click.option("--prompt", default="lognormal:1024:1.0", show_default=True,
                  help="Prompt lengths: fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA, "
                       "exponential:MEAN.")
    @click.option("--output-len", "output_len", default="lognormal:256:1.0",
                  show_default=True, help="Output lengths (same forms).")
    @click.option("--budget", default=8192, show_default=True, type=click.IntRange(1),
                  help="max_num_batched_tokens (caps the prefill chunk).")
    @click.option("--chunk", default=None, type=click.IntRange(1),
                  help="Prefill chunk size (default: solved from --mix).")
    @click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1))
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
                  help="Trace file: .parquet, .csv or .arrow.")
    def synth_cmd(batches: int, mix: float, requests: float, prompt: str, output_len: str,
                  budget: int, chunk: int | None, seed: int, output: str) -> None:
        """Write a synthetic continuous-batching trace (requests enter, prefill in chunks,
        decode, leave)."""
        from kernel.io.synth import write_synth

        if Path(output).suffix.lower() not in TRACE_SUFFIXES:
            raise click.BadParameter(f"{output}: the suffix says the format; it must be one of "
                                     f"{', '.join(TRACE_SUFFIXES)}", param_hint="-o/--output")
        safe_output.check_outputs([], [("-o", output)])
        try:
            st = write_synth(output, batches, requests_per_batch=requests, prefill_share=mix,
                             prompt=prompt, output=output_len, max_num_batched_tokens=budget,
                             chunk=chunk, seed=seed)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{st.batches:,} batches, {st.rows:,} request rows "
                   f"({st.requests_per_batch:.1f}/batch, {st.prefill_share:.1%} prefill, "
                   f"chunk {st.chunk}), {st.requests:,} requests -> {output}",
                   file=sys.stdout)
