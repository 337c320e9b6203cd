"""Options and printing shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from pipeline.load import PRICINGS, Repos

repos_options = [
    click.option("--scenarios-root", "scenarios_root", type=click.Path(file_okay=False),
                 help="Scenarios root (default: the embedded examples)."),
    click.option("--catalog", "catalog_root", type=click.Path(file_okay=False),
                 help="Catalog root (default: the embedded catalog)."),
    click.option("--registry", "registry_root", type=click.Path(file_okay=False),
                 help="Registry root (default: the embedded registry)."),
    # consumed by make_repos through the click context, so commands need no extra parameter
    click.option("--no-assumed-widths", "no_assumed_widths", is_flag=True, expose_value=False,
                 callback=lambda ctx, _param, value: ctx.meta.__setitem__(
                     _NO_ASSUMED_WIDTHS, bool(value)),
                 help="Refuse a collective group of 16+ ranks the registry never measured, "
                      "instead of pricing it from assumed figures derived from the widest "
                      "measured width."),
    click.option("--pricing", "pricing", type=click.Choice(PRICINGS), default=PRICINGS[0],
                 show_default=True, expose_value=False,
                 callback=lambda ctx, _param, value: ctx.meta.__setitem__(_PRICING, value),
                 help="measured: the coefficient sets fitted from measured vLLM operator "
                      "tables layered over the scenario's (vLLM's all-reduce as the engine "
                      "runs it); reference: the scenario's sets alone, the reference's "
                      "numbers bit for bit."),
    click.option("--layer", "layer", type=click.Path(file_okay=False, exists=True),
                 expose_value=False,
                 callback=lambda ctx, _param, value: ctx.meta.__setitem__(_LAYER, value),
                 help="A registry layer (as `registry fit` writes it) to price with instead of "
                      "the embedded measured layer; needs --pricing measured."),
    # bounds on what a YAML document may hold, checked before it is decoded (RL4)
    click.option("--max-document-bytes", "max_document_bytes", type=click.IntRange(1),
                 expose_value=False, is_eager=True,
                 callback=lambda _ctx, _param, value: _set_limits(document=value),
                 help="Largest YAML document file read, in bytes (default 16 MiB)."),
    click.option("--max-scalar-bytes", "max_scalar_bytes", type=click.IntRange(1),
                 expose_value=False, is_eager=True,
                 callback=lambda _ctx, _param, value: _set_limits(scalar=value),
                 help="Longest YAML scalar (a name, a number, a text) read, in bytes "
                      "(default 64 KiB)."),
]


def _set_limits(document: int | None = None, scalar: int | None = None) -> None:
    from pipeline.yamlio import set_limits

    set_limits(document, scalar)
_NO_ASSUMED_WIDTHS = "blis.no_assumed_widths"
_PRICING = "blis.pricing"
_LAYER = "blis.layer"


F = TypeVar("F", bound=Callable[..., Any])


def with_repos(func: F) -> F:
    """Add --scenarios/--catalog/--registry to a command."""
    for option in reversed(repos_options):
        func = option(func)
    return func


def make_repos(scenarios_root: str | None, catalog_root: str | None,
               registry_root: str | None) -> Repos:
    from pipeline import safe_output

    ctx = click.get_current_context(silent=True)
    off = bool(ctx and ctx.meta.get(_NO_ASSUMED_WIDTHS))
    pricing = str(ctx.meta.get(_PRICING, PRICINGS[0])) if ctx else PRICINGS[0]
    layer = ctx.meta.get(_LAYER) if ctx else None
    if layer and pricing == "reference":
        raise click.UsageError("--layer needs --pricing measured (the reference prices with the "
                               "scenario's coefficient sets alone)")
    for label, root in (("--scenarios-root", scenarios_root), ("--catalog", catalog_root),
                        ("--registry", registry_root)):
        safe_output.note_read_dir(label, root)  # nothing is written into a root read (RL1)
    safe_output.note_read_dir("--layer", layer)
    return Repos(scenarios=scenarios_root, catalog=catalog_root, registry=registry_root,
                 assumed_collective_widths=not off, pricing=pricing, layer=layer)


# At most this many local worker processes (a mistyped count must not fork the machine away).
MAX_LOCAL_WORKERS = 64


class ClusterParam(click.ParamType):
    """``local[:N]``, ``dask-local[:N]`` (1 <= N <= 64) or a Dask scheduler address
    (``host:port`` or ``tcp://host:port``)."""

    name = "cluster"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        import re

        text = str(value).strip()
        if text in ("local", "dask-local"):
            return text
        if text.startswith(("local:", "dask-local:")):
            n = text.split(":", 1)[1]
            if not n.isdigit() or not 1 <= int(n) <= MAX_LOCAL_WORKERS:
                self.fail(f"{text!r}: N needs 1 <= N <= {MAX_LOCAL_WORKERS} workers",
                          param, ctx)
            return text
        if re.fullmatch(r"(?:(?:tcp|tls|ucx|ws|wss)://)?[\w.\-\[\]:]+:\d{1,5}", text):
            return text
        self.fail(f"{text!r} is not local[:N], dask-local[:N] or a scheduler address HOST:PORT "
                  "(tcp://HOST:PORT)", param, ctx)


CLUSTER = ClusterParam()

class FiniteFloatRange(click.FloatRange):
    """A float range that refuses NaN and infinities (a NaN compares false with both bounds,
    so a plain range lets it through), RL7."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        import math

        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


connect_timeout_option = click.option(
    "--connect-timeout", default=10.0, show_default=True,
    type=FiniteFloatRange(0, 3600, min_open=True),
    help="Seconds to wait for a --cluster scheduler address before giving up.")


def parse_column_options(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--column CANONICAL=SOURCE`` options as a mapping (trace column names, docs/traces.md)."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise click.BadParameter(f"{p!r}: expected CANONICAL=SOURCE, e.g. scheduled=n_sched",
                                     param_hint="--column")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out
