"""The HTML report renders in a real browser (headless Chromium) with every chart present.

Needs Debian's ``chromium`` (``.ci/run`` installs it when absent). Without it this test — and
only this test — skips, loudly.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernel.report import html
from kernel.report.sections import SECTION_IDS

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"
CHARTS = ("anatomy", "bottleneck_map", "step_time", "by_bottleneck")
# The trace sections' charts (issue 17).
SECTION_CHARTS = ("chart-throughput", "chart-step-timeline", "chart-step-vs-tokens",
                  "chart-utilisation", "chart-kv-occupancy", "chart-layer-kinds")


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium")
    assert exe is not None
    return subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'profile'}", *args],
        capture_output=True, text=True, timeout=120, check=False)


def _report(tmp: Path) -> Path:
    import kernel
    from kernel import bulk
    from kernel.bulk.utilisation import column_producer
    from kernel.io.synth import synth

    k = kernel.open(DS3)
    trace = synth(400, requests_per_batch=32, seed=5)
    priced = bulk.price(k, trace, producers=[column_producer()])
    svg = html.write(html.trace_report(priced, k, title="browser test", trace=trace),
                     tmp / "report.html")
    html.write(html.trace_report(priced, None, embed="png", title="png embed"),
               tmp / "report_png.html")
    return svg


@pytest.mark.skipif(shutil.which("chromium") is None, reason=(
    "!!! chromium is not installed: the HTML report was NOT rendered in a browser. Install "
    "Debian's `chromium` package (.ci/run does) to run this test. !!!"))
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = _report(tmp_path)
    url = page.resolve().as_uri()

    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = dom.stdout
    for name in CHARTS:
        cid = html.CHART_IDS[name]
        assert f'<svg id="{cid}"' in text, f"chart {cid} missing from the rendered DOM"
    for section in ("summary", "charts", "configuration", "provenance", *SECTION_IDS.values()):
        assert f'id="{section}"' in text, section
    for cid in SECTION_CHARTS:
        assert f'<svg id="{cid}"' in text, f"chart {cid} missing from the rendered DOM"
    assert 'class="missing"' not in text  # every section had the data it needs
    assert "steps break a deployment limit" in text and "prefill tokens/s" in text

    shot = tmp_path / "shot.png"
    r = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    coloured = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.2  # chart colours, not greys
    assert coloured.mean() > 0.01, "the screenshot shows no coloured chart"

    dom = _chromium(tmp_path, "--dump-dom", (tmp_path / "report_png.html").resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'<img id="{html.CHART_IDS["step_time"]}"' in dom.stdout
    assert 'src="data:image/png;base64,' in dom.stdout
