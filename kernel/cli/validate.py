"""``blis-kernel validate [PATH...]``: check scenarios, catalogs, registries and documents.

Each PATH is a scenario bundle file, a scenario name under the scenarios root, a catalog root,
a registry root, a directory holding ``catalog/``, ``registry/`` and ``scenarios/``, a directory
of YAML files, or a single document. With no PATH, the embedded (or ``--catalog`` /
``--registry`` / ``--scenarios``) roots are checked. Every problem is printed, one a line,
then a summary table. Exit 0: no errors (warnings allowed); 1: errors; 2: bad arguments.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from kernel.cli.common import make_repos, with_repos
from kernel.cli.output import (
    TEXT_FORMATS,
    console,
    emit_rows,
    format_options,
    protect_key,
    resolve_format,
)
from pipeline.errors import DocumentError, Problem
from pipeline.load import Repos, resolve_scenario_path
from pipeline.validate_files import (
    CATALOG_DIRS,
    Checked,
    add_refusals,
    check_bundle,
    check_catalog,
    check_document,
    check_registry,
    detect_kind,
)


def check_file(path: Path, repos: Repos) -> Checked:
    """A bundle (two documents) or a single document of any kind."""
    try:
        kind = detect_kind(path)
    except DocumentError as exc:
        return Checked("document", path.stem, str(path), exc.problems)
    return check_bundle(path, repos) if kind == "bundle" else check_document(path, kind)


def check_scenarios(root: Path, repos: Repos) -> list[Checked]:
    files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")]) if root.is_dir() else []
    return add_refusals([check_bundle(f, repos, refusals=False) for f in files])


def check_everything(repos: Repos) -> list[Checked]:
    """The catalog, the registry and every scenario of ``repos``."""
    return [*check_catalog(repos.catalog_root()), *check_registry(repos.registry_root()),
            *check_scenarios(repos.scenarios_root(), repos)]


def check_directory(path: Path, repos: Repos) -> list[Checked]:
    if (path / "coefficients").is_dir() or any((path / d).is_dir() for d in CATALOG_DIRS):
        out = check_registry(path) if (path / "coefficients").is_dir() else []
        if any((path / d).is_dir() for d in CATALOG_DIRS):
            out = check_catalog(path) + out
        return out
    if any((path / d).is_dir() for d in ("catalog", "registry", "scenarios")):
        return check_everything(Repos(scenarios=repos.scenarios or path / "scenarios",
                                      catalog=repos.catalog or path / "catalog",
                                      registry=repos.registry or path / "registry"))
    files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
    return [check_file(f, repos) for f in files]


def check_argument(arg: str, repos: Repos) -> list[Checked]:
    """Everything one PATH argument names; ``click.BadParameter`` if it names nothing."""
    path = Path(arg)
    if path.is_dir():
        checked = check_directory(path, repos)
        if not checked:
            raise click.BadParameter(f"{arg}: nothing to validate in this directory",
                                     param_hint="PATH")
        return checked
    if path.is_file():
        return [check_file(path, repos)]
    try:
        return [check_bundle(resolve_scenario_path(arg, repos), repos)]
    except DocumentError as exc:
        raise click.BadParameter(f"{arg}: no such file, directory or scenario name "
                                 f"({exc.problems[0].message})", param_hint="PATH") from exc


def _summary(checked: list[Checked]) -> Table:
    table = Table(title="validated", show_lines=False)
    for column in ("kind", "name", "errors", "warnings"):
        table.add_column(column, justify="right" if column in ("errors", "warnings") else "left")
    for c in checked:
        errors, warnings = len(c.errors()), len(c.warnings())
        style = "red" if errors else ("yellow" if warnings else "green")
        table.add_row(c.kind, c.name, str(errors), str(warnings), style=style)
    return table


def print_problems(problems: list[Problem]) -> None:
    for p in problems:
        click.echo(str(p))


@click.command("validate")
@click.argument("paths", nargs=-1)
@format_options(TEXT_FORMATS, output=False)
@with_repos
def validate(paths: tuple[str, ...], fmt: str | None, scenarios_root: str | None,
             catalog_root: str | None, registry_root: str | None) -> None:
    """Validate scenarios, catalogs, registries or single documents; print every problem."""
    repos = make_repos(scenarios_root, catalog_root, registry_root)
    try:
        if paths:
            checked = [c for arg in paths for c in check_argument(arg, repos)]
        else:
            checked = check_everything(repos)
    except FileNotFoundError as exc:
        raise click.UsageError(f"nothing to validate: {exc}") from exc
    if not checked:
        raise click.UsageError("nothing to validate")
    n_errors = sum(len(c.errors()) for c in checked)
    if resolve_format(fmt, None, TEXT_FORMATS) != "table":
        emit_rows([{"kind": c.kind, "name": c.name, "errors": len(c.errors()),
                    "warnings": len(c.warnings()), "problems": [str(p) for p in c.problems]}
                   for c in checked], fmt, None)
        raise SystemExit(1 if n_errors else 0)
    for c in checked:
        print_problems(c.problems)
    console().print(protect_key(_summary(checked), 1))
    n_warnings = sum(len(c.warnings()) for c in checked)
    failed = sum(1 for c in checked if c.errors())
    click.echo(f"{len(checked)} checked, {failed} failed: {n_errors} error(s), "
               f"{n_warnings} warning(s)")
    raise SystemExit(1 if n_errors else 0)


def register(group: click.Group) -> None:
    group.add_command(validate)
