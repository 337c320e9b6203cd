"""The console entry point turns refusals and bad documents into one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("args", "says"), [
    (["step", "-s", "minimax-m25-h200-ep16", "--batch", "4x1@100", "--no-assumed-widths"],
     "no 16-rank all_reduce"),
    (["memory", "-s", "no-such-scenario"], "no scenario named 'no-such-scenario'"),
])
def test_errors_are_messages_not_tracebacks(args: list[str], says: str) -> None:
    run = subprocess.run([sys.executable, "-c", "from kernel.cli import main; main()", *args],
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1
    assert run.stderr.startswith("Error: ") and says in run.stderr
    assert "Traceback" not in run.stderr
