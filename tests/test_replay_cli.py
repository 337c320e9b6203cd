"""``blis-kernel replay``: stamped outputs, the printed summary and bad options."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import kernel
from kernel.cli import cli
from kernel.cli.replay import parse_slo


def _requests(tmp_path):
    rng = np.random.default_rng(2)
    n = 40
    path = tmp_path / "reqs.parquet"
    pq.write_table(pa.table({"request_id": [f"q{i}" for i in range(n)],
                             "arrival_ns": np.cumsum(rng.integers(0, 10**8, n)),
                             "prompt_tokens": rng.integers(10, 2000, n),
                             "output_tokens": rng.integers(1, 40, n)}), path)
    return path


def test_replay_writes_stamped_outputs(tmp_path):
    src = _requests(tmp_path)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["replay", str(src), "--scenario", "llama-3.1-8b-h100-tp1",
                                 "-o", str(out), "--slo", "ttft=1s,itl=100ms",
                                 "--estimate", "overlap", "--no-async-scheduling"])
    assert r.exit_code == 0, r.output
    assert "replayed 40 requests (40 finished, 0 rejected)" in r.output
    for name, kind in (("requests", "replay-requests"), ("steps", "replay-steps"),
                       ("engine_steps", "replay-engine-steps"), ("summary", "replay-summary"),
                       ("rejects", "replay-rejects")):
        st = kernel.read_stamp(out / f"{name}.parquet")
        assert st is not None and st.kind == kind
        assert st.scenario == "llama-3.1-8b-h100-tp1"
        assert st.options["replay"]["estimate"] == "overlap"
        assert st.options["replay"]["async_scheduling"] is False
        assert st.options["slo"] == {"ttft": 1.0, "itl": 0.1}
        assert st.trace["source"] == str(src)
    req = pq.read_table(out / "requests.parquet")
    assert req.num_rows == 40 and req.column("request_id").to_pylist()[0] == "q0"
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["finished"] == 40 and 0 <= summary["slo_attainment"] <= 1
    # the steps file re-prices under the same scenario to the step prices it records
    steps = pq.read_table(out / "steps.parquet")
    k = kernel.open("llama-3.1-8b-h100-tp1")
    priced = k.price(steps).sort("batch_id")
    eng = pq.read_table(out / "engine_steps.parquet").sort_by("batch_id")
    assert priced["overlap_ns"].to_list() == eng.column("batch_ns").to_pylist()


def test_bad_slo_is_refused(tmp_path):
    src = _requests(tmp_path)
    r = CliRunner().invoke(cli, ["replay", str(src), "--scenario", "llama-3.1-8b-h100-tp1",
                                 "-o", str(tmp_path / "o"), "--slo", "ttft=fast"])
    assert r.exit_code != 0
    assert "expected KEY=DURATION" in r.output


def test_parse_slo_units():
    assert parse_slo("ttft=2s,itl=50ms,e2e=3,tpot=200us") == pytest.approx({
        "ttft": 2.0, "itl": 0.05, "e2e": 3.0, "tpot": 0.0002})
    assert parse_slo(None) is None
