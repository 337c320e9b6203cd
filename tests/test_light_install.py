"""A plain install without matplotlib (issue 30 item 9, CF7): pricing and SQL work, and a
command that draws says which extra to install. matplotlib is blocked in a subprocess
(``sys.modules['matplotlib'] = None`` makes every import of it fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kernel.io.extras import CHARTS_MESSAGE

ROOT = Path(__file__).resolve().parents[1]
_BLOCKED = ("import sys; sys.modules['matplotlib'] = None; "
            "sys.argv = ['blis-kernel'] + sys.argv[1:]; "
            "from kernel.cli import main; main()")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _BLOCKED, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_price_sql_work_and_report_names_the_extra(tmp_path: Path) -> None:
    trace, priced = tmp_path / "t.parquet", tmp_path / "p.parquet"
    made = _cli("trace", "synth", "-n", "50", "-o", str(trace), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    run = _cli("price", str(trace), "-s", "deepseek-v3-on-h200", "-o", str(priced),
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert priced.stat().st_size > 0
    sql = _cli("sql", "SELECT count(*) AS n FROM scenarios", cwd=tmp_path)
    assert sql.returncode == 0, sql.stderr
    report = _cli("report", str(priced), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert report.returncode != 0
    assert CHARTS_MESSAGE in report.stderr
    assert "Traceback" not in report.stderr
    assert not (tmp_path / "r.html").exists()


def test_matplotlib_is_not_a_plain_dependency() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("matplotlib") for dep in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(dep.startswith("matplotlib") for dep in extras["report"])
    assert any(dep.startswith("matplotlib") for dep in extras["test"])
