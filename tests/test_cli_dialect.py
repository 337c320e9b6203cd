"""One CLI dialect (issue 30 item 5; decisions CF1-CF4): the current spellings, the old ones
as hidden deprecated aliases with one warning line, the required scenario of ``price``,
``--version``, scenario completion, and summaries on stderr."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kernel.cli import cli
from kernel.cli.dialect import DialectCommand, complete_scenario

S = "llama-3.1-8b-h100-tp1"


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*path, name))
        else:
            out.append((" ".join((*path, name)), cmd))
    return out


def test_every_command_speaks_one_dialect() -> None:
    for name, cmd in _commands(cli):
        for p in cmd.params:
            if not isinstance(p, click.Option):
                assert p.name != "scenario", f"{name}: a positional scenario"
                continue
            opts = set(p.opts)
            if opts & {"--scenario", "--scenarios", "-s"}:
                assert opts == {"-s", "--scenario"}, (name, p.opts)
                assert p._custom_shell_complete is complete_scenario, name
            if opts & {"--out", "--output"}:
                assert opts == {"-o", "--output"} or p.opts == ["--output"], (name, p.opts)
            if "--batches" in opts:  # a count everywhere; a file is --batches-file
                assert isinstance(p.type, click.types.IntParamType), (name, p.type)


@pytest.mark.parametrize(("old", "new", "warning"), [
    (["memory", S], ["memory", "-s", S], "a positional scenario"),
    (["resolved", S, "--format", "json"], ["resolved", "--format", "json", "-s", S],
     "a positional scenario"),
    (["step", S, "--batch", "4x1@100"], ["step", "--scenario", S, "--batch", "4x1@100"],
     "a positional scenario"),
])
def test_old_spellings_still_work_with_one_warning(old: list[str], new: list[str],
                                                   warning: str) -> None:
    was, now = CliRunner().invoke(cli, old), CliRunner().invoke(cli, new)
    assert was.exit_code == 0 == now.exit_code, (was.output, now.output)
    assert was.stdout == now.stdout
    warned = [line for line in was.stderr.splitlines() if "deprecated" in line]
    assert len(warned) == 1 and warning in warned[0], was.stderr
    assert "deprecated" not in now.stderr


def test_renamed_options_are_rewritten_once() -> None:
    cmd = DialectCommand("x", params=[click.Option(["-o", "--output"]),
                                      click.Option(["-s", "--scenario"], multiple=True)],
                         renamed={"--out": "--output", "--scenarios": "--scenario"})
    runner = CliRunner()
    args = cmd.modernise(["--scenarios", "a", "--scenarios=b", "--out", "--out", "--", "--out"])
    assert args == ["--scenario", "a", "--scenario=b", "--output", "--out", "--", "--out"]
    # (the value of --output is the literal "--out"; after "--" nothing is rewritten)
    with runner.isolation() as (_, err, _):
        cmd.modernise(["--out", "f", "--out", "g"])
        assert err.getvalue().decode().count("deprecated") == 1


def test_old_out_spelling_writes_the_same(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "t.parquet"
    assert runner.invoke(cli, ["trace", "synth", "-n", "20", "-o", str(trace)]).exit_code == 0
    old = runner.invoke(cli, ["sweep", str(trace), "--scenarios", S, "--out",
                              str(tmp_path / "a")])
    new = runner.invoke(cli, ["sweep", str(trace), "-s", S, "-o", str(tmp_path / "b")])
    assert old.exit_code == 0 == new.exit_code, (old.output, new.output)
    assert old.stderr.count("deprecated") == 2 and "deprecated" not in new.stderr
    assert sorted(p.name for p in (tmp_path / "a").rglob("*.parquet")) == \
        sorted(p.name for p in (tmp_path / "b").rglob("*.parquet"))


def test_price_needs_a_scenario_and_summarises_on_stderr(tmp_path: Path) -> None:
    runner = CliRunner()
    trace, out = tmp_path / "t.parquet", tmp_path / "p.parquet"
    assert runner.invoke(cli, ["trace", "synth", "-n", "20", "-o", str(trace)]).exit_code == 0
    missing = runner.invoke(cli, ["price", str(trace), "-o", str(out)])
    assert missing.exit_code == 2 and "-s" in missing.stderr and "--scenario" in missing.stderr
    assert not out.exists()
    ok = runner.invoke(cli, ["price", str(trace), "-s", S, "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout == "" and "rows in 20" not in ok.stdout and "batches priced" in ok.stderr
    old = runner.invoke(cli, ["price", str(trace), "-s", S, "-o", str(tmp_path / "q.csv"),
                              "--batches", str(tmp_path / "missing.parquet")])
    assert old.exit_code == 2 and "--batches-file" in old.stderr


def test_version_names_the_key_dependencies() -> None:
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0
    for dist in ("blis-kernel", "duckdb", "pyarrow", "polars", "numpy", "python"):
        assert any(line.startswith(f"{dist} ") for line in r.stdout.splitlines()), r.stdout


def test_completion_lists_embedded_scenarios_and_local_yaml(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from pipeline.db import embedded_scenarios

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("x: 1\n")
    (tmp_path / "other.txt").write_text("")
    ctx = click.Context(cli)
    param = click.Option(["-s"])
    got = [c.value for c in complete_scenario(ctx, param, "")]
    assert set(embedded_scenarios()) <= set(got) and "mine.yaml" in got
    assert "other.txt" not in got
    assert [c.value for c in complete_scenario(ctx, param, "llama-3.1-8b-h100")] == \
        [n for n in embedded_scenarios() if n.startswith("llama-3.1-8b-h100")]


def test_shell_completion_script_and_names() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "_BLIS_KERNEL_COMPLETE": "bash_complete", "COMP_WORDS":
           "blis-kernel memory -s llama-3.1-8b", "COMP_CWORD": "3",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = "from kernel.cli import cli; cli(prog_name='blis-kernel')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert f"plain,{S}" in r.stdout.splitlines(), (r.stdout, r.stderr)
