"""The measured layer (issue 34): vLLM's all-reduce priced from measured knots, the reference
one option away, and ``registry fit`` regenerating the knots from operator tables.

The goldens (tests/test_step_golden.py) run under ``Repos(pricing="reference")``; here the
measured default is checked against the law and the tables it came from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.cli import cli
from kernel.model import laws
from kernel.registry_fit import find_table, fit_all_reduce
from kernel.registry_fit.allreduce import curve_at, fit_width, monotone
from kernel.registry_fit.layer import knot_name
from kernel.registry_fit.tables import OperatorTable, choose_version
from pipeline.load import open_inputs
from pipeline.resources import data_dir

REFERENCE = kernel.Repos(pricing="reference")
DS3 = "deepseek-v3-h200-fp8-sglang-tp8"  # tp 8 on h200: custom all-reduce resolved on
TABLES = Path(__file__).parent / "data" / "aisim"
LAYER = data_dir() / "registry" / "layers" / "vllm-0.31.0" / "coefficients"


def _key(k: kernel.Kernel) -> object:
    return k.resolved_pool.collectives[("all_reduce", "tp")]


# --- the law --------------------------------------------------------------------------------

knots_st = st.lists(st.integers(1, 2**30), min_size=2, max_size=12, unique=True).map(sorted)


@settings(max_examples=200, deadline=None)
@given(knots_st, st.data())
def test_knot_time_scalar_and_array_agree_bit_for_bit(xs: list[int], data: st.DataObject) -> None:
    ys = sorted(data.draw(st.lists(st.floats(1e-7, 1e-1), min_size=len(xs), max_size=len(xs))))
    b = data.draw(st.lists(st.floats(0, 4e9), min_size=1, max_size=30))
    knots = [float(x) for x in xs]
    arr = laws.knot_time(np.asarray(b, dtype=np.float64), knots, ys)
    for v, a in zip(b, arr, strict=True):
        s = laws.knot_time(v, knots, ys)
        assert np.float64(s).tobytes() == np.float64(a).tobytes()
    # monotone knots give a non-decreasing law, equal to each knot at its size
    ordered = laws.knot_time(np.sort(np.asarray(b)), knots, ys)
    assert np.all(np.diff(ordered) >= 0)
    for x, y in zip(knots, ys, strict=True):
        assert laws.knot_time(x, knots, ys) == pytest.approx(y, rel=1e-12)


def test_knot_time_below_first_and_past_last() -> None:
    xs, ys = [100.0, 200.0, 400.0], [1.0, 2.0, 6.0]
    assert laws.knot_time(0.0, xs, ys) == 1.0 and laws.knot_time(50.0, xs, ys) == 1.0
    assert laws.knot_time(300.0, xs, ys) == 4.0
    assert laws.knot_time(600.0, xs, ys) == 10.0  # the last segment's slope, 2 per 100 bytes


# --- the switch -----------------------------------------------------------------------------


def test_reference_loads_no_layer_and_measured_loads_the_chips_set() -> None:
    ref = open_inputs(DS3, REFERENCE)
    new = open_inputs(DS3)
    assert [s.name for s in new.coefficients] == [s.name for s in ref.coefficients] \
        + ["vllm-all-reduce-h200", "vllm-attention-decode-h200", "vllm-attention-prefill-h200",
           "vllm-moe-h200"]
    assert "vllm-all-reduce-h200" in new.scenario.coefficients
    assert "vllm-all-reduce-h200" not in ref.scenario.coefficients


def test_unknown_pricing_is_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"pricing='fast'.*\['measured', 'reference'\]"):
        kernel.Repos(pricing="fast")


def test_reference_switch_prices_tp_all_reduce_with_the_nccl_law() -> None:
    ref, new = kernel.open(DS3, REFERENCE), kernel.open(DS3)
    assert _key(ref).knot_bytes == ()
    assert len(_key(new).knot_bytes) == 23
    # only the (all_reduce, tp) key changes
    for op_group, key in ref.resolved_pool.collectives.items():
        other = new.resolved_pool.collectives[op_group]
        if op_group != ("all_reduce", "tp"):
            assert other == key
        else:
            assert dataclasses.replace(other, knot_bytes=(), knot_ns=()) == key


def test_knots_are_the_layer_files_values_for_the_pools_width_and_chip() -> None:
    doc = yaml.safe_load((LAYER / "vllm-all-reduce-h200.yaml").read_text())
    want = {}
    for entry in doc["coefficients"]:
        (name, body), = entry.items()
        if name.startswith("collective_knot_all_reduce_8rank_h200_"):
            want[float(name.rsplit("_", 1)[1][:-1])] = laws.us_to_duration_ns(body["value"])
    key = _key(kernel.open(DS3))
    assert dict(zip(key.knot_bytes, key.knot_ns, strict=True)) == want


def _layer_without(tmp_path: Path, family: str) -> kernel.Repos:
    """The embedded measured layer minus one family's sets (to isolate another's effect)."""
    where = tmp_path / "layer" / "coefficients"
    where.mkdir(parents=True)
    for f in LAYER.glob("*.yaml"):
        if not f.name.startswith(family):
            (where / f.name).write_text(f.read_text())
    return kernel.Repos(layer=str(tmp_path / "layer"))


def test_decode_step_nvlink_term_is_the_knot_law_per_all_reduce(tmp_path: Path) -> None:
    """One decode step's NVLink seconds move by exactly (knot law − NCCL law) × the number of
    TP all-reduces of the step (the counts come from the plan, the laws from the key). The
    MoE engine set (decision MO1, which moves the routed SM term) is left out."""
    ref, new = kernel.open(DS3, REFERENCE), kernel.open(DS3, _layer_without(tmp_path, "vllm-moe-"))
    batch = kernel.Batch([kernel.Request(1, 4095)] * 32, decode_threshold=8)
    nref, nnew = ref.step_time(batch), new.step_time(batch)
    assert nnew.no_overlap < nref.no_overlap
    assert nnew.per_resource[kernel.Resource.SM] == nref.per_resource[kernel.Resource.SM]
    plan = new.resolved_pool.plan
    n = sum(layer.count * sum(1 for c in layer.collectives
                              if c.op == "all_reduce" and c.group == "tp")
            for layer in plan.layers)
    k_ref, k_new = _key(ref), _key(new)
    nbytes = 32 * 7168 * 2.0
    per_new = laws.knot_time(nbytes, k_new.knot_bytes,
                             [laws.duration_seconds(v) for v in k_new.knot_ns])
    per_ref = laws.collective_time(nbytes, k_ref.transition_bps, k_ref.peak_bps,
                                   laws.duration_seconds(k_ref.floor_ns))
    moved = (nref.per_resource[kernel.Resource.NVLINK]
             - nnew.per_resource[kernel.Resource.NVLINK]) / 1e9
    assert moved == pytest.approx(n * (per_ref - per_new), rel=1e-6, abs=2e-9)


def test_disabled_custom_all_reduce_keeps_the_nccl_law() -> None:
    inp = open_inputs(DS3)
    pool = inp.deployment.pools[0]
    engine = dataclasses.replace(pool.engine, disable_custom_all_reduce=True)
    dep = dataclasses.replace(inp.deployment,
                              pools=(dataclasses.replace(pool, engine=engine),))
    k = kernel.new(dataclasses.replace(inp, deployment=dep))
    assert _key(k).knot_bytes == ()


def test_provenance_names_the_table_and_version() -> None:
    rows = [r for r in kernel.open(DS3).provenance() if r.name.startswith("collective_knot_")]
    assert len(rows) == 23
    assert {r.set for r in rows} == {"vllm-all-reduce-h200"}
    assert {r.method for r in rows} == {"measured"}
    frame = kernel.open(DS3).provenance_frame()
    assert not kernel.open(DS3, REFERENCE).provenance_frame()["name"].str.starts_with(
        "collective_knot_").any()
    assert frame["name"].str.starts_with("collective_knot_").sum() == 23


def test_bulk_and_scalar_agree_under_the_measured_layer() -> None:
    """Bulk pricing reads the same knots as the scalar path, bit for bit, across message sizes
    below, between and past the knots (1 to 40,000 tokens of 7,168 hidden at 2 bytes)."""
    from kernel.bulk import price
    k = kernel.open(DS3)
    shapes = [[(1, 4000)], [(1, 100)] * 7, [(512, 0)], [(1, 9000), (64, 0), (1, 30)],
              [(8192, 0), (8192, 0)], [(40_000, 0)]]
    rows = [(b, s, c) for b, reqs in enumerate(shapes) for s, c in reqs]
    df = pl.DataFrame({"batch_id": [r[0] for r in rows], "scheduled": [r[1] for r in rows],
                       "computed": [r[2] for r in rows],
                       "prompt_len": [r[1] + r[2] for r in rows]})
    got = price(k, df).sort("batch_id")
    for b, reqs in enumerate(shapes):
        est = k.step_time(kernel.Batch([kernel.Request(s, c) for s, c in reqs],
                                       decode_threshold=1))
        assert got["no_overlap_ns"][b] == est.no_overlap
        assert got["overlap_ns"][b] == est.overlap


# --- the fit --------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.1, 1e4), min_size=1, max_size=40))
def test_monotone_is_non_decreasing_and_keeps_the_sum(y: list[float]) -> None:
    out = monotone(np.asarray(y))
    assert np.all(np.diff(out) >= -1e-9)
    assert out.sum() == pytest.approx(sum(y), rel=1e-9)
    if all(a <= b for a, b in zip(y, y[1:], strict=False)):
        assert np.allclose(out, y)


def test_fit_recovers_a_piecewise_linear_truth_held_out() -> None:
    sizes = np.array([2.0 ** i for i in range(8, 31)])
    truth = np.array([curve_at(np.array([256.0, 2**18, 2**30]), np.array([3.0, 6.0, 5000.0]), s)
                      for s in sizes])
    f = fit_width(sizes, truth, 8)
    assert f.knot_us == pytest.approx(list(truth))
    # the interior rows that are not knots of the truth are predicted exactly held out
    assert f.held_out == len(sizes) - 2 and f.mape < 0.01


def test_registry_fit_regenerates_the_embedded_knots(tmp_path: Path) -> None:
    out = tmp_path / "layer"
    res = CliRunner().invoke(cli, ["registry", "fit", "--operator-tables", str(TABLES),
                                   "--chip", "h100", "--engine", "vllm:0.31.0", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "8rank" in res.output and "held out 21 rows" in res.output
    fitted = yaml.safe_load((out / "coefficients" / "vllm-all-reduce-h100.yaml").read_text())
    embedded = yaml.safe_load((LAYER / "vllm-all-reduce-h100.yaml").read_text())
    got = {k: v["value"] for e in fitted["coefficients"] for k, v in e.items()}
    ship = {k: v["value"] for e in embedded["coefficients"] for k, v in e.items()}
    eight = {k: v for k, v in ship.items() if "_8rank_" in k}
    assert len(eight) == 23 and all(got[k] == v for k, v in eight.items())
    assert not any("_4rank_" in k for k in got)  # the extract holds 2 and 8 ranks only
    report = pl.read_csv(out / "fit-report.csv")
    assert report["group"].to_list() == ["2rank", "8rank"]
    # the fitted layer prices: the same knots as the embedded layer for h100 at tp 8
    tp8 = str(data_dir() / "measurements/splitwise/scenarios/llama-2-70b-h100-tp8.yaml")
    mine, shipped = kernel.open(tp8, kernel.Repos(layer=str(out))), kernel.open(tp8)
    assert len(_key(mine).knot_bytes) == 23 and _key(mine) == _key(shipped)


def test_nearest_version_is_taken_and_said() -> None:
    assert choose_version(["0.14.0", "0.19.0", "0.24.0"], "0.31.0") == "0.24.0"
    assert choose_version(["0.24.0", "0.31.0"], "0.31.0") == "0.31.0"
    assert choose_version(["0.24.0"], "0.10.0") == "0.24.0"
    t = find_table(TABLES, "h100", "comm", "custom_allreduce_perf", "vllm:0.40.0")
    assert t.version == "0.31.0" and not t.exact


@pytest.mark.parametrize("change, message", [
    (lambda d: d.drop("latency"), r"missing column\(s\) \['latency'\]"),
    (lambda d: d.filter(pl.col("backend") != "vllm_graph"), "no 'vllm_graph' rows"),
    (lambda d: d.with_columns(pl.lit(0.0).alias("latency")), "not positive"),
    (lambda d: d.with_columns(pl.lit("float16").alias("allreduce_dtype")), "only bfloat16"),
])
def test_bad_tables_are_refused_by_name(change: object, message: str) -> None:
    t = find_table(TABLES, "h100", "comm", "custom_allreduce_perf", "vllm:0.31.0")
    bad = OperatorTable(t.path, t.system, t.family, t.backend, t.version, t.requested,
                        change(t.frame))  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        fit_all_reduce(bad)


def test_unknown_chip_and_missing_tables_are_clear_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["registry", "fit", "--operator-tables", str(TABLES),
                                   "--chip", "tpu9", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1 and "no operator-table system" in res.output
    res = CliRunner().invoke(cli, ["registry", "fit", "--operator-tables", str(TABLES),
                                   "--chip", "b200", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1 and "no custom_allreduce_perf.parquet" in res.output


def test_every_shipped_knot_name_matches_its_scope() -> None:
    for path in sorted(LAYER.glob("vllm-all-reduce-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        chip = path.stem.removeprefix("vllm-all-reduce-")
        assert doc["name"] == path.stem
        for entry in doc["coefficients"]:
            (name, body), = entry.items()
            ranks = body["scope"]["tp"][0]
            nbytes = int(name.rsplit("_", 1)[1][:-1])
            assert name == knot_name(ranks, chip, nbytes)
            assert body["scope"]["hardware"] == [chip] and body["method"] == "measured"


# --- attention decode: the per-request term (decision AC4) -----------------------------------

H100 = "llama-3.1-8b-h100-tp1"  # 32 full-attention layers priced by the part-wide pair


def test_measured_layer_carries_the_fitted_attention_law() -> None:
    doc = yaml.safe_load((LAYER / "vllm-attention-decode-h100.yaml").read_text())
    want = {k: v["value"] for e in doc["coefficients"] for k, v in e.items()}
    c = kernel.open(H100).resolved_pool.coefficients
    assert c.attention_per_request_ns == laws.us_to_duration_ns(
        want["attention_decode_per_request"]) > 0
    assert c.attention_floor_ns == laws.us_to_duration_ns(want["attention_decode_floor"])
    assert c.attention_rate_bps == pytest.approx(want["attention_decode_rate"] * 1e6)
    assert kernel.open(H100, REFERENCE).resolved_pool.coefficients.attention_per_request_ns == 0


@pytest.mark.parametrize("n", [1, 7, 64])
def test_per_request_term_adds_its_time_per_request_per_layer(n: int) -> None:
    """The HBM term of an all-decode step grows by exactly requests × layers × the term (the
    fast decode path and the shared path agree: a mixed batch is priced by the latter)."""
    from kernel.model import step
    r = kernel.open(H100).resolved_pool
    zero = dataclasses.replace(r, coefficients=dataclasses.replace(
        r.coefficients, attention_per_request_ns=0))
    one_us = dataclasses.replace(r, coefficients=dataclasses.replace(
        r.coefficients, attention_per_request_ns=1000))
    layers = sum(pl_.count for pl_ in r.plan.layers if pl_.attn_q_heads > 0)
    dec = kernel.Batch([kernel.Request(1, 1000 + 37 * i) for i in range(n)], decode_threshold=8)
    a, b = step.step_time_into(zero, dec, {}), step.step_time_into(one_us, dec, {})
    moved = b.per_resource[kernel.Resource.HBM] - a.per_resource[kernel.Resource.HBM]
    assert abs(moved - layers * n * 1000) <= 1
    mixed = kernel.Batch([kernel.Request(300, 0)] + list(dec.requests), decode_threshold=8)
    a, b = step.step_time_into(zero, mixed, {}), step.step_time_into(one_us, mixed, {})
    assert b.no_overlap >= a.no_overlap


def test_attention_fit_recovers_a_known_law_and_scores_held_out_by_shape() -> None:
    from kernel.registry_fit.attention import design, nonnegative_fit
    rows_ = [{"batch_size": b, "num_heads": h, "num_key_value_heads": kv, "head_dim": d,
              "kv_cache_dtype": "bfloat16", "window_size": 0, "step": s, "latency": 0.0}
             for h, kv, d in [(8, 1, 128), (32, 8, 128), (16, 2, 64)]
             for b in (1, 8, 64) for s in (127, 4095)]
    df = pl.DataFrame(rows_)
    x, _ = design(df)
    truth = np.array([10.0, 0.05, 1 / 3e6])
    df = df.with_columns(pl.Series("latency", (x @ truth) / 1e3))
    x, y = design(df)
    assert nonnegative_fit(x, y) == pytest.approx(truth, rel=1e-6)


def test_gemm_fit_recovers_a_known_ramp_held_out() -> None:
    """GEMM is fitted and scored only (decision AC8): a table made from a known ramp is fitted
    back within the m_half grid's step, and scored near zero held out; tiny shapes are left
    out (they time a launch)."""
    from kernel.registry_fit.gemm import M_HALF_GRID, fit_gemm
    peak, eps, mh = 1e15, 0.8, float(M_HALF_GRID[np.searchsorted(M_HALF_GRID, 150)])
    rows_ = [(m, n, k) for m in (1, 4, 16, 64, 256, 1024, 4096)
             for n in (1024, 4096, 8192, 14336) for k in (1024, 2048, 4096, 8192)]
    m, n, k = (np.array([r[i] for r in rows_], dtype=np.float64) for i in range(3))
    lat_ms = 2 * m * n * k / (peak * eps * m / (m + mh)) * 1e3
    df = pl.DataFrame({"gemm_dtype": ["bfloat16"] * len(rows_), "m": m.astype(int),
                       "n": n.astype(int), "k": k.astype(int), "latency": lat_ms})
    tiny = pl.DataFrame({"gemm_dtype": ["bfloat16"], "m": [1], "n": [8], "k": [8],
                         "latency": [1.0]})  # a launch-bound row, ignored
    t = OperatorTable(Path("synthetic.parquet"), "h100_sxm", "gemm", "vllm", "0.31.0",
                      "0.31.0", pl.concat([df, tiny]))
    f = fit_gemm(t, "bfloat16", peak)
    assert f.rows == len(rows_) and f.eps_max == pytest.approx(eps, rel=1e-9)
    assert f.m_half == mh and f.mape < 1e-9


def test_prefill_family_replaces_the_absent_a100_pair() -> None:
    """A100's prefill attention pair is absent in the reference (its work rides the dense ramp,
    an assumption); the measured layer prices it with the fitted pair (decision AC9)."""
    a100 = str(data_dir() / "measurements/splitwise/scenarios/llama-2-70b-a100-sxm-tp2.yaml")
    doc = yaml.safe_load((LAYER / "vllm-attention-prefill-a100-sxm.yaml").read_text())
    want = {k: v["value"] for e in doc["coefficients"] for k, v in e.items()}
    ref, new = kernel.open(a100, REFERENCE), kernel.open(a100)
    assert ref.resolved_pool.coefficients.attention_prefill_scale == 0.0
    c = new.resolved_pool.coefficients
    assert c.attention_prefill_scale == want["attention_prefill_work_scale"]
    assert c.attention_prefill_floor_ns == laws.us_to_duration_ns(want["attention_prefill_floor"])
    assert "attention_prefill_work_scale" in {r.name for r in new.provenance()
                                              if r.set == "vllm-attention-prefill-a100-sxm"}
    # a long prompt's attention now costs its measured work instead of the dense ramp's
    batch = kernel.Batch([kernel.Request(8192, 0)], decode_threshold=1)
    assert new.step_time(batch).per_resource[kernel.Resource.SM] \
        != ref.step_time(batch).per_resource[kernel.Resource.SM]


def test_prefill_fit_recovers_a_known_term() -> None:
    from kernel.registry_fit.attention import nonnegative_fit, prefill_design
    df = pl.DataFrame([{"batch_size": b, "isl": s, "num_heads": h, "num_key_value_heads": kv,
                        "head_dim": d, "latency": 0.0}
                       for h, kv, d in [(8, 1, 128), (32, 8, 128), (16, 16, 64)]
                       for b in (1, 4, 16) for s in (128, 1024, 8192)])
    x, _ = prefill_design(df, 312e12, 0.9, 90.0)
    df = df.with_columns(pl.Series("latency", (x @ np.array([15.0, 1 / 0.5])) / 1e3))
    x, y = prefill_design(df, 312e12, 0.9, 90.0)
    assert nonnegative_fit(x, y) == pytest.approx([15.0, 2.0], rel=1e-6)
