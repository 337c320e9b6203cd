"""The serving section of the HTML report (issue 29 item 3): a replay's directory in, the
figures present, and the numbers those of the replay's own tables (recomputed here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.cli import cli
from kernel.report.serving import SERVING_CHART_IDS, in_flight, read_serving

S = "llama-3.1-8b-h100-tp1"
SPEC = "rate=6,duration=8,prompt=uniform:256:2048,output=uniform:8:96"


@pytest.fixture(scope="module")
def replay_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serving") / "out"
    res = CliRunner().invoke(cli, ["replay", SPEC, "--scenario", S, "-o", str(out), "--slo",
                                   "ttft=60ms,itl=12ms", "--report"])
    assert res.exit_code == 0, res.output
    return out


def _values(page: str) -> dict[str, object]:
    return {k: json.loads(v.replace("&quot;", '"')) for k, v in
            re.findall(r'data-key="([^"]+)" data-value="([^"]*)"', page)}


def test_replay_report_has_the_serving_section_and_its_figures(replay_dir):
    page = (replay_dir / "report.html").read_text()
    assert "<section id='serving'>" in page
    for key in ("latency", "latency_time", "in_flight", "kv"):
        assert f'<svg id="{SERVING_CHART_IDS[key]}"' in page, key
    assert SERVING_CHART_IDS["capacity"] not in page  # one replay: no curve


def test_the_summary_numbers_are_the_replays_tables(replay_dir):
    page = (replay_dir / "report.html").read_text()
    got = _values(page)
    req = pq.read_table(replay_dir / "requests.parquet").to_pylist()
    done = [r for r in req if r["status"] == "finished"]
    ttft = np.array([r["ttft_ns"] for r in done], np.float64)
    e2e = np.array([r["e2e_ns"] for r in done], np.float64)
    assert got["requests"] == len(req) and got["finished"] == len(done)
    for q in (50, 90, 99):
        assert got[f"ttft_s_p{q}"] == pytest.approx(np.percentile(ttft, q) / 1e9, rel=1e-12)
        assert got[f"e2e_s_p{q}"] == pytest.approx(np.percentile(e2e, q) / 1e9, rel=1e-12)
    span = (max(r["finish_ns"] for r in done) - min(r["arrival_ns"] for r in done)) / 1e9
    assert got["throughput_rps"] == pytest.approx(len(done) / span, rel=1e-12)
    good = [r for r in done if r["ttft_ns"] <= 0.06e9
            and (r["itl_p99_ns"] is None or r["itl_p99_ns"] <= 0.012e9)]
    assert 0 < len(good) < len(done)  # the SLOs bite: the goodput is not trivially all/none
    assert got["goodput_requests"] == len(good)
    assert got["goodput_rps"] == pytest.approx(len(good) / span, rel=1e-12)
    es = pq.read_table(replay_dir / "engine_steps.parquet").to_pylist()
    assert got["kv_occupancy_max"] == pytest.approx(max(s["kv_used"] / s["kv_blocks"]
                                                        for s in es), rel=1e-12)
    slos = re.search(r"SLOs: ([^<]*)\.</p>", page)
    assert slos is not None
    assert sorted(slos.group(1).split(", ")) == ["itl ≤ 12.000 ms", "ttft ≤ 60.000 ms"]


def test_report_command_on_the_directory_gives_the_same_section(replay_dir, tmp_path):
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(replay_dir), "-o", str(out)])
    assert res.exit_code == 0, res.output
    a = _values(out.read_text())
    b = _values((replay_dir / "report.html").read_text())
    assert a == b and a


def test_report_refuses_a_directory_that_is_no_replay(tmp_path):
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2
    assert "not a replay's output" in res.output


def test_capacity_report_has_the_curve(tmp_path):
    out = tmp_path / "cap"
    res = CliRunner().invoke(cli, ["replay", "rate=4,duration=6,prompt=fixed:512,output=fixed:32",
                                   "--scenario", S, "--rates", "2,32,128", "--slo", "ttft=80ms",
                                   "--cluster", "inline", "-o", str(out), "--report"])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert f'<svg id="{SERVING_CHART_IDS["capacity"]}"' in page
    table = page[page.index("<table id='capacity-curve'>"):]
    table = table[:table.index("</table>")]
    curve = pq.read_table(out / "curve.parquet").to_pylist()
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    assert len(rows) == len(curve)
    for html_row, r in zip(rows, curve, strict=True):
        cell = re.search(r'data-key="ttft_s_p99">([^<]*)<', html_row)
        assert cell is not None and cell.group(1) == f"{r['ttft_s_p99'] * 1e3:,.3f}"
    best = pq.read_table(out / "max_rate.parquet").to_pylist()[0]["max_rate"]
    assert (f"highest rate within the SLOs {best:g} requests/s" in page if best is not None
            else "no swept rate meets the SLOs" in page)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30), st.integers(0, 60)),
                min_size=1, max_size=15))
def test_in_flight_and_queued_count_the_requests_at_each_instant(spans):
    arrival = [a for a, _, _ in spans]
    admitted = [a + q for a, q, _ in spans]
    finish = [a + q + f + 1 for a, q, f in spans]
    table = pa.table({"arrival_ns": arrival, "admitted_ns": admitted, "finish_ns": finish,
                      "status": ["finished"] * len(spans)})
    t, flying, queued = in_flight(table)
    for ti, fl, qu in zip(t.tolist(), flying.tolist(), queued.tolist(), strict=True):
        assert fl == sum(1 for a, f in zip(arrival, finish, strict=True) if a <= ti < f)
        assert qu == sum(1 for a, d in zip(arrival, admitted, strict=True) if a <= ti < d)
    assert t[-1] == max(finish) and flying[-1] == 0


def test_read_serving_names_a_broken_summary(replay_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pq.read_table(replay_dir / "requests.parquet"), bad / "requests.parquet")
    (bad / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="summary.json"):
        read_serving(bad)


def test_a_replay_that_rejects_every_request_still_reports(tmp_path):
    out = tmp_path / "rej"
    res = CliRunner().invoke(cli, ["replay", "rate=2,duration=3,prompt=fixed:2000000,"
                                   "output=fixed:16", "--scenario", S, "-o", str(out), "--report"])
    assert res.exit_code == 0, res.output
    got = _values((out / "report.html").read_text())
    rejected = pq.read_table(out / "rejects.parquet").num_rows
    assert rejected > 0 and got["rejected"] == rejected and got["finished"] == 0
