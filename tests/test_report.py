"""Charts and reports: the numbers, the figures, the HTML, and the anatomy/report/compare CLI."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from kernel.bulk.summary import RESOURCES, nearest_rank, summarise
from kernel.facade.summary import (
    AnatomyPoint,
    BottleneckGrid,
    anatomy_sweep,
    bottleneck_grid,
    decode_batch,
)
from kernel.model.display import fmt_duration
from kernel.model.types import Override, Resolution, Resource, StepEstimate
from kernel.report import charts, html

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- fixtures -----------------------------------------------------------------------------------

def priced_frame(n: int = 400, seed: int = 1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sm = rng.integers(1_000, 40_000, n)
    hbm = rng.integers(1_000, 40_000, n)
    nv = rng.integers(0, 5_000, n)
    host = np.full(n, 700)
    per = np.stack([sm, hbm, nv, np.zeros(n, np.int64), host])
    bott = np.array(RESOURCES)[per.argmax(axis=0)]
    no = per.sum(axis=0)
    return pl.DataFrame({
        "batch_id": np.arange(n), "overlap_ns": per.max(axis=0) + host, "no_overlap_ns": no,
        "bottleneck": bott, "sm_ns": sm, "hbm_ns": hbm, "nvlink_ns": nv,
        "nic_ns": np.zeros(n, np.int64), "host_ns": host, "tokens": rng.integers(1, 300, n),
        "requests": rng.integers(1, 64, n), "prefill_requests": np.ones(n, np.int64),
        "decode_requests": rng.integers(0, 63, n)})


class FakeKernel:
    """Enough of :class:`kernel.facade.kernel.Kernel` for the report: HBM grows with context,
    SM with tokens; host is a constant."""

    def __init__(self) -> None:
        self.resolved_pool = SimpleNamespace(
            scenario="fake-scenario", pool_index=0, role="both", model_name="FakeModel",
            chip_name="FakeChip", served_dtype="fp8", max_model_len=32768,
            max_num_batched_tokens=8192, max_num_seqs=256, uniform_decode_width=1)

    def step_time_into(self, batch: Any, per: dict[Resource, int] | None) -> StepEstimate:
        toks = sum(r.scheduled for r in batch.requests)
        ctx = sum(r.computed for r in batch.requests)
        vals = {Resource.SM: 200 * toks, Resource.HBM: 8_000 + ctx // 8,
                Resource.NVLINK: 1_000 + 10 * toks, Resource.NIC: 0, Resource.HOST: 500}
        if per is not None:
            per.clear()
            per.update(vals)
        best = max(vals, key=lambda r: vals[r])
        return StepEstimate(max(vals.values()), sum(vals.values()), best, dict(vals))

    def step_time(self, batch: Any) -> StepEstimate:
        return self.step_time_into(batch, {})

    def resolved(self) -> Resolution:
        return Resolution(8, 1, 1, "nccl", True, False, False,
                          (Override("block_size", "16", "64", "<MLA needs 64>"),))

    def provenance(self) -> list[Any]:
        return [SimpleNamespace(name="hbm_bw", set="vendor", method="vendor_spec", scope="chip"),
                SimpleNamespace(name="sm_eff", set="fit", method="measured", scope="model"),
                SimpleNamespace(name="overlap", set="kernel", method="assumed", scope="all")]

    def evidence(self) -> tuple[int, int, list[str]]:
        return 2, 3, ["overlap"]

    def graph_modes(self) -> tuple[str, str]:
        return ("FULL", "PIECEWISE")


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k == "id" and v:
                assert v not in self.ids, f"duplicate id {v}"
                self.ids[v] = tag


def parse(text: str) -> _Ids:
    p = _Ids()
    p.feed(text)
    p.close()
    return p


def assert_self_contained(text: str) -> None:
    assert "<script" not in text.lower()
    # Namespaces (xmlns="http://www.w3.org/...") are names, not fetches; nothing is loaded.
    for attr in re.findall(r'\b(?:src|href|xlink:href)="([^"]*)"', text):
        assert attr.startswith(("data:", "#")), attr
    assert "@import" not in text and not re.search(r"url\((?!#)", text)


# -- the numbers -----------------------------------------------------------------------------

def test_nearest_rank_is_an_observed_value() -> None:
    values = [5, 1, 4, 2, 3]
    assert nearest_rank(values, 0.5) == 3
    assert nearest_rank(values, 0.99) == 5
    assert nearest_rank(values, 0.2) == 1
    assert nearest_rank([], 0.5) == 0
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10**9, 1001)
    assert nearest_rank(x, 0.99) == int(np.sort(x)[math.ceil(0.99 * 1001) - 1])


def test_fmt_duration_units() -> None:
    assert fmt_duration(999) == "999 ns"
    assert fmt_duration(12_345) == "12.3 µs"
    assert fmt_duration(12_345_678) == "12.3 ms"
    assert fmt_duration(3_210_000_000) == "3.21 s"


def test_summarise_agrees_with_the_frame() -> None:
    df = priced_frame()
    s = summarise(df, FakeKernel())  # type: ignore[arg-type]
    no = df["no_overlap_ns"].to_numpy()
    assert s.batches == df.height
    assert s.total_no_overlap_ns == int(no.sum())
    assert s.total_overlap_ns == int(df["overlap_ns"].sum())
    assert s.p50_no_overlap_ns == int(np.sort(no)[math.ceil(0.5 * df.height) - 1])
    assert s.p99_no_overlap_ns == int(np.sort(no)[math.ceil(0.99 * df.height) - 1])
    assert sum(s.bottleneck_batches.values()) == df.height
    assert sum(s.bottleneck_time_ns.values()) == s.total_no_overlap_ns
    for r, n in s.bottleneck_batches.items():
        assert n == df.filter(pl.col("bottleneck") == r).height
    assert list(s.bottleneck_batches) == [r for r in RESOURCES if r in s.bottleneck_batches]
    assert math.isclose(sum(s.bottleneck_share("time").values()), 1.0)
    assert s.evidence == (2, 3) and s.scenario == "fake-scenario"
    text = "\n".join(s.lines())
    for needle in ("batches", "wall time", "p50", "p99", "bottleneck", "2/3"):
        assert needle in text


def test_summarise_an_empty_trace() -> None:
    s = summarise(priced_frame().head(0))
    assert s.batches == 0 and s.total_no_overlap_ns == 0 and s.p99_no_overlap_ns == 0
    assert s.bottleneck_batches == {} and s.evidence is None
    assert s.lines()


def test_sweeps_use_uniform_decode_batches() -> None:
    k: Any = FakeKernel()
    b = decode_batch(k, 7, 4096)
    assert len(b.requests) == 7 and all(r.scheduled == 1 and r.computed == 4095
                                        for r in b.requests)
    pts = anatomy_sweep(k, 4096, range(1, 65))
    assert [p.batch_size for p in pts] == list(range(1, 65))
    for p in pts:
        est = k.step_time(decode_batch(k, p.batch_size, 4096))
        assert (p.overlap_ns, p.no_overlap_ns, p.bottleneck) == (est.overlap, est.no_overlap,
                                                                   str(est.bottleneck))
        assert sum(p.per_resource.values()) == p.no_overlap_ns
    grid = bottleneck_grid(k, sizes=(1, 16, 64), contexts=(1024, 8192, 65536))
    assert grid.contexts == (1024, 8192)  # past max_model_len dropped
    assert len(grid.cells) == 2 and all(len(row) == 3 for row in grid.cells)
    assert set(grid.resources()) <= set(RESOURCES)


# -- the figures ------------------------------------------------------------------------------

def _points() -> list[AnatomyPoint]:
    return anatomy_sweep(FakeKernel(), 4096, range(1, 257))  # type: ignore[arg-type]


def _grid() -> BottleneckGrid:
    return bottleneck_grid(FakeKernel())  # type: ignore[arg-type]


def test_every_chart_saves_as_png_and_inlines_as_svg(tmp_path: Path) -> None:
    df = priced_frame()
    s = summarise(df)
    figs = {
        "anatomy": charts.anatomy_figure(_points(), context=4096, title="Step anatomy: x"),
        "map": charts.bottleneck_map_figure(_grid()),
        "hist": charts.step_time_histogram_figure(df["no_overlap_ns"]),
        "bars": charts.time_by_bottleneck_figure(s),
        "compare": charts.compare_figure([s, s], ["a", "b"]),
    }
    for name, fig in figs.items():
        path = charts.save(fig, tmp_path / f"{name}.png")
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
        svg = charts.to_svg(fig, f"chart-{name}")
        assert svg.startswith("<svg") and f'id="chart-{name}"' in svg
        ids = re.findall(r'\bid="([^"]+)"', svg)
        assert len(ids) == len(set(ids)) and all(i.startswith(f"chart-{name}") for i in ids)
        assert charts.to_png_data_uri(fig).startswith("data:image/png;base64,")
    # Text stays text in the SVG: labels are searchable.
    assert "p99" in charts.to_svg(figs["hist"], "h") and "µs" in charts.to_svg(figs["hist"], "h")
    assert "HBM (memory)" in charts.to_svg(figs["map"], "m")


def _render(out: Path) -> None:
    """The same charts as files: a PNG and an SVG by suffix, and the report's PNGs."""
    charts.save(charts.anatomy_figure(_points(), context=4096), out / "anatomy.png")
    charts.save(charts.anatomy_figure(_points(), context=4096), out / "anatomy.svg")
    html.trace_report(priced_frame(), None, png_dir=out)


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, payload) of every chunk of a PNG file, in order."""
    assert data.startswith(PNG_MAGIC)
    chunks, at = [], len(PNG_MAGIC)
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        chunks.append((data[at + 4:at + 8], data[at + 8:at + 8 + size]))
        at += 12 + size
    return chunks


def test_svg_and_png_are_deterministic(tmp_path: Path) -> None:
    a = charts.to_svg(charts.anatomy_figure(_points(), context=4096), "x")
    b = charts.to_svg(charts.anatomy_figure(_points(), context=4096), "x")
    assert a == b
    # Render once here and once in a fresh interpreter (another hash seed, an empty matplotlib
    # cache), so equal bytes mean equal files across runs, not one buffer written twice.
    here, fresh = tmp_path / "here", tmp_path / "fresh"
    here.mkdir()
    fresh.mkdir()
    _render(here)
    env = {**os.environ, "PYTHONHASHSEED": "12345", "MPLCONFIGDIR": str(tmp_path / "mpl")}
    code = "import sys, pathlib; from tests.test_report import _render; " \
           "_render(pathlib.Path(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(fresh)], env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in here.iterdir())
    assert {"anatomy.png", "anatomy.svg", "step_time.png"} <= set(names)
    assert names == sorted(p.name for p in fresh.iterdir())
    for name in names:
        assert (here / name).read_bytes() == (fresh / name).read_bytes(), name
    # Nothing dated is embedded: matplotlib's Agg PNG carries a Software text chunk only (no
    # tIME chunk, no Creation Time), so byte equality is the right test, not pixels alone.
    chunks = _png_chunks((here / "anatomy.png").read_bytes())
    assert b"tIME" not in [kind for kind, _ in chunks]
    assert not [body for kind, body in chunks if b"Time" in body and kind.endswith(b"Xt")]


# -- the HTML -------------------------------------------------------------------------------

def test_html_report_is_self_contained_and_complete(tmp_path: Path) -> None:
    k: Any = FakeKernel()
    df = priced_frame()
    text = html.trace_report(df, k, png_dir=tmp_path)
    assert_self_contained(text)
    p = parse(text)
    for cid in ("anatomy", "bottleneck_map", "step_time", "by_bottleneck"):
        assert p.ids.get(html.CHART_IDS[cid]) == "svg", cid
    for sec in ("summary", "charts", "configuration", "provenance"):
        assert sec in p.ids
    assert "&lt;MLA needs 64&gt;" in text  # overrides are shown, escaped
    assert "2/3" in text and "hbm_bw" in text and "vendor_spec" in text
    for png in ("anatomy", "bottleneck_map", "step_time", "by_bottleneck"):
        assert (tmp_path / f"{png}.png").read_bytes().startswith(PNG_MAGIC)


def test_html_report_can_embed_png() -> None:
    text = html.trace_report(priced_frame(), None, embed="png")
    assert_self_contained(text)
    p = parse(text)
    assert p.ids.get(html.CHART_IDS["step_time"]) == "img"
    assert html.CHART_IDS["anatomy"] not in p.ids  # no kernel, no anatomy
    assert "configuration" not in p.ids


# -- on the real kernel -------------------------------------------------------------------

@pytest.fixture(scope="module")
def k() -> Any:
    import kernel

    return kernel.open(DS3)


def test_anatomy_sweep_matches_step_time(k: Any) -> None:
    pts = anatomy_sweep(k, 4096, (1, 2, 8, 32, 128, 256))
    for p in pts:
        est = k.step_time(decode_batch(k, p.batch_size, 4096))
        assert (p.overlap_ns, p.no_overlap_ns, p.bottleneck) == (
            est.overlap, est.no_overlap, str(est.bottleneck))
        assert p.overlap_ns <= p.no_overlap_ns
    assert pts[-1].no_overlap_ns >= pts[0].no_overlap_ns


def test_cli_anatomy_png_and_html(tmp_path: Path) -> None:
    from kernel.cli import cli

    r = CliRunner().invoke(cli, ["anatomy", "-s", DS3, "-o", str(tmp_path / "a.png"),
                                 "--max-batch", "64"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a.png").read_bytes().startswith(PNG_MAGIC)
    r = CliRunner().invoke(cli, ["anatomy", "-s", DS3, "-o", str(tmp_path / "a.html")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "a.html").read_text()
    assert_self_contained(text)
    ids = parse(text).ids
    assert html.CHART_IDS["anatomy"] in ids and html.CHART_IDS["bottleneck_map"] in ids
    r = CliRunner().invoke(cli, ["anatomy", "-s", DS3, "-o", str(tmp_path / "a.txt")])
    assert r.exit_code == 2 and "suffix" in r.output


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kernel.io.synth import write_synth

    path = tmp_path_factory.mktemp("trace") / "trace.parquet"
    write_synth(path, 300, requests_per_batch=24, seed=3)
    return path


def test_cli_report_on_a_priced_trace(tmp_path: Path, k: Any, small_trace: Path) -> None:
    from kernel import bulk
    from kernel.cli import cli

    priced = bulk.price(k, str(small_trace))
    priced.write_parquet(tmp_path / "priced.parquet")
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "priced.parquet"), "--scenario", DS3,
                                 "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert "p99" in r.output and "evidence" in r.output
    text = (tmp_path / "r.html").read_text()
    assert_self_contained(text)
    ids = parse(text).ids
    assert all(v in ids for v in (html.CHART_IDS[c] for c in
                                  ("anatomy", "bottleneck_map", "step_time", "by_bottleneck")))
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "priced.parquet"),
                                 "-o", str(tmp_path / "h.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "h.png").read_bytes().startswith(PNG_MAGIC)
    r = CliRunner().invoke(cli, ["report", str(small_trace), "-o", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "not a priced trace" in r.output


OTHER = "deepseek-v3-b300-fp8-sglang-tp8"


def test_cli_compare_two_deployments(tmp_path: Path, small_trace: Path) -> None:
    from kernel.cli import cli

    r = CliRunner().invoke(cli, ["compare", str(small_trace), "--scenario", DS3,
                                 "--scenario", OTHER, "-o", str(tmp_path / "c.html")])
    assert r.exit_code == 0, r.output
    assert DS3 in r.output and OTHER in r.output and "p99" in r.output
    assert f"{OTHER} vs {DS3}: wall time" in r.output and "bottleneck shift" in r.output
    assert "share of wall time" in r.output and "GPU-s" in r.output
    text = (tmp_path / "c.html").read_text()
    assert_self_contained(text)
    assert html.CHART_IDS["compare"] in parse(text).ids


def test_compare_prices_one_trace_on_each_deployment(tmp_path: Path, k: Any,
                                                     small_trace: Path) -> None:
    import kernel
    from kernel import bulk
    from kernel.report.compare import compare_lines, compare_summaries

    other = kernel.open(OTHER)
    summaries, frames = compare_summaries(small_trace, [k, other])
    assert [s.scenario for s in summaries] == [DS3, OTHER]
    assert [s.batches for s in summaries] == [300, 300]
    assert frames[0]["batch_id"].to_list() == frames[1]["batch_id"].to_list()
    assert frames[0].equals(bulk.price(k, str(small_trace)))
    assert summaries[1].total_no_overlap_ns == int(frames[1]["no_overlap_ns"].sum())
    lines = compare_lines(summaries, [DS3, OTHER])
    assert len(lines) == 1 and lines[0].startswith(f"{OTHER} vs {DS3}")
    path = charts.save(charts.compare_figure(summaries, [DS3, OTHER]), tmp_path / "c.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_cli_reports_a_refused_scenario_in_one_line(tmp_path: Path) -> None:
    from kernel.cli import cli

    r = CliRunner().invoke(cli, ["anatomy", "-s", "minimax-m25-h200-ep16", "--no-assumed-widths",
                                 "-o", str(tmp_path / "a.png")])
    assert r.exit_code == 1 and "Error: minimax-m25-h200-ep16:" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "a.png").exists()
