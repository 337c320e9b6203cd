"""``blis-kernel demo``: the main job on the embedded defaults.

Loads, validates and resolves every embedded scenario (every pool) and prints what each one
is, whether it is accepted, and how much of its pricing rests on evidence.
"""

from __future__ import annotations

import importlib.util

import click
from rich.console import Console
from rich.table import Table

from pipeline.errors import DocumentError, RefusalError
from pipeline.load import Repos, open_inputs

from .common import make_repos, with_repos


def _scenario_names(repos: Repos) -> list[str]:
    return sorted(p.stem for p in repos.scenarios_root().glob("*.yaml"))


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def summarise_scenarios(repos: Repos) -> tuple[Table, int]:
    """A table row per scenario pool; returns the table and the number of pools refused."""
    table = Table(title=f"Embedded scenarios ({repos.scenarios_root()})")
    for col in ("scenario", "pool", "role", "model", "chip", "tp×dp (ep)", "status", "evidence"):
        table.add_column(col)
    can_validate = _has("pipeline.validate")
    can_build = _has("kernel.build")
    failures = 0
    for name in _scenario_names(repos):
        try:
            first = open_inputs(name, repos, 0)
        except DocumentError as exc:
            failures += 1
            table.add_row(name, "-", "-", "-", "-", "-", f"[red]not loaded[/]: {exc.problems[0]}", "")
            continue
        for i, pool in enumerate(first.deployment.pools):
            inputs = first if i == 0 else open_inputs(name, repos, i)
            par = pool.parallel
            status, evidence = "[green]loaded[/]", ""
            try:
                if can_validate:
                    from pipeline.validate import check_inputs

                    report = check_inputs(inputs)
                    warnings = len(report.warnings())
                    status = ("[green]valid[/]" if report.ok() else "[red]invalid[/]") + (
                        f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")
                if can_build:
                    from kernel.build import new

                    k = new(inputs)
                    ev, total, _ = k.evidence()
                    evidence = f"{ev}/{total}"
                    status += ", [green]priced[/]"
            except (DocumentError, RefusalError) as exc:
                failures += 1
                status = f"[red]refused[/]: {str(exc).splitlines()[0]}"
            table.add_row(name, str(i), pool.role, inputs.model.name, inputs.chip.name,
                          f"{par.tp}×{max(par.dp, 1)} ({par.expert_parallel_width()})", status,
                          evidence)
    return table, failures


def register(group: click.Group) -> None:
    @group.command("demo")
    @with_repos
    def demo(scenarios_root: str | None, catalog_root: str | None,
             registry_root: str | None) -> None:
        """Run the main job on the embedded defaults (or the given roots)."""
        repos = make_repos(scenarios_root, catalog_root, registry_root)
        table, failures = summarise_scenarios(repos)
        Console().print(table)
        if failures:
            raise SystemExit(1)
