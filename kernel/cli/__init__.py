"""``blis-kernel``: the command line. Each module in this package adds its own commands."""

from __future__ import annotations

import importlib
import pkgutil

import click

from .errors import Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="blis-kernel")
def cli() -> None:
    """Price vLLM forward passes, memory and transfers, with provenance you can query."""


def _register_commands() -> None:
    # Every sibling module exposes `register(group)`; discovering them keeps this file stable.
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(cli)


_register_commands()


def main() -> None:
    """The console entry point (errors become one line: :mod:`kernel.cli.errors`; SIGINT and
    SIGTERM remove temporary files and exit non-zero: :mod:`pipeline.safe_output`)."""
    from pipeline.safe_output import install_signal_handlers

    install_signal_handlers()
    cli()
