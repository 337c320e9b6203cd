"""Logging (issue 30 item 6; decisions CF5, CF6): module loggers, no handler configured by the
library, and each decision a run makes is logged: the ordering mode, the spill and its plan,
the row-group plan, the calibration applied and the replay's options and limits."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import kernel
from kernel import bulk
from kernel.bulk.options import Tuning
from kernel.calibration.splitwise import scenario_path
from kernel.cli import cli
from kernel.cli.logs import level_for
from kernel.model.calibration_law import TERMS

from .bulk_pools import VARIANTS, pool
from .test_bulk import random_trace

ROOT = Path(__file__).resolve().parents[1]


def _messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_the_library_configures_no_handler() -> None:
    code = ("import logging, kernel, kernel.bulk, kernel.replay, kernel.calibration, pipeline; "
            "print(sum(len(logging.getLogger(n).handlers) for n in logging.root.manager."
            "loggerDict if n.split('.')[0] in ('kernel', 'pipeline')), "
            "len(logging.root.handlers))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.stdout.split() == ["0", "0"], r.stderr


@pytest.mark.parametrize(("order", "budget", "mode"), [
    ("auto", None, None), ("external", None, "external"), ("sort", 1, "spill")])
def test_the_ordering_mode_and_spill_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                order: str, budget: int | None,
                                                mode: str | None) -> None:
    r = pool(**VARIANTS["dcp4-ctxgather"])
    src, dst = tmp_path / "t.parquet", tmp_path / "o.parquet"
    random_trace(200, 3).sample(fraction=1.0, shuffle=True, seed=1).write_parquet(src)
    with caplog.at_level(logging.DEBUG, logger="kernel"):
        c = bulk.price_file(r, src, dst, progress=False,
                            tuning=Tuning(order=order, memory_budget=budget, chunk_rows=64))
    assert mode is None or c.mode == mode
    said = _messages(caplog, "kernel.bulk.stream")
    assert f"ordering mode {c.mode} for {dst} ({c.rows_in} rows in)" in said, said
    assert any(f"{dst}" in m and "row groups of" in m
               for m in _messages(caplog, "kernel.bulk.sink"))
    if c.mode == "spill":
        assert any(m.startswith("beyond the memory budget (1 bytes): spilling") for m in said)
        assert any(m.startswith("spill plan: ") for m in _messages(caplog, "kernel.bulk.spill"))
    if c.mode == "external":
        assert any("DuckDB's external sort" in m for m in said)


def test_the_calibration_applied_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    k = kernel.open(str(scenario_path("h100-80gb", 2)))
    doc = {"kind": "Calibration", "version": 1, "name": "logged-cal", "model": "llama-2-70b-hf",
           "chip": "h100", "phases": {p: {"multipliers": dict.fromkeys(TERMS, 1.0),
                                          "constant_ns": 0}
                                      for p in ("prefill", "decode", "mixed")}}
    with caplog.at_level(logging.INFO, logger="kernel"):
        k.with_calibration(doc)
    said = _messages(caplog, "kernel.io.calibration_document")
    assert any(m.startswith("calibration 'logged-cal' applied") for m in said), said


def test_the_replay_options_and_limits_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    from kernel.replay import ReplayOptions, replay
    from tests.replay_support import kernel_for, request_set

    rs = request_set([{"request_id": "A", "arrival_ns": 0, "prompt_tokens": 50,
                       "output_tokens": 3}])
    opts = ReplayOptions(max_num_batched_tokens=100)
    with caplog.at_level(logging.INFO, logger="kernel"):
        replay(kernel_for(), rs, opts)
    said = _messages(caplog, "kernel.replay.api")
    assert any(m.startswith("replay of 1 requests") and "max_num_batched_tokens=100" in m
               for m in said), said


def test_verbose_and_the_environment_choose_the_level(tmp_path: Path) -> None:
    assert level_for(0, None) == logging.WARNING
    assert level_for(1, "error") == logging.INFO and level_for(2, None) == logging.DEBUG
    assert level_for(0, "DEBUG") == logging.DEBUG and level_for(0, "info") == logging.INFO
    runner = CliRunner()
    trace = tmp_path / "t.parquet"
    assert runner.invoke(cli, ["trace", "synth", "-n", "30", "-o", str(trace)]).exit_code == 0
    args = ["price", str(trace), "-s", "llama-3.1-8b-h100-tp1", "-o", str(tmp_path / "p.csv")]
    quiet = runner.invoke(cli, args)
    loud = runner.invoke(cli, ["-v", *args])
    env = runner.invoke(cli, args, env={"BLIS_KERNEL_LOG": "info"})
    assert quiet.exit_code == loud.exit_code == env.exit_code == 0, loud.output
    assert "ordering mode" not in quiet.stderr
    assert "INFO kernel.bulk.stream: ordering mode" in loud.stderr
    assert "INFO kernel.bulk.stream: ordering mode" in env.stderr
    assert "ordering mode" not in loud.stdout
    bad = runner.invoke(cli, args, env={"BLIS_KERNEL_LOG": "chatty"})
    assert bad.exit_code == 2 and "BLIS_KERNEL_LOG='chatty'" in bad.stderr
