"""``blis-kernel requests``: read a request source or generate a load, check it and summarise
it (docs/requests.md); ``-o`` writes the request set a replay reads."""

from __future__ import annotations

from pathlib import Path

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline import safe_output

from .output import emit_rows, format_options


@click.command("requests")
@click.argument("source", required=False)
@click.option("--source-format", "source_format",
              type=click.Choice(["table", "azure", "mooncake", "tracev2"]),
              help="The source's format (default: from its suffix and header).")
@click.option("--arrival-unit", type=click.Choice(["s", "ms", "us", "ns"]), default="s",
              show_default=True, help="Unit of a table's `arrival` column.")
@click.option("--max-model-len", type=click.IntRange(min=1),
              help="Reject requests that do not fit this context length, as vLLM does.")
@click.option("--hash-block-tokens", type=click.IntRange(min=1),
              help="Tokens per prefix_hashes entry of a table (TraceV2: of the made hashes).")
@click.option("--load", "load_spec", metavar="SPEC",
              help="Generate instead of reading: key=value pairs (e.g. "
                   "'rate=8,duration=600,prompt=lognormal:1024:1') or a YAML file.")
@click.option("--inference-perf", "ip_config", type=click.Path(exists=True),
              help="Generate the load of an inference-perf config (YAML/JSON, or an "
                   "experiment directory with results/config.yaml).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of a generated load.")
@click.option("--strict", is_flag=True, help="Fail at the first bad row instead of listing it.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False),
              help="Write the request set to this parquet file.")
@click.option("--rejects", "rejects_out", type=click.Path(dir_okay=False),
              help="Write the rejected rows (row, reason, column, value) to parquet or CSV.")
@format_options(("table", "json"), output=False)
def requests_cmd(source: str | None, source_format: str | None, arrival_unit: str,
                 max_model_len: int | None, hash_block_tokens: int | None,
                 load_spec: str | None, ip_config: str | None, seed: int, strict: bool,
                 out: str | None, rejects_out: str | None, fmt: str | None) -> None:
    """Read SOURCE (a request table, Azure CSV, Mooncake JSONL or TraceV2 header/data), or
    generate --load / --inference-perf, and print what it holds."""
    from kernel.replay import generate, inference_perf_spec, read_requests, write_requests
    from kernel.replay.requests import summarise

    given = [x for x in (source, load_spec, ip_config) if x is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of SOURCE, --load or --inference-perf")
    _refuse_ignored(["seed"] if source is not None else
                    ["source_format", "arrival_unit", "hash_block_tokens"])
    on_reject = "raise" if strict else "collect"
    if source is not None:
        rs = read_requests(source, format=source_format, arrival_unit=arrival_unit,
                           on_reject=on_reject, max_model_len=max_model_len,
                           hash_block_tokens=hash_block_tokens)
    else:
        spec = inference_perf_spec(ip_config) if ip_config is not None else str(load_spec)
        rs = generate(spec, seed=seed, max_model_len=max_model_len, on_reject=on_reject)
    if out:
        with safe_output.atomic(Path(out), "-o") as tmp:
            write_requests(rs, tmp)
        click.echo(f"wrote {rs.table.num_rows} request(s) to {out}", err=True)
    if rejects_out:
        _write_rejects(rs.rejects, Path(rejects_out))
    for note in rs.notes:
        click.echo(f"note: {note}", err=True)
    emit_rows([summarise(rs)], fmt, None, transpose=True, title="requests",
              formats=("table", "json"))


def _refuse_ignored(names: list[str]) -> None:
    """An option given on the command line that this use would ignore is an error."""
    ctx = click.get_current_context()
    for p in ctx.command.params:
        if p.name in names and ctx.get_parameter_source(p.name) == \
                click.core.ParameterSource.COMMANDLINE:
            what = "reading SOURCE" if p.name == "seed" else "generating a load"
            raise click.UsageError(f"{p.opts[0]} does not apply when {what}")


def _write_rejects(rejects: pa.Table, path: Path) -> None:
    with safe_output.atomic(path, "--rejects") as tmp:
        if path.suffix.lower() == ".csv":
            pacsv.write_csv(rejects, str(tmp))
        else:
            pq.write_table(rejects, str(tmp))
    click.echo(f"wrote {rejects.num_rows} rejected row(s) to {path}", err=True)


def register(group: click.Group) -> None:
    group.add_command(requests_cmd)
