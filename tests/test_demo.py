"""`blis-kernel demo` end to end in a temp dir: the outputs exist, parse, and agree with
pricing each batch directly with ``Kernel.step_time``."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

import kernel
from kernel.bulk.summary import nearest_rank
from kernel.cli import cli

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
BATCHES = 1500
RESOURCES = ("sm", "hbm", "nvlink", "nic", "host")


@pytest.fixture(scope="module")
def k() -> Any:
    return kernel.open(DS3)


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo") / "out"
    r = CliRunner().invoke(cli, ["demo", "--output", str(out), "--batches", str(BATCHES)],
                           terminal_width=160)
    assert r.exit_code == 0, r.output + repr(r.exception)
    return out, r.output


def test_demo_writes_every_output(demo_out: tuple[Path, str]) -> None:
    out, _ = demo_out
    for name in ("trace.parquet", "priced.parquet", "report.html", "summary.json",
                 "anatomy.png", "bottleneck_map.png", "step_time.png", "by_bottleneck.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
    for png in out.glob("*.png"):
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), png


def test_demo_prints_the_summary(demo_out: tuple[Path, str]) -> None:
    out, text = demo_out
    for needle in ("batches", f"{BATCHES:,}", "wall time", "GPU time", "p50", "p99", "bottleneck",
                   "evidence", "report.html", "priced.parquet"):
        assert needle in text, needle


def test_demo_outputs_agree_with_each_other(demo_out: tuple[Path, str], k: Any) -> None:
    out, _ = demo_out
    priced = pl.read_parquet(out / "priced.parquet")
    trace = pl.read_parquet(out / "trace.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert priced.height == BATCHES == summary["batches"]
    assert priced["batch_id"].n_unique() == BATCHES
    assert set(priced["batch_id"].to_list()) == set(trace["batch_id"].unique().to_list())
    assert summary["rows_rejected"] == 0
    assert int(priced["requests"].sum()) == trace.height
    assert int(priced["tokens"].sum()) == int(trace["scheduled"].sum())
    no = priced["no_overlap_ns"].to_numpy()
    assert summary["total_no_overlap_ns"] == int(no.sum())
    assert summary["p50_no_overlap_ns"] == nearest_rank(no, 0.5)
    assert summary["p99_no_overlap_ns"] == nearest_rank(no, 0.99)
    assert sum(summary["bottleneck_batches"].values()) == BATCHES
    assert priced.filter(pl.col("overlap_ns") > pl.col("no_overlap_ns")).height == 0
    per = np.sum([priced[f"{r}_ns"].to_numpy() for r in RESOURCES], axis=0)
    assert np.array_equal(per, no)  # NoOverlap is the sum of the resources
    ev, total, _ = k.evidence()
    assert summary["evidence"] == [ev, total]


def test_demo_agrees_with_direct_pricing(demo_out: tuple[Path, str], k: Any) -> None:
    out, _ = demo_out
    priced = pl.read_parquet(out / "priced.parquet")
    trace = pl.read_parquet(out / "trace.parquet")
    rng = np.random.default_rng(7)
    ids = priced["batch_id"].to_numpy()
    sample = set(rng.choice(ids, 60, replace=False).tolist()) | {int(ids.min()), int(ids.max())}
    # The batch with the most prefill tokens too: the interesting mixed steps.
    sample.add(int(priced.sort("tokens", descending=True)["batch_id"][0]))
    rows = trace.filter(pl.col("batch_id").is_in(sorted(sample)))
    by_id = {int(r["batch_id"]): r for r in priced.iter_rows(named=True)}
    width = max(int(getattr(k.resolved_pool, "uniform_decode_width", 1)), 1)
    for (bid,), grp in rows.group_by(["batch_id"], maintain_order=True):
        reqs = [kernel.Request(int(s), int(c), int(p)) for s, c, p in
                grp.select("scheduled", "computed", "prompt_len").iter_rows()]
        per: dict[Any, int] = {}
        est = k.step_time_into(kernel.Batch(reqs, decode_threshold=width), per)
        got = by_id[int(bid)]
        assert (got["overlap_ns"], got["no_overlap_ns"], got["bottleneck"]) == (
            est.overlap, est.no_overlap, str(est.bottleneck)), bid
        for r, v in per.items():
            assert got[f"{r}_ns"] == v, (bid, r)
        assert got["requests"] == len(reqs) and got["tokens"] == sum(q.scheduled for q in reqs)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"
        self.ids.update(v for k, v in attrs if k == "id" and v)


def test_demo_report_parses_and_has_every_part(demo_out: tuple[Path, str]) -> None:
    out, _ = demo_out
    p = _Collect()
    p.feed((out / "report.html").read_text(encoding="utf-8"))
    p.close()
    assert p.scripts == 0
    for i in ("summary", "charts", "configuration", "provenance", "chart-anatomy",
              "chart-bottleneck-map", "chart-step-time", "chart-by-bottleneck"):
        assert i in p.ids, i
