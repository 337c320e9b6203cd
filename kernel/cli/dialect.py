"""One CLI dialect (issue 30 item 5): ``-s/--scenario``, ``-o/--output``, counts as
``-n/--batches`` and files as ``--*-file``; old spellings stay as hidden deprecated aliases.

:class:`DialectCommand` rewrites a deprecated spelling (``--out``, ``--scenarios``, a
positional scenario) to the current one before click parses, printing one deprecation line
to stderr, so scripts keep working and the help shows only the dialect (CF1, CF2).
:func:`scenario_option` is the one scenario option, completing embedded scenario names and
``*.yaml`` in the working directory (CF4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

F = TypeVar("F", bound=Callable[..., Any])


def complete_scenario(ctx: click.Context, param: click.Parameter,
                      incomplete: str) -> list[CompletionItem]:
    """Embedded scenario names and ``*.yaml`` files in the working directory."""
    from pipeline.db import embedded_scenarios

    names = list(embedded_scenarios())
    names += sorted(str(p) for p in Path().glob("*.yaml"))  # relative, as typed
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def scenario_option(*, required: bool = False, multiple: bool = False, name: str = "scenario",
                    help: str = "Scenario name or path.", **kwargs: Any) -> Callable[[F], F]:
    """The ``-s/--scenario`` option (repeatable when ``multiple``)."""
    return click.option("-s", "--scenario", name, required=required, multiple=multiple,
                        help=help, shell_complete=complete_scenario, **kwargs)


def _takes_value(command: click.Command) -> set[str]:
    opts: set[str] = set()
    for p in command.params:
        if isinstance(p, click.Option) and not p.is_flag and not p.count:
            opts.update(p.opts)
    return opts


def _warn(old: str, new: str) -> None:
    click.echo(f"warning: {old} is deprecated; use {new}", err=True)


class DialectCommand(click.Command):
    """A command that accepts deprecated spellings: ``renamed`` maps an old option to its
    current spelling; ``positional`` names the option a leading positional value moved to."""

    def __init__(self, *args: Any, renamed: Mapping[str, str] | None = None,
                 positional: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})
        self.positional = positional

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self.modernise(args))

    def modernise(self, args: Sequence[str]) -> list[str]:
        """``args`` with every deprecated spelling rewritten (one warning per spelling)."""
        out: list[str] = []
        warned: set[str] = set()
        valued = _takes_value(self) | set(self.renamed)
        target = self.positional
        given = target is not None and any(
            a in self._spellings(target) or a.startswith(f"{target}=") for a in args)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                out.extend(args[i:])
                break
            name, eq, value = arg.partition("=")
            if name in self.renamed:
                new = self.renamed[name]
                if name not in warned:
                    _warn(name, new)
                    warned.add(name)
                arg = f"{new}={value}" if eq else new
                name = new
            out.append(arg)
            if arg.startswith("-") and not eq and name in valued and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
            elif (target is not None and not given and not arg.startswith("-")):
                _warn(f"a positional scenario ({arg})", target)
                out[-1:] = [target, arg]
                given = True
            i += 1
        return out

    def _spellings(self, opt: str) -> set[str]:
        for p in self.params:
            if opt in p.opts:
                return set(p.opts)
        return {opt}


def versions() -> str:
    """blis-kernel's version and its key dependencies' (``--version``)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    parts = [f"blis-kernel {v('blis-kernel')}", f"python {platform.python_version()}"]
    parts += [f"{d} {v(d)}" for d in ("duckdb", "pyarrow", "polars", "numpy", "click",
                                        "matplotlib")]
    return "\n".join(parts)
