"""Library first (issue 30 item 2, decision LF4): what a command does is a library call.

No module outside ``kernel/cli/`` (library, tests, benchmarks, examples) imports a library
function from ``kernel.cli``: only the entry points and the CLI's own argument parsers and
error presenters, which exist for the command line alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the command line itself, and helpers that parse or present command-line text
CLI_ONLY = {
    "kernel.cli": {"cli", "main"},
    "kernel.cli.price_one": {"parse_batch_spec"},  # --batch 32x1@4095
    "kernel.cli.replay": {"parse_slo"},  # --slo ttft_p99=2s
    "kernel.cli.errors": {"resource_error"},  # the one-line message for an OS error
    "kernel.cli.validate": {"check_scenarios"},  # the rows `validate` prints
    "kernel.cli.dialect": {"DialectCommand", "complete_scenario"},  # spellings, completion
    "kernel.cli.logs": {"level_for"},  # -v / BLIS_KERNEL_LOG to a logging level
}


def _cli_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from kernel.cli... import name`` and ``import kernel.cli...``
    in ``path``, deferred imports and those inside strings run by a subprocess included."""
    text = path.read_text()
    found: list[tuple[str, str]] = []
    trees = [ast.parse(text)]
    for node in ast.walk(trees[0]):  # code passed to `python -c` in a test
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "kernel.cli" in node.value and "import" in node.value:
            try:
                trees.append(ast.parse(node.value))
            except SyntaxError:
                continue
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and (node.module == "kernel.cli" or node.module.startswith("kernel.cli.")):
                found += [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "kernel" \
                    and any(a.name == "cli" for a in node.names):
                found.append(("kernel", "cli"))
            elif isinstance(node, ast.Import):
                found += [(a.name, "*") for a in node.names if a.name.startswith("kernel.cli")]
    return found


def _outside_cli() -> list[Path]:
    files = [p for d in ("kernel", "tests", "benchmarks", "examples", "pipeline")
             for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if p.relative_to(ROOT).parts[:2] != ("kernel", "cli")
            and p != Path(__file__).resolve()]  # (this file's own examples are strings)


def test_nothing_outside_the_cli_imports_a_library_function_from_it() -> None:
    bad = [f"{p.relative_to(ROOT)}: from {m} import {n}"
           for p in _outside_cli() for m, n in _cli_imports(p)
           if n not in CLI_ONLY.get(m, set()) and (m, n) != ("kernel", "cli")]
    assert not bad, "import the library module instead:\n" + "\n".join(bad)


def test_the_library_never_imports_the_cli() -> None:
    lib = [p for p in sorted((ROOT / "kernel").rglob("*.py"))
           if p.relative_to(ROOT).parts[1] != "cli"]
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in lib for m, _ in _cli_imports(p)]
    assert not bad, bad


def test_the_scan_sees_an_import_from_the_cli(tmp_path: Path) -> None:
    # the check can fail: a deferred import and one in a `python -c` string are both found
    f = tmp_path / "t.py"
    f.write_text("def f():\n    from kernel.cli.report import compare_lines\n"
                 "CODE = 'from kernel.cli.price import write_db; write_db()'\n")
    assert _cli_imports(f) == [("kernel.cli.report", "compare_lines"),
                               ("kernel.cli.price", "write_db")]


def test_moved_functions_live_in_the_library() -> None:
    from kernel.facade.priced_db import write_db
    from kernel.report.compare import compare_lines, compare_rows, compare_summaries

    for fn in (write_db, compare_lines, compare_rows, compare_summaries):
        assert not fn.__module__.startswith("kernel.cli"), fn
