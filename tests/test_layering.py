"""The import direction is pipeline <- kernel: no module under pipeline/ imports kernel/."""

from __future__ import annotations

import ast
from pathlib import Path

import duckdb
import pytest

from pipeline import db

ROOT = Path(__file__).resolve().parents[1]


def kernel_imports(source: str, module: str) -> list[str]:
    """The ``kernel`` imports in ``source`` (relative imports resolved against ``module``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from the importing module's package
                parts = module.split(".")[:-node.level]
                base = ".".join([*parts, base] if base else parts)
            names = [base]
        else:
            continue
        found += [n for n in names if n == "kernel" or n.startswith("kernel.")]
    return found


def test_finder_sees_every_import_form() -> None:
    src = ("import kernel\nimport os, kernel.model.laws as L\nfrom kernel import laws\n"
           "def f():\n    from kernel.pool.build import new\n")
    assert kernel_imports(src, "pipeline.x") == ["kernel", "kernel.model.laws", "kernel",
                                                 "kernel.pool.build"]
    assert kernel_imports("from . import load\nfrom .errors import Problem\n",
                          "pipeline.db") == []
    assert kernel_imports("from ..db import x\n", "pipeline.derive.y") == []


def test_pipeline_never_imports_kernel() -> None:
    files = sorted((ROOT / "pipeline").rglob("*.py"))
    assert len(files) > 10
    bad = {}
    for path in files:
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if path.name == "__init__.py":
            module += ".__init__"
        hits = kernel_imports(path.read_text(), module)
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"pipeline/ must not import kernel/ (docs/architecture.md): {bad}"


def test_views_without_the_kernel_laws_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "_UDF_INSTALLERS", [])
    with pytest.raises(RuntimeError, match="kernel.pool.sql_laws"):
        db.apply_views(duckdb.connect())


def test_sql_dtype_widths_are_the_kernel_laws() -> None:
    """dtype_bytes / cache_dtype_bytes in SQL are kernel.model.laws (no SQL copy left to drift)."""
    from kernel.model import laws  # noqa: F401  (installs the cost laws the views call)

    con = duckdb.connect()
    db.install_udfs(con)
    for d in ("bf16", "fp16", "fp8", "int8", "nvfp4", "mxfp4", "int4", "fp32"):
        assert con.execute("SELECT dtype_bytes(?)", [d]).fetchone() == (laws.dtype_bytes(d),)
    assert con.execute("SELECT dtype_bytes('fp7'), dtype_bytes(NULL)").fetchone() == (0.0, 0.0)
    for declared in ("fp8", "fp8_e5m2", "bfloat16", "nvfp4", "nvfp4_ds_mla", "float32"):
        for fallback in (1.0, 4.0):
            assert con.execute("SELECT cache_dtype_bytes(?, ?)", [declared, fallback]
                               ).fetchone() == (laws.cache_dtype_bytes(declared, fallback),)
    assert con.execute("SELECT cache_dtype_bytes(NULL, 1.0), cache_dtype_bytes('auto', 4.0), "
                       "cache_dtype_bytes('fp9', 2.0), cache_dtype_bytes('', NULL)"
                       ).fetchone() == (2.0, 4.0, None, None)
