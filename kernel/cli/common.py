"""Options and printing shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from pipeline.load import Repos

repos_options = [
    click.option("--scenarios-root", "scenarios_root", type=click.Path(file_okay=False),
                 help="Scenarios root (default: the embedded examples)."),
    click.option("--catalog", "catalog_root", type=click.Path(file_okay=False),
                 help="Catalog root (default: the embedded catalog)."),
    click.option("--registry", "registry_root", type=click.Path(file_okay=False),
                 help="Registry root (default: the embedded registry)."),
]


F = TypeVar("F", bound=Callable[..., Any])


def with_repos(func: F) -> F:
    """Add --scenarios/--catalog/--registry to a command."""
    for option in reversed(repos_options):
        func = option(func)
    return func


def make_repos(scenarios_root: str | None, catalog_root: str | None,
               registry_root: str | None) -> Repos:
    return Repos(scenarios=scenarios_root, catalog=catalog_root, registry=registry_root)
