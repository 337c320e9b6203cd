"""Capacity planning (issue 29 item 4): kernel.replay.capacity.sweep_rates and replay --rates.

The curve is monotone where it must be, the highest rate within the SLOs agrees with a
brute-force check over replays run here from scratch, and local processes give the table one
process gives."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from kernel.cli import cli
from kernel.replay import ReplayOptions, generate, parse_load, replay, scale_rate
from kernel.replay.capacity import (
    base_rate,
    max_rate_within_slo,
    sweep_rates,
)
from tests.replay_support import kernel_for

S = "llama-3.1-8b-h100-tp1"
SPEC = "rate=4,duration=12,prompt=fixed:1024,output=fixed:64"
RATES = [1.0, 4.0, 16.0, 48.0, 96.0]
SLO = {"ttft": 0.2, "itl": 0.03}


@pytest.fixture(scope="module")
def trace():
    return generate(parse_load(SPEC), seed=3)


@pytest.fixture(scope="module")
def inline(trace):
    return sweep_rates([S], trace, RATES, slo=SLO, cluster="inline")


def test_mean_ttft_never_falls_as_the_rate_rises_for_a_trace(inline):
    rows = inline.curve.to_pylist()
    assert [r["rate"] for r in rows] == RATES
    ttft = [r["ttft_s_mean"] for r in rows]
    assert all(b >= a for a, b in zip(ttft, ttft[1:], strict=False)), ttft
    assert ttft[-1] > 2 * ttft[0]  # the sweep reaches saturation: the check has teeth
    # the same requests at every rate (scale_rate), arriving sooner
    assert {r["requests"] for r in rows} == {inline.curve.column("requests")[0].as_py()}


def test_mean_ttft_never_falls_as_the_rate_rises_for_a_load_spec():
    res = sweep_rates([S], parse_load(SPEC), [2.0, 8.0, 24.0, 64.0], cluster="inline", seed=5)
    rows = res.curve.to_pylist()
    ttft = [r["ttft_s_mean"] for r in rows]
    assert all(b >= a for a, b in zip(ttft, ttft[1:], strict=False)), ttft
    # a spec keeps its duration: more requests at a higher rate
    assert [r["requests"] for r in rows] == sorted(r["requests"] for r in rows)
    assert rows[-1]["requests"] > 10 * rows[0]["requests"]
    assert res.max_rate.column("max_rate").to_pylist() == [None]  # no SLO, no answer


def test_max_rate_matches_a_brute_force_check(trace, inline):
    k = kernel_for(S)
    base = base_rate(trace)
    meets = []
    for rate in RATES:
        res = replay(k, scale_rate(trace, rate / base), ReplayOptions())
        req = res.requests.to_pylist()
        good = sum(1 for r in req if r["status"] == "finished"
                   and r["ttft_ns"] <= SLO["ttft"] * 1e9
                   and (r["itl_p99_ns"] is None or r["itl_p99_ns"] <= SLO["itl"] * 1e9))
        meets.append(good >= 0.9 * len(req))
        row = next(x for x in inline.curve.to_pylist() if x["rate"] == rate)
        assert row["goodput_requests"] == good
        assert row["ttft_s_p99"] == pytest.approx(
            np.percentile([r["ttft_ns"] for r in req], 99) / 1e9, rel=1e-12)
        assert row["meets_slo"] == meets[-1]
    expected = None
    for rate, ok in zip(RATES, meets, strict=True):
        if not ok:
            break
        expected = rate
    assert True in meets and False in meets  # the SLO splits the sweep
    assert inline.max_rate.to_pylist() == [{"scenario": S, "max_rate": expected,
                                            "rates_swept": len(RATES)}]


@given(st.lists(st.tuples(st.integers(1, 10_000), st.booleans()), min_size=1, max_size=12,
                unique_by=lambda x: x[0]))
def test_max_rate_within_slo_is_the_top_of_the_passing_run(points):
    rates = [float(r) for r, _ in points]
    meets = [m for _, m in points]
    got = max_rate_within_slo(rates, meets)
    # brute force: a rate counts when it and every lower rate pass
    ok = [r for r in rates if all(m for r2, m in zip(rates, meets, strict=True) if r2 <= r)]
    assert got == (max(ok) if ok else None)


def test_local_processes_give_the_table_of_one_process(trace, inline):
    procs = sweep_rates([S], trace, RATES, slo=SLO, cluster="local:2")
    assert procs.executor.startswith("local:2")
    assert procs.curve.equals(inline.curve)
    assert procs.max_rate.equals(inline.max_rate)


def test_the_command_writes_stamped_curve_and_max_rate(tmp_path):
    out = tmp_path / "cap"
    res = CliRunner().invoke(cli, ["replay", SPEC, "--scenario", S, "--scenario",
                                   "qwen3-30b-a3b-h100-tp2", "--rates", "2,16,64", "--slo",
                                   "ttft=200ms,itl=30ms", "--cluster", "inline", "-o", str(out)])
    assert res.exit_code == 0, res.output
    curve = pq.read_table(out / "curve.parquet")
    best = pq.read_table(out / "max_rate.parquet")
    assert curve.num_rows == 6
    assert curve.column("scenario").to_pylist() == [S] * 3 + ["qwen3-30b-a3b-h100-tp2"] * 3
    from kernel.io.stamp import read_stamp

    st_ = read_stamp(out / "curve.parquet")
    assert st_ is not None and st_.kind == "replay-capacity-curve"
    assert st_.scenarios == (S, "qwen3-30b-a3b-h100-tp2")
    assert st_.options["slo"] == {"ttft": 0.2, "itl": 0.03}
    assert any(key.startswith(f"{S}/pool0/") for key in st_.documents)
    for r in best.to_pylist():  # each scenario's answer printed as written
        rows = [x for x in curve.to_pylist() if x["scenario"] == r["scenario"]]
        assert r["max_rate"] == max_rate_within_slo([x["rate"] for x in rows],
                                                    [x["meets_slo"] for x in rows])
        said = (f"{r['scenario']}: no swept rate" if r["max_rate"] is None else
                f"{r['scenario']}: highest rate within the SLOs {r['max_rate']:g} requests/s")
        assert said in res.output


@pytest.mark.parametrize("bad,needle", [
    ({"rates": []}, "rates must be"), ({"rates": [2.0, -1.0]}, "rates must be"),
    ({"rates": [2.0, 2.0]}, "repeat"), ({"min_attainment": 0.0}, "min_attainment"),
])
def test_bad_arguments_are_refused(trace, bad, needle):
    args = {"rates": [1.0], **bad}
    with pytest.raises(ValueError, match=needle):
        sweep_rates([S], trace, args.pop("rates"), cluster="inline", **args)


def test_a_closed_loop_has_no_rate_to_sweep():
    with pytest.raises(ValueError, match="closed-loop"):
        sweep_rates([S], parse_load("users=2,requests_per_user=2"), [1.0], cluster="inline")
