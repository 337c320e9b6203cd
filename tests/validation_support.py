"""Shared fixtures for the validation tests: the small roots under tests/malformed/roots and
a loader that reads any malformed case the way the kernel or the CLI would."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.decode import decode_map
from pipeline.documents import (
    Graph,
    Parallelism,
    StorageDevice,
)
from pipeline.errors import DocumentError, Problem
from pipeline.load import Inputs, Repos, load_document, open_inputs
from pipeline.validate import (
    check_inputs,
    validate_storage,
)
from pipeline.validate_files import SINGLE_DOCUMENTS
from pipeline.yamlio import read_documents

MALFORMED = Path(__file__).parent / "malformed"
# The team's shared knowledge base sits beside the checkout (../shared), in CI too.
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
ROOTS = MALFORMED / "roots"
REPOS = Repos(scenarios=ROOTS / "scenarios", catalog=ROOTS / "catalog",
              registry=ROOTS / "registry")

# The malformed cases name their loader by these short names.
LOADERS: dict[str, tuple[type, Any]] = {
    {"coefficient set": "coefficients", "model identity": "identity"}.get(kind, kind): entry
    for kind, entry in SINGLE_DOCUMENTS.items()
}


def header(path: Path) -> dict[str, str]:
    """The description (first line) and ``# key: value`` lines a malformed case starts with."""
    lines = path.read_text().splitlines()
    meta: dict[str, str] = {"what": lines[0].lstrip("# ")}
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() in ("loader", "path", "message", "file", "pool"):
            meta[key.strip()] = value.strip()
    return meta


def load_and_validate(path: Path, loader: str, pool: int = 0) -> list[Problem]:
    """Every problem (load errors, or field + rule problems) the right loader reports."""
    try:
        if loader == "bundle":
            return check_inputs(open_inputs(path, REPOS, pool)).problems()
        if loader == "storage":
            classes, lines = decode_map(StorageDevice, read_documents(path)[0], str(path))
            return validate_storage(classes.values(), str(path), lines)
        tp, validator = LOADERS[loader]
        doc, loaded = load_document(tp, path)
        return validator(doc, str(path), lines=loaded.lines)
    except DocumentError as exc:
        return exc.problems


def fixture_inputs(name: str = "tiny-tp2", pool: int = 0) -> Inputs:
    return open_inputs(ROOTS / "scenarios" / f"{name}.yaml", REPOS, pool)


def fixture_graph(name: str) -> Graph:
    return load_document(Graph, ROOTS / "catalog" / "models" / name / "graph.yaml")[0]


def with_pool(inputs: Inputs, model: str | None = None, **changes: object) -> Inputs:
    """``inputs`` with pool 0's ``parallel``/``engine`` fields replaced (and maybe the model)."""
    pool = inputs.deployment.pools[0]
    par = {k: v for k, v in changes.items() if k in {f.name for f in
                                                      dataclasses.fields(Parallelism)}}
    eng = {k: v for k, v in changes.items() if k not in par}
    pool = dataclasses.replace(pool, parallel=dataclasses.replace(pool.parallel, **par),
                               engine=dataclasses.replace(pool.engine, **eng))
    deployment = dataclasses.replace(inputs.deployment, pools=(pool,))
    out = dataclasses.replace(inputs, deployment=deployment)
    return dataclasses.replace(out, model=fixture_graph(model)) if model else out
