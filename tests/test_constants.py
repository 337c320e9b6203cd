"""Every constant is defined once (issue 16): Python reads pipeline.constants, SQL reads the
``kernel_constants`` table through macros, and neither spells the values again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kernel
from pipeline import constants
from pipeline.db import open_db

ROOT = Path(__file__).resolve().parents[1]
CONSTANTS = {
    "ENGINE_BEHAVIOUR_VERSION": constants.ENGINE_BEHAVIOUR_VERSION,
    "ENGINE_BEHAVIOUR_COMMIT": constants.ENGINE_BEHAVIOUR_COMMIT,
    "KERNEL_ASSUMPTION_SET": constants.KERNEL_ASSUMPTION_SET,
    "FLASHINFER_SM90_SPARSE_MLA_VERSION": constants.FLASHINFER_SM90_SPARSE_MLA_VERSION,
}
# A release number (0.31.0, v0.29, 0.6.18) or a "vLLM <number>" spelling, comments included.
_VERSION = re.compile(r"\bv?\d+\.\d+(\.\d+)+\b|\bv\d+\.\d+\b|vLLM\s+v?\d", re.I)


def version_literals(directory: Path) -> list[str]:
    """``file:line: text`` of every line of ``directory/*.sql`` that spells a version."""
    return [f"{p.name}:{i}: {line.strip()}" for p in sorted(directory.glob("*.sql"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if _VERSION.search(line)]


def _code(paths: list[Path]) -> dict[Path, str]:
    return {p: p.read_text() for p in paths if p.resolve() != Path(constants.__file__).resolve()}


def test_no_version_or_set_literal_in_sql() -> None:
    sql = _code(sorted((ROOT / "sql").glob("*.sql")))
    assert sql
    for value in CONSTANTS.values():
        hits = [p.name for p, text in sql.items() if value in text]
        assert not hits, f"{value!r} is spelled out in {hits}; use the kernel_constants macros"


def test_no_version_literal_in_sql() -> None:
    assert sorted((ROOT / "sql").glob("*.sql"))
    hits = version_literals(ROOT / "sql")
    assert not hits, "versions reach SQL from pipeline.constants (kernel_constants): " + \
        "; ".join(hits)


@pytest.mark.parametrize("line", ["SELECT 'vLLM v0.31.0 refuses it'",
                                  "SELECT 'needs FlashInfer >= 0.6.18'",
                                  "-- as of v0.29 the engine does this",
                                  "SELECT 'the vLLM 0.29 pack'"])
def test_a_re_added_version_literal_is_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "99_x.sql").write_text(f"SELECT 1;\n{line};\n")
    assert version_literals(tmp_path) == [f"99_x.sql:2: {line};"]
    (tmp_path / "99_x.sql").write_text("SELECT 0.5 * 1e12, 18.07 + key_order / 1000.0;\n")
    assert version_literals(tmp_path) == []  # plain decimals are not versions


def test_python_defines_each_constant_once() -> None:
    py = _code(sorted((ROOT / "kernel").rglob("*.py")) + sorted((ROOT / "pipeline").rglob("*.py")))
    for name, value in {**CONSTANTS, "MAX_DURATION_NS": None}.items():
        assigned = [p for p, text in py.items() if re.search(rf"^\s*{name}\s*[:=]", text, re.M)]
        assert not assigned, f"{name} is assigned again in {assigned}"
        if value is not None:
            spelled = [p for p, text in py.items() if f'"{value}"' in text or f"'{value}'" in text]
            assert not spelled, f"{value!r} is spelled out in {spelled}"


def test_sql_sees_the_python_values() -> None:
    con = open_db()
    row = con.execute("SELECT engine_version(), vllm(), assumption_set(), max_duration_ns, "
                      "evidenced_methods, flashinfer_sm90_sparse_mla_version "
                      "FROM kernel_constants").fetchone()
    assert row == (constants.ENGINE_BEHAVIOUR_VERSION,
                   f"vLLM v{constants.ENGINE_BEHAVIOUR_VERSION}",
                   constants.KERNEL_ASSUMPTION_SET, constants.MAX_DURATION_NS,
                   list(constants.EVIDENCED_METHODS),
                   constants.FLASHINFER_SM90_SPARSE_MLA_VERSION)
    assert kernel.ENGINE_BEHAVIOUR_VERSION is constants.ENGINE_BEHAVIOUR_VERSION
    from kernel.model import laws, types

    assert types.MAX_DURATION_NS == laws.MAX_DURATION_NS == 2**63 - 1


def test_reasons_still_name_the_pinned_release() -> None:
    k = kernel.open("deepseek-v3-h200-fp8-sglang-tp8")
    # The assumptions' rationales are built in SQL from the vllm() macro.
    assumed = [o for o in k.provenance() if o.set == constants.KERNEL_ASSUMPTION_SET]
    assert assumed
    assert any(f"vLLM v{constants.ENGINE_BEHAVIOUR_VERSION}'s default" in o.scope for o in assumed)
