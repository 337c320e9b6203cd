"""The executable examples (examples/*.py, each ending in an ``# Output:`` block, in the spirit
of the reference's Go examples) and the README's Python snippets run as tests."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _expected(path: Path) -> str:
    text = path.read_text()
    _, sep, block = text.partition("\n# Output:\n")
    assert sep, f"{path.name} has no '# Output:' block"
    return "".join(line[2:] + "\n" if line.startswith("# ") else "\n"
                   for line in block.rstrip("\n").split("\n"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_prints_its_output_block(path: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    assert out.getvalue() == _expected(path)


def test_readme_python_snippets_run() -> None:
    """Every ```python block of README.md runs as written (self-contained: it synthesises its
    own trace) and reaches its last line."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    out = io.StringIO()
    for i, block in enumerate(blocks):
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"README.md python block {i}", "exec"), {})  # noqa: S102
    printed = out.getvalue()
    assert "collective_width" in printed  # the snippet's last statement ran
    assert "blis-latency-kernel" in printed  # provenance rows were printed
