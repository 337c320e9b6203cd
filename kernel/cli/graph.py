"""``blis-kernel graph derive`` and ``blis-kernel catalog add-model``: model graphs from
HuggingFace configs (model.md §13), and the ``--check`` pass over a catalog."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline import safe_output
from pipeline.derive import DeriveError, supported_architectures
from pipeline.derive.catalog import add_model, check_catalog, derive_file, write_graph
from pipeline.resources import data_dir

from .dialect import DialectCommand


@click.group("graph")
def graph_group() -> None:
    """Derive model graphs from HuggingFace configs."""


@graph_group.command("derive", cls=DialectCommand, renamed={"--out": "--output"})
@click.argument("config", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--quant", type=click.Path(dir_okay=False, exists=True),
              help="The checkpoint's hf_quant_config.json (ModelOpt), if it has one.")
@click.option("--name", help="Model name (default: from the config file name).")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False),
              help="Directory to write graph.yaml into.")
@click.option("--check", "check", is_flag=True,
              help="Re-derive every graph in the catalog that has a config.json; exit 1 on "
                   "any difference.")
@click.option("--catalog", type=click.Path(file_okay=False, exists=True),
              help="Catalog root for --check (default: the embedded catalog).")
def derive_cmd(config: str | None, quant: str | None, name: str | None, out: str | None,
               check: bool, catalog: str | None) -> None:
    """Write the graph.yaml that CONFIG (a HuggingFace config.json) derives."""
    if check:
        if config is not None:
            raise click.UsageError("--check re-derives a catalog; give --catalog, not CONFIG")
        _check(Path(catalog) if catalog else data_dir() / "catalog")
        return
    if config is None or out is None:
        raise click.UsageError("CONFIG and -o DIR are required (or use --check)")
    # CONFIG's own folder is (or would become) its catalog entry, whose graph.yaml a catalog
    # reads beside it: `catalog add-model` writes entries, `--check` compares them (RL1).
    if safe_output.same_file(out, Path(config).parent):
        raise safe_output.UnsafeOutput(f"-o {out!r} is the folder of CONFIG {config!r}, a "
                                       "catalog entry's place; write the graph elsewhere (or "
                                       "use `catalog add-model`)")
    safe_output.check_outputs([("CONFIG", config), ("--quant", quant)],
                              [("-o", Path(out) / "graph.yaml")])
    try:
        graph = derive_file(config, name, quant)
    except DeriveError as exc:
        raise click.ClickException(str(exc)) from None
    target = write_graph(graph, out)
    layers = graph["stack"]
    click.echo(f"Derived {graph['name']} ({len(graph['layer_kinds'])} layer kinds, "
               f"{_depth(layers)} layers) -> {target}")


@graph_group.command("architectures")
def architectures_cmd() -> None:
    """List the architectures the deriver handles."""
    for arch in supported_architectures():
        click.echo(arch)


def _depth(stack: dict[str, list[str] | int]) -> int:
    def size(key: str) -> int:
        value = stack.get(key) or []
        return len(value) if isinstance(value, list) else 0
    repeat = stack.get("repeat") or 0
    return size("prologue") + size("pattern") * int(repeat if isinstance(repeat, int) else 0) \
        + size("epilogue")


def _check(catalog: Path) -> None:
    results = check_catalog(catalog)
    for r in results:
        if r.status != "current":
            click.echo(f"{r.name}: {r.status}: {r.detail}", err=True)
    bad = [r for r in results if r.status != "current"]
    click.echo(f"checked {len(results)} model(s) with a config.json under {catalog}: "
               f"{len(results) - len(bad)} current, {len(bad)} stale or failed")
    if bad:
        raise SystemExit(1)


@click.group("catalog")
def catalog_group() -> None:
    """Manage a user catalog that layers over the embedded one."""


@catalog_group.command("add-model")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--catalog", "catalog", required=True, type=click.Path(file_okay=False),
              help="The user catalog root to add models/<name>/ to.")
@click.option("--quant", type=click.Path(dir_okay=False, exists=True),
              help="The checkpoint's hf_quant_config.json, copied beside the config.")
@click.option("--name", help="Model name (default: from the config file name).")
@click.option("--repo", help="HuggingFace repo for model.yaml (default: from the file name).")
@click.option("--revision", default="main", show_default=True, help="Revision for model.yaml.")
def add_model_cmd(config: str, catalog: str, quant: str | None, name: str | None,
                  repo: str | None, revision: str) -> None:
    """Add CONFIG as models/<name>/{config.json, model.yaml, graph.yaml} under --catalog."""
    try:
        target = add_model(config, catalog, name, quant, repo, revision)
    except DeriveError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Added {target.parent.name} to {catalog} ({target.parent})")


def register(cli: click.Group) -> None:
    cli.add_command(graph_group)
    cli.add_command(catalog_group)
