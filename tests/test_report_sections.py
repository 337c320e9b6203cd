"""The report's trace sections: windows and rolling quantiles, limits, honest units, the
sections themselves, and sweep/compare reporting the same measure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.bulk.summary import nearest_rank, summarise
from kernel.model.display import fmt_duration, fmt_long, fmt_span
from kernel.report import charts, html, trace_stats

from .test_report import FakeKernel, assert_self_contained, parse, priced_frame


def test_durations_read_as_people_write_them() -> None:
    assert fmt_duration(195_123e9) == "195,100 s"
    assert fmt_duration(2_692.4e9) == "2,692 s"
    assert fmt_duration(99.44e9) == "99.4 s"
    assert fmt_span((2 * 86_400 + 6 * 3_600 + 40) * 1e9) == "2 d 6 h"
    assert fmt_span((3 * 3_600 + 12 * 60) * 1e9) == "3 h 12 min"
    assert fmt_span(3_600e9) == "1 h"
    assert fmt_long(195_123e9) == "2 d 6 h (195,100 s)"
    assert fmt_long(1.5e6) == "1.5 ms"
    for ns in (1e11, 1.951e14, 9.99e15):
        assert "e+" not in fmt_duration(ns) and "e+" not in fmt_long(ns)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), cap=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_windows_hold_each_windows_nearest_rank_quantiles(n: int, cap: int, seed: int) -> None:
    v = np.random.default_rng(seed).integers(1, 10**9, n)
    w = trace_stats.windows(v, max_windows=cap)
    assert w.n <= cap and int(w.counts.sum()) == n
    assert w.wall_end_ns[-1] == v.sum()
    for i in range(w.n):
        part = v[w.starts[i]:w.starts[i] + w.counts[i]]
        assert w.p50_ns[i] == nearest_rank(part, 0.5)
        assert w.p99_ns[i] == nearest_rank(part, 0.99)
        assert w.max_ns[i] == part.max()
        assert w.wall_ns[i] == part.sum()


def test_limits_come_from_the_limits_column_when_present() -> None:
    df = priced_frame(6)
    derived = trace_stats.limit_flags(df, max_num_batched_tokens=150, max_num_seqs=30)
    assert set(derived.flags) == {"max_num_batched_tokens", "max_num_seqs"}
    want = (df["tokens"] > 150).to_numpy() | (df["requests"] > 30).to_numpy()
    assert (derived.any == want).all()
    as_list = df.with_columns(pl.Series("limits", [[], ["max_num_seqs"], [], ["kv", "max_num_seqs"],
                                                   [], []], dtype=pl.List(pl.String)))
    got = trace_stats.limit_flags(as_list, max_num_batched_tokens=1)
    assert got.source.startswith("the priced trace's") and got.count == 2
    assert got.flags["kv"].tolist() == [False, False, False, True, False, False]
    as_text = df.with_columns(pl.Series("limits", ["", "a", None, "a,b", "", "b"]))
    got = trace_stats.limit_flags(as_text)
    assert got.flags["b"].tolist() == [False, False, False, True, False, True]
    assert got.count == 3
    as_bits = df.with_columns(pl.Series("limits", [0, 1, 0, 4, 5, 0]))
    got = trace_stats.limit_flags(as_bits)
    assert got.flags["bit0"].tolist() == [False, True, False, False, True, False]
    assert got.count == 3
    with pytest.raises(ValueError, match="limits"):
        trace_stats.limit_flags(df.with_columns(pl.lit(1.5).alias("limits")))


def _full_frame(n: int = 3000) -> pl.DataFrame:
    rng = np.random.default_rng(3)
    df = priced_frame(n)
    t = df["no_overlap_ns"].to_numpy()
    return df.with_columns(
        pl.Series("prefill_tokens", rng.integers(0, 100, n)),
        pl.Series("kv_blocks", rng.integers(0, 900, n)),
        pl.Series("flops", rng.random(n) * 1e12), pl.Series("hbm_bytes", rng.random(n) * 1e9),
        pl.Series("nvlink_bytes", rng.random(n) * 1e6), pl.Series("nic_bytes", np.zeros(n)),
        pl.Series("mfu", rng.random(n) * 0.4), pl.Series("mbu", rng.random(n) * 0.9),
        pl.Series("limits", np.where(t > np.quantile(t, 0.99), "max_num_seqs", "")))


def test_every_trace_section_renders_with_the_columns_present() -> None:
    df = _full_frame()
    k = FakeKernel()
    page = html.trace_report(df, k, title="t")  # type: ignore[arg-type]
    assert_self_contained(page)  # the raster layers are data: URIs inside the SVG
    ids = parse(page).ids
    for sid in ("throughput", "step-timeline", "step-vs-tokens", "utilisation", "limits"):
        assert sid in ids, sid
    for cid in ("chart-throughput", "chart-step-timeline", "chart-step-vs-tokens",
                "chart-utilisation"):
        assert f'<svg id="{cid}"' in page, cid
    assert "prefill tokens/s" in page and "decode tokens/s" in page
    assert f"{int((df['limits'] != '').sum()):,} of {df.height:,} steps break" in page
    # The whole-trace MFU is the time-weighted mean of the per-step MFU.
    t = df["no_overlap_ns"].to_numpy()
    whole = float((df["mfu"].to_numpy() * t).sum() / t.sum())
    assert f"{whole:.1%}" in page
    # The fake kernel has no KV capacity, and there is no request-level trace: the sections
    # say what they need instead of drawing nothing.
    assert "pass --scenario" not in page or "kv-occupancy" in ids
    assert "--trace" in page


def test_sections_say_which_columns_are_missing() -> None:
    page = html.trace_report(priced_frame(), None, title="t")
    assert "has no utilisation columns" in page and "--utilisation" in page
    assert "has no kv_blocks column" in page
    assert "all tokens/s" in page  # no prefill_tokens column: not split by phase
    page = html.trace_report(_full_frame(500), None, title="t")
    assert "KV capacity needs the scenario" in page


def test_report_size_does_not_grow_with_the_trace() -> None:
    # Past the caps (500 windows, 40,000 scatter points) three times the steps draw the same
    # number of points: the page stays within a few percent, and far under a megabyte.
    small = len(html.trace_report(_full_frame(50_000), None))
    big = len(html.trace_report(_full_frame(150_000), None))
    assert big < 1.1 * small and big < 1_500_000, (small, big)


def test_wall_time_and_gpu_time_are_never_mixed() -> None:
    import kernel

    k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
    s = summarise(priced_frame(), k)
    assert s.gpus == 8
    assert s.gpu_ns() == s.total_no_overlap_ns * 8
    text = "\n".join(s.lines())
    assert "wall time" in text and f"{s.total_no_overlap_ns * 8 / 1e9:,.0f} GPU-s" in text
    assert "GPU time" not in html._summary_html(summarise(priced_frame()))  # no kernel: no GPUs


def test_anatomy_greys_out_batches_the_pool_cannot_hold() -> None:
    import kernel
    from kernel.facade.summary import anatomy_sweep, batch_limit

    k = kernel.open("llama-3.1-8b-h100-tp1")
    lim = batch_limit(k, 32768)
    cap = k.kv_capacity()
    per = k.sequence_variable_bytes(32768) + k.sequence_admission_bytes()
    assert lim is not None and lim.size == cap.num_blocks * cap.page_bytes // per
    assert lim.size == math.floor(cap.max_concurrency)  # vLLM's report at max_model_len
    assert "KV capacity" in lim.reason
    lim_small = batch_limit(k, 256)
    assert lim_small is not None and lim_small.reason == "max_num_seqs = 256"
    fig = charts.anatomy_figure(anatomy_sweep(k, 32768, range(1, 33)), context=32768, limit=lim)
    assert "the pool cannot hold these batches" in charts.to_svg(fig, "a")
    from kernel.facade.summary import bottleneck_grid

    grid = bottleneck_grid(k, sizes=(1, 8, 64), contexts=(1024, 32768))
    fig = charts.bottleneck_map_figure(grid, limits={32768: lim.size})
    assert "beyond what the pool holds" in charts.to_svg(fig, "m")
    fig = charts.bottleneck_map_figure(grid, limits={32768: 64})  # every cell held
    assert "beyond what the pool holds" not in charts.to_svg(fig, "m")


def test_sweep_reports_shares_of_time_as_compare_does(tmp_path: Path) -> None:
    from kernel.sweep.distributed import summarise as sweep_summary

    df = priced_frame(500)
    part = tmp_path / "scenario=x"
    part.mkdir()
    df.write_parquet(part / "p0.parquet")
    got = sweep_summary(tmp_path).row(0, named=True)
    want = summarise(df).bottleneck_share("time")
    for r in ("sm", "hbm", "nvlink", "nic", "host"):
        assert got[f"share_{r}"] == pytest.approx(want.get(r, 0.0), abs=1e-12), r


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 300))
def test_median_step_is_the_stable_sorts_middle(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    df = pl.DataFrame({"no_overlap_ns": rng.integers(1, 6, n),  # many ties
                       "prefill_requests": rng.integers(0, 2, n),
                       "tokens": rng.integers(0, 3, n)})
    for prefill in (False, True):
        pre = df["prefill_requests"].to_numpy() > 0
        idx = np.flatnonzero((pre if prefill else ~pre) & (df["tokens"].to_numpy() > 0))
        got = trace_stats.median_step(df, prefill)
        if idx.size == 0:
            assert got is None
            continue
        order = np.argsort(df["no_overlap_ns"].to_numpy()[idx], kind="stable")
        assert got == idx[order[math.ceil(0.5 * idx.size) - 1]]


def test_cli_price_utilisation_then_report_with_trace(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kernel.cli import cli
    from kernel.io.synth import write_synth

    trace = tmp_path / "trace.parquet"
    write_synth(trace, 300, requests_per_batch=24, seed=3)
    ds3 = "deepseek-v3-h200-fp8-sglang-tp8"
    r = CliRunner().invoke(cli, ["price", str(trace), "--scenario", ds3, "--utilisation",
                                 "--no-progress", "-o", str(tmp_path / "p.parquet")])
    assert r.exit_code == 0, r.output
    priced = pl.read_parquet(tmp_path / "p.parquet")
    assert {"flops", "mfu", "mbu", "kv_blocks", "prefill_tokens"} <= set(priced.columns)
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "p.parquet"), "--scenario", ds3,
                                 "--trace", str(trace), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    ids = parse((tmp_path / "r.html").read_text()).ids
    for cid in ("chart-utilisation", "chart-kv-occupancy", "chart-layer-kinds"):
        assert cid in ids, cid
