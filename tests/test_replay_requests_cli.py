"""``blis-kernel requests``: read or generate a request set, summarise it, write it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from click.testing import CliRunner

from kernel.cli import cli
from kernel.replay import generate, read_requests
from kernel.replay.requests import summarise

MOONCAKE = Path(__file__).parent / "data" / "request-traces" / \
    "mooncake_conversation_trace.head200.jsonl"


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["requests", *args])
    return r.exit_code, r.stdout, r.stderr


def test_reads_summarises_and_writes(tmp_path: Path) -> None:
    out = tmp_path / "rs.parquet"
    code, stdout, stderr = _run(str(MOONCAKE), "-o", str(out))
    assert code == 0, stderr
    assert "wrote 200 request(s)" in stderr
    assert "repeated_hash_share" in stdout and "512" in stdout
    assert read_requests(out).table.equals(read_requests(MOONCAKE).table)


def test_bad_rows_listed_or_refused(tmp_path: Path) -> None:
    src = tmp_path / "r.csv"
    src.write_text("arrival,prompt_tokens,output_tokens\n0,1,0\n1,2,3\n2,9000,1\n")
    rej = tmp_path / "rej.csv"
    code, stdout, stderr = _run(str(src), "--max-model-len", "4096", "--rejects", str(rej))
    assert code == 0, stderr
    rows = pacsv.read_csv(rej).to_pylist()
    assert [(r["row"], r["column"]) for r in rows] == [(0, "output_tokens"),
                                                       (2, "prompt_tokens")]
    code, _, stderr = _run(str(src), "--strict")
    assert code == 1 and "row 0, column 'output_tokens'" in stderr


def test_generates_loads(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    code, stdout, stderr = _run("--load", "rate=5,duration=20,prompt=fixed:64", "--seed", "3",
                                "-o", str(out))
    assert code == 0, stderr
    assert pq.read_table(out).num_rows == generate("rate=5,duration=20,prompt=fixed:64",
                                                   seed=3).table.num_rows
    code, _, stderr = _run()
    assert code == 2 and "exactly one of SOURCE" in stderr
    code, _, stderr = _run("--load", "rate=5")
    assert code == 1 and "rate and duration go together" in stderr
    code, _, stderr = _run("--load", "rate=5,duration=2", "--arrival-unit", "ms")
    assert code == 2 and "--arrival-unit does not apply" in stderr
    code, _, stderr = _run(str(MOONCAKE), "--seed", "4")
    assert code == 2 and "--seed does not apply" in stderr


def test_summary_figures() -> None:
    rs = generate("arrival=constant,rate=4,duration=10,output=fixed:3,"
                  "groups=1,prompts_per_group=1,system=32,question=fixed:0", seed=0)
    s = summarise(rs)
    assert (s["accepted"], s["span_s"], s["prompt_max"], s["output_mean"]) == (40, 9.75, 32, 3)
    assert s["mean_rate_per_s"] == 39 / 9.75
    # one prompt of two whole blocks sent 40 times: all but the first two entries repeat
    assert s["repeated_hash_share"] == 78 / 80
