"""``blis-kernel``: the command line. Each module in this package adds its own commands.

The command line is an application, so it tunes the process's allocator for streaming
(:func:`kernel.io.malloc.tune`), first, before numpy starts threads."""

from __future__ import annotations

from ..io.malloc import tune

tune()

import importlib  # noqa: E402
import pkgutil  # noqa: E402

import click  # noqa: E402

from .errors import Group  # noqa: E402


def _show_versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from .dialect import versions

        click.echo(versions())
        ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_versions,
              help="Show the versions of blis-kernel and its key dependencies, and exit.")
@click.option("-v", "--verbose", count=True,
              help="Log the decisions a run makes to stderr (-v: info, -vv: debug; or "
                   "BLIS_KERNEL_LOG=debug|info|warning).")
def cli(verbose: int) -> None:
    """Price vLLM forward passes, memory and transfers, with provenance you can query."""
    from .logs import configure

    configure(verbose)


def _register_commands() -> None:
    # Every sibling module exposes `register(group)`; discovering them keeps this file stable.
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "__main__":  # `python -m kernel.cli`, not a command module
            continue
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
