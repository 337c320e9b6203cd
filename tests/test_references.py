"""References resolve inside the repository (docs/model.md §0.3).

Every `§N.M` in the repository's code, SQL and documents cites the nearest document named
before it on the same line (`model.md §4.2`, `§4.2` after another `model.md` citation), or,
inside a document, that document itself. The section must be a numbered heading of that
document, and the document a file of the repository. The external spec documents are named
only in docs/model.md's Sources section. A golden test names its cases' source (model.md §14).
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "docs/model.md"
TEXT_SUFFIXES = {".py", ".sql", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".html"}
SELF = "tests/test_references.py"  # holds the planted bad references below
# The external documents the model was restated from (docs/model.md §15), and their folder.
SPEC = re.compile("|".join(["kernel-algorithm", "kernel-behaviour", "seed-methods",
                            r"graph-derivation\.md", r"(?<![\w/-])schemas\.md", r"shared/spec"]))
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
DOC_NAME = re.compile(r"[\w./-]*\w\.md\b")
HEADING = re.compile(r"^#{1,6} (\d+(?:\.\d+)*)[. ]", re.M)
GOLDEN_CASE = re.compile(r"\bcases? (\d+)", re.I)


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return tuple(p for p in out if Path(p).suffix in TEXT_SUFFIXES and (ROOT / p).is_file())


def resolve_doc(name: str, citing: str, files: tuple[str, ...]) -> str | None:
    """The repository file a document name means: relative to the citing file, then to the
    root, then a unique file of that name anywhere (``model.md`` is docs/model.md)."""
    for candidate in (str(Path(citing).parent / name), name.lstrip("./")):
        normal = str(Path(candidate))
        if normal in files:
            return normal
    by_name = [p for p in files if Path(p).name == Path(name).name]
    return by_name[0] if len(by_name) == 1 else None


@cache
def sections(text: str) -> frozenset[str]:
    return frozenset(HEADING.findall(text))


def citations(path: str, text: str, files: tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    """(where, section, document) of each `§` in ``text``: the document is the repository file
    named last before it on its line (a document's own, in a .md with none named), or None
    when none is named; a name that is no repository file is kept as written."""
    out: list[tuple[str, str, str | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if "§" not in line:
            continue
        named = [(m.start(), m.group(0)) for m in DOC_NAME.finditer(line)]
        for m in SECTION.finditer(line):
            before = [name for at, name in named if at < m.start()]
            where = f"{path}:{number}: {m.group(0)}"
            if before:
                out.append((where, m.group(1), resolve_doc(before[-1], path, files) or before[-1]))
            else:
                out.append((where, m.group(1), path if path.endswith(".md") else None))
    return out


def reference_problems(path: str, text: str, read: dict[str, str]) -> list[str]:
    """Each `§` in ``text`` that does not name a heading of an in-repository document.
    ``read`` maps repository paths to their text (every file that may be cited)."""
    problems = []
    for where, section, doc in citations(path, text, tuple(read)):
        if doc is None:
            problems.append(f"{where} names no document: write `model.md §{section}`")
        elif doc not in read:
            problems.append(f"{where} cites {doc}, which is not a document of this repository")
        elif section not in sections(read[doc]):
            problems.append(f"{where}: {doc} has no section {section}")
    return problems


def spec_mentions(path: str, text: str) -> list[str]:
    """Lines naming the external spec documents; in docs/model.md only §15 may."""
    if path == MODEL:
        sources = re.search(r"^## 15\. Sources$.*?(?=^## |\Z)", text, re.M | re.S)
        if sources:
            text = text[:sources.start()] + "\n" * sources.group(0).count("\n") + \
                text[sources.end():]
    return [f"{path}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if SPEC.search(line)]


@cache
def repository() -> dict[str, str]:
    return {p: (ROOT / p).read_text(encoding="utf-8") for p in tracked()}


# -- the repository ---------------------------------------------------------------------------

def test_model_md_has_the_sections_the_code_leans_on() -> None:
    heads = sections(repository()[MODEL])
    assert {"1.4", "3.2", "5.3", "7.1", "9.1", "9.10", "14.2", "14.3", "15"} <= heads
    assert len(heads) == len(HEADING.findall(repository()[MODEL])), "a section number twice"


def test_every_section_reference_resolves_inside_the_repository() -> None:
    read = repository()
    problems = [p for path, text in read.items() if path != SELF
                for p in reference_problems(path, text, read)]
    assert not problems, "\n".join(problems)


def test_only_model_md_sources_names_the_external_spec() -> None:
    problems = [p for path, text in repository().items() if path != SELF
                for p in spec_mentions(path, text)]
    assert not problems, "\n".join(problems)


def golden_without_source(read: dict[str, str]) -> list[str]:
    """Test modules citing three or more of the reference's numbered cases (one passing
    mention does not make a golden test) without citing a section of model.md §14."""
    return [p for p, text in read.items() if p.startswith("tests/") and p != SELF
            and len(set(GOLDEN_CASE.findall(text))) >= 3
            and not any(doc == MODEL and section.split(".")[0] == "14"
                        for _, section, doc in citations(p, text, tuple(read)))]


def test_golden_tests_name_where_their_cases_come_from() -> None:
    missing = golden_without_source(repository())
    assert not missing, f"cite model.md §14 (the golden cases' origin) in: {missing}"


# -- the checks fail where they should (planted references) -----------------------------------

PLANTED_DOCS = {"docs/model.md": "# M\n\n## 4. Attention\n\n### 4.2 Decode reads\n",
                "docs/decisions.md": "# Decisions\n"}


@pytest.mark.parametrize("line,needle", [
    ("x = 1  # kernel-algorithm.md §2.8 says so", "not a document of this repository"),
    ("-- bare (§4.2)", "names no document"),
    ("# (model.md §4.3)", "has no section 4.3"),
    ("# (model.md §4.2, §9)", "has no section 9"),
    ('"""As decisions.md §4.2 says."""', "docs/decisions.md has no section 4.2"),
])
def test_a_planted_bad_reference_is_reported(line: str, needle: str) -> None:
    read = {**PLANTED_DOCS, "kernel/x.py": line}
    [problem] = reference_problems("kernel/x.py", line, read)
    assert needle in problem and problem.startswith("kernel/x.py:1: §")


@pytest.mark.parametrize("line", [
    "# (model.md §4.2)", "# model.md §4, §4.2 and §4.2", "-- see docs/model.md §4.2",
    "no section sign here",
])
def test_a_good_reference_passes(line: str) -> None:
    assert reference_problems("kernel/x.py", line, {**PLANTED_DOCS, "kernel/x.py": line}) == []


def test_a_document_cites_its_own_sections() -> None:
    text = PLANTED_DOCS["docs/model.md"] + "\nSee §4.2, not §5.\n"
    read = {**PLANTED_DOCS, "docs/model.md": text}
    assert reference_problems("docs/model.md", text, read) == [
        "docs/model.md:7: §5: docs/model.md has no section 5"]


def test_a_planted_spec_mention_is_reported_outside_sources_only() -> None:
    model = "# M\n\n## 1. A\n\nsee seed-methods.md\n\n## 15. Sources\n\n- `schemas.md`\n"
    assert spec_mentions(MODEL, model) == ["docs/model.md:5: see seed-methods.md"]
    assert spec_mentions("sql/x.sql", "-- (kernel-behaviour.md §6)") == [
        "sql/x.sql:1: -- (kernel-behaviour.md §6)"]
    assert spec_mentions("x.md", "read ../shared/spec/ first") != []
    assert spec_mentions("x.py", "# the schemas of documents.py; pipeline/schemas.md") == []


def test_a_golden_test_without_its_source_is_reported() -> None:
    model = "# M\n\n## 14. Golden cases\n\n### 14.2 Pure\n"
    cases = '"""Cases 1, case 7 and case 9 (model.md §3)."""\n'
    read = {MODEL: model, "tests/test_g.py": cases,
            "tests/test_h.py": cases.replace("§3", "§14.2"), "tests/test_i.py": "# case 4\n"}
    assert golden_without_source(read) == ["tests/test_g.py"]
