"""Every numeric option of every command is range-checked by click (no option takes a value
it cannot use), and an option that would be ignored is an error instead."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from kernel.cli import cli


def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    if isinstance(cmd, click.Group):
        return [c for name, sub in cmd.commands.items() for c in _commands(sub, (*path, name))]
    return [(" ".join(path), cmd)]


def test_every_numeric_option_has_a_range() -> None:
    loose = [f"{name} {p.name}" for name, cmd in _commands(cli) for p in cmd.params
             if isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)
             and not isinstance(p.type, click.IntRange | click.FloatRange)]
    assert loose == []
    assert len(_commands(cli)) >= 15


def test_an_option_that_would_be_ignored_is_refused(tmp_path: Path) -> None:
    anatomy = CliRunner().invoke(cli, ["anatomy", "-s", "llama-3.1-8b-h100-tp1", "-o",
                                       str(tmp_path / "a.html"), "--max-batch", "8"])
    assert anatomy.exit_code == 2 and "--max-batch" in anatomy.stderr
    assert not (tmp_path / "a.html").exists()
