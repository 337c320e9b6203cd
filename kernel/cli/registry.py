"""``blis-kernel registry fit``: coefficient sets fitted from measured operator tables, written
as a registry layer (docs/registry_fit.md)."""

from __future__ import annotations

import click

from .dialect import DialectCommand


@click.group("registry")
def registry_group() -> None:
    """Regenerate registry coefficients from measured operator tables."""


@registry_group.command("fit", cls=DialectCommand, renamed={"--out": "--output"})
@click.option("--operator-tables", "tables", required=True,
              type=click.Path(file_okay=False, exists=True),
              help="Operator tables in AISimulate's layout: systems/data/<system>/<family>/"
                   "<backend>/<version>/*.parquet (the unpacked wheel, or any level down to "
                   "systems/data).")
@click.option("--chip", "chips", required=True, multiple=True,
              help="A catalog chip (repeatable), e.g. h100.")
@click.option("--engine", default="vllm:0.31.0", show_default=True,
              help="BACKEND:VERSION the tables are read for; the nearest version the tables "
                   "have is taken, and said so in provenance.")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False),
              help="The layer directory: coefficients/<family>-<chip>.yaml and "
                   "fit-report.csv are written under it.")
def fit_cmd(tables: str, chips: tuple[str, ...], engine: str, out: str) -> None:
    """Fit each coefficient family the tables hold for each --chip, score it on held-out rows,
    and write the sets as a registry layer (use it with Repos(layer=OUT) or --layer OUT)."""
    from ..registry_fit.layer import write_layer
    from ..registry_fit.run import fit_chip

    sets, report = [], []
    for chip in chips:
        try:
            s, r = fit_chip(tables, chip, engine)
        except (ValueError, OSError) as exc:
            raise click.ClickException(f"{chip}: {exc}") from None
        sets.extend(s)
        report.extend(r)
    root = write_layer(out, sets, report)
    for row in report:
        note = "" if row["version"] == row["requested"] else \
            f" (tables at {row['version']}, nearest to {row['requested']})"
        click.echo(f"{row['chip']:<12} {row['family']} {row['group']:<6} held out "
                   f"{row['held_out_rows']} rows: MAPE {row['mape']:.1%} (bias "
                   f"{row['bias']:+.1%}){note}")
    click.echo(f"Wrote {len(sets)} coefficient set(s) and fit-report.csv under {root}")


def register(cli: click.Group) -> None:
    cli.add_command(registry_group)
