"""Outputs never destroy an input; a signal mid-price leaves no temporary and no partial file."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kernel.cli import cli
from pipeline import safe_output

S = "llama-3.1-8b-h100-tp1"
REPO = Path(__file__).resolve().parents[1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    from kernel.io.synth import write_synth

    write_synth(tmp_path / "t.parquet", 20, requests_per_batch=4.0, seed=2)
    (tmp_path / "sub").mkdir()
    return tmp_path


# Every way an output can be the input, as (label, extra args or output, what it is).
SAME_FILE = {
    "same path": lambda d: ["-o", str(d / "t.parquet")],
    "relative path": lambda d: ["-o", os.path.relpath(d / "t.parquet")],
    "path through ..": lambda d: ["-o", str(d / "sub" / ".." / "t.parquet")],
    "symlink to the input": lambda d: ["-o", str(_link(d, "l.parquet", symbolic=True))],
    "hard link of the input": lambda d: ["-o", str(_link(d, "h.parquet", symbolic=False))],
    "symlinked directory": lambda d: ["-o", str(_dirlink(d) / "t.parquet")],
    "rejects are the input": lambda d: ["-o", str(d / "o.parquet"), "--rejects",
                                        str(d / "t.parquet")],
    "rejects are the output": lambda d: ["-o", str(d / "o.parquet"), "--rejects",
                                         str(d / "o.parquet")],
    "rejects are the output by another name": lambda d: [
        "-o", str(d / "o.parquet"), "--rejects", str(d / "sub" / ".." / "o.parquet")],
    "default rejects are the input": lambda d: _default_rejects(d),
    "db is the input": lambda d: ["-o", str(d / "o.parquet"), "--db", str(d / "t.parquet")],
}


def _link(d: Path, name: str, symbolic: bool) -> Path:
    target = d / name
    if symbolic:
        target.symlink_to(d / "t.parquet")
    else:
        os.link(d / "t.parquet", target)
    return target


def _dirlink(d: Path) -> Path:
    (d / "alias").symlink_to(d)
    return d / "alias"


def _default_rejects(d: Path) -> list[str]:
    # -o x.parquet puts rejects in x.rejects.parquet: make that name the input.
    os.replace(d / "t.parquet", d / "x.rejects.parquet")
    os.link(d / "x.rejects.parquet", d / "t.parquet")
    return ["-o", str(d / "x.parquet")]


@pytest.mark.parametrize("kind", list(SAME_FILE))
def test_the_input_survives_every_same_file_output(files: Path, kind: str) -> None:
    args = SAME_FILE[kind](files)
    before = {p.name: digest(p) for p in files.glob("*.parquet") if p.is_file()}
    result = CliRunner().invoke(cli, ["price", str(files / "t.parquet"), "-s", S, *args])
    assert result.exit_code == 1, result.output
    assert "same file" in result.stderr and "Traceback" not in result.output
    after = {p.name: digest(p) for p in files.glob("*.parquet") if p.is_file()}
    assert after == before  # nothing changed, nothing new
    assert not list(files.glob(".*.tmp"))


@pytest.mark.parametrize("command", [
    lambda d: ["report", str(d / "p.parquet"), "-o", str(_alias(d, "p.parquet", "r.html"))],
    lambda d: ["compare", str(d / "t.parquet"), "--scenario", S, "-o",
               str(_alias(d, "t.parquet", "c.html"))],
    lambda d: ["provenance", "-s", str(_scenario(d)), "--format", "json", "-o", str(d / "s.yaml")],
    lambda d: ["sql", "SELECT 1", "--db", str(_db(d)), "--format", "csv", "-o",
               str(d / "r.db")],
], ids=["report", "compare", "provenance", "sql"])
def test_other_writers_refuse_their_input(files: Path, command) -> None:  # type: ignore[no-untyped-def]
    from kernel import bulk
    from kernel.facade.factory import open as open_kernel

    bulk.price_file(open_kernel(S), files / "t.parquet", files / "p.parquet", progress=False)
    args = command(files)
    before = {p.name: digest(p) for p in files.iterdir() if p.is_file()}
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "same file" in result.stderr
    assert {p.name: digest(p) for p in files.iterdir() if p.is_file()} == before


def _alias(d: Path, target: str, name: str) -> Path:
    (d / name).symlink_to(d / target)
    return d / name


def _scenario(d: Path) -> Path:
    from pipeline.resources import data_dir

    (d / "s.yaml").write_text((data_dir() / "scenarios" / f"{S}.yaml").read_text())
    return d / "s.yaml"


def _db(d: Path) -> Path:
    from pipeline import db

    db.load_scenarios([S], con=db.open_db(d / "r.db")).close()
    return d / "r.db"


def test_atomic_leaves_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), safe_output.atomic(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with safe_output.atomic(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_symlinked_output_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    with safe_output.atomic(tmp_path / "link.txt") as tmp:
        tmp.write_text("new")
    assert (tmp_path / "link.txt").is_symlink()
    assert (tmp_path / "real.txt").read_text() == "new"


def _shuffled_trace(path: Path, batches: int, per_batch: int) -> None:
    """Batch ids out of order: pricing sorts them first, in a scratch directory."""
    rng = np.random.default_rng(0)
    ids = np.repeat(rng.permutation(batches).astype(np.int64), per_batch)
    n = ids.size
    pq.write_table(pa.table({
        "batch_id": ids, "scheduled": np.ones(n, np.int64),
        "computed": rng.integers(1, 4000, n).astype(np.int64),
        "prompt_len": np.full(n, 512, np.int64)}), path)


def interrupt_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool], sig: int,
                   what: str, wait: float) -> bytes:
    """Send ``sig`` to ``proc`` once ``ready()`` (polled every 5 ms for ``wait`` seconds, the
    process still alive); its stderr. The process is never left running."""
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            if ready():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.005)
        else:
            pytest.fail(f"{what} never started")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=wait / 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_price_leaves_no_temporary_and_no_output(tmp_path: Path, sig: int) -> None:
    trace = tmp_path / "t.parquet"
    _shuffled_trace(trace, 300_000, 8)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "priced.parquet"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from kernel.cli import main; main()", "price", str(trace), "-s",
         S, "-o", str(out), "--chunk-rows", "500", "--no-progress"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    # Pricing is under way once its scratch directory (the out-of-order trace is sorted
    # there) or the output's temporary file exists.
    err = interrupt_when(proc, lambda: any(p.name.startswith(".") for p in out_dir.iterdir()),
                         sig, "pricing", 60)
    assert proc.returncode == 128 + sig, err.decode()
    assert list(out_dir.iterdir()) == []  # no temporary file or directory, no partial output
    assert not out.exists()
