"""Priced files that say what made them: ``report`` and ``compare`` take the scenario from the
file's stamp (:mod:`kernel.io.stamp`) rather than asking for it, and refuse a contradiction."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kernel.io.priced import PricedFile, read_priced
from kernel.io.stamp import Stamp, StampError, check_kernel, read_stamp

if TYPE_CHECKING:
    from kernel.facade.kernel import Kernel
    from pipeline.load import Repos

PRICED_KINDS = ("priced", "sweep-partition")


def _where(stamp: Stamp) -> str:
    """The scenario to open for a stamp: its file when that is a real path, else its key."""
    file = stamp.documents.get("scenario", {}).get("file", "")
    if file and not file.startswith("<") and Path(file).is_file():
        return file
    return stamp.scenario or ""


def open_kernel_at(scenario: str, repos: Repos, pool: int) -> Kernel:
    """``kernel.open`` for a pool, with a one-line CLI error instead of a traceback."""
    import kernel
    from pipeline.errors import DocumentError, RefusalError

    try:
        k: Kernel = kernel.open(scenario, repos, pool)
    except (DocumentError, RefusalError, FileNotFoundError, IndexError) as exc:
        from kernel.cli.errors import describe

        raise click.ClickException(f"{scenario} pool {pool}: {describe(exc)}") from None
    return k


def kernel_for(pf: PricedFile, scenario: str | None, repos: Repos) -> Kernel | None:
    """The kernel a priced file's report describes: ``scenario`` when given (refused if the
    stamp names another), else the stamp's own; None when neither says. A document changed
    since pricing is a note on stderr."""
    stamp = pf.stamp if pf.stamp is not None and pf.stamp.scenario else None
    pool = stamp.pool if stamp is not None and stamp.pool is not None else 0
    if scenario is None and stamp is None:
        return None
    if scenario is None:
        assert stamp is not None
        try:
            k = open_kernel_at(_where(stamp), repos, pool)
        except click.ClickException as exc:  # the report still works without the kernel
            click.echo(f"note: cannot open the scenario the file names ({exc.message}); "
                       "the report leaves out the kernel's sections", err=True)
            return None
    else:
        k = open_kernel_at(scenario, repos, pool)
    try:
        notes = check_kernel(stamp, k, pf.path.name)
    except StampError as exc:
        raise click.ClickException(str(exc)) from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return k


def is_priced(path: str | Path) -> bool:
    """True for a stamped priced file (the output of ``price`` or a sweep partition)."""
    try:
        stamp = read_stamp(path)
    except (OSError, ValueError):  # not parquet/IPC at all: a raw trace
        return False
    return stamp is not None and stamp.kind in PRICED_KINDS


def priced_files(paths: list[str], scenarios: list[str], repos: Repos
                 ) -> tuple[list[PricedFile], list[Kernel | None], list[str]]:
    """Stamped priced files to compare: the files, their kernels (None when a scenario cannot
    be opened) and their labels. ``scenarios``, when given, must name the same deployments in
    the same order."""
    files = [read_priced(p) for p in paths]
    if scenarios and len(scenarios) != len(files):
        raise click.UsageError(f"{len(files)} priced file(s) name their own scenarios; give "
                               f"no --scenario, or one per file (got {len(scenarios)})")
    kernels = [kernel_for(pf, scenarios[i] if scenarios else None, repos)
               for i, pf in enumerate(files)]
    names = [(pf.stamp.scenario if pf.stamp and pf.stamp.scenario else pf.path.stem)
             for pf in files]
    if len(set(names)) < len(names):  # the same scenario twice: tell the files apart
        names = [f"{n} ({pf.path.name})" for n, pf in zip(names, files, strict=True)]
    return files, kernels, names
