"""Validate files on disk: a scenario bundle, one document, a catalog root, a registry root.

Loading stops at the first decode error *within one document* (the decoder still reports
every problem of that document), but each document is loaded and checked on its own, so a
run reports every problem of every file. Used by ``blis-kernel validate``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .decode import decode, decode_map
from .documents import (
    Chip,
    CoefficientSet,
    Deployment,
    Fabric,
    Graph,
    ModelIdentity,
    Scenario,
    StorageDevice,
)
from .errors import DocumentError, Problem
from .load import Inputs, Loaded, Repos, load_document
from .rules import PACKS, lookup
from .validate import check_inputs, validate_documents
from .validate_coefficients import validate_coefficient_set
from .validate_common import go_list, quote
from .validate_deployment import validate_deployment
from .validate_graph import validate_graph, validate_identity
from .validate_hardware import validate_chip, validate_fabric, validate_storage
from .validate_scenario import validate_scenario
from .yamlio import Mapping as YamlMapping
from .yamlio import read_documents

CATALOG_DIRS = ("models", "hardware", "networks", "workloads", "devices")


@dataclass
class Checked:
    """One artifact checked: what it is, its name, where it lives and what was found."""

    kind: str
    name: str
    file: str
    problems: list[Problem]
    # A field-valid bundle's documents (pool 0): what the refusal checks resolve.
    inputs: Inputs | None = field(default=None, compare=False, repr=False)

    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]


# ---------------------------------------------------------------------------------------
# Single documents

# Document kind -> (its dataclass, its field validator).
SINGLE_DOCUMENTS: dict[str, tuple[type, Any]] = {
    "scenario": (Scenario, validate_scenario),
    "deployment": (Deployment, validate_deployment),
    "graph": (Graph, validate_graph),
    "chip": (Chip, validate_chip),
    "fabric": (Fabric, validate_fabric),
    "coefficient set": (CoefficientSet, validate_coefficient_set),
    "model identity": (ModelIdentity, validate_identity),
}
_KIND_VALUES = {"Scenario": "scenario", "Deployment": "deployment", "ModelGraph": "graph",
                "CoefficientSet": "coefficient set"}
_DIR_KINDS = {"hardware": "chip", "networks": "fabric", "devices": "storage",
              "coefficients": "coefficient set"}


def detect_kind(path: Path) -> str:
    """What a single YAML file holds: by its ``kind`` key, its name and place, or its keys."""
    docs = read_documents(path)
    if len(docs) == 2:
        return "bundle"
    first = docs[0]
    keys = set(first.items) if isinstance(first, YamlMapping) else set()
    kind = first.items.get("kind") if isinstance(first, YamlMapping) else None
    if kind is not None and getattr(kind, "text", None) in _KIND_VALUES:
        return _KIND_VALUES[kind.text]  # type: ignore[union-attr]
    if kind is not None:
        raise DocumentError(Problem(str(path), "kind", f"{quote(getattr(kind, 'text', ''))} is "
                                    "not a document kind this command validates; it knows "
                                    f"{go_list(sorted(_KIND_VALUES))}"))
    if path.name == "model.yaml" or keys == {"name", "source"}:
        return "model identity"
    if path.name == "graph.yaml":
        return "graph"
    if path.parent.name in _DIR_KINDS:
        return _DIR_KINDS[path.parent.name]
    if "TFlopsPeak" in keys:
        return "chip"
    if "InterNodeBwGBps" in keys:
        return "fabric"
    if keys and all(isinstance(v, YamlMapping) for v in first.items.values()):  # type: ignore[union-attr]
        return "storage"
    raise DocumentError(Problem(str(path), "", "cannot tell which document kind this is; "
                                "expected a scenario bundle, a scenario, a deployment, a model "
                                "graph or identity, a chip, a fabric, storage classes or a "
                                "coefficient set"))


def check_document(path: Path, kind: str | None = None, name: str = "") -> Checked:
    """Load one document (kind detected if not given) and run its field checks."""
    file = str(path)
    try:
        kind = kind or detect_kind(path)
        if kind == "bundle":
            raise ValueError("use check_bundle for a bundle")
        if kind == "storage":
            classes, lines = decode_map(StorageDevice, read_documents(path)[0], file)
            return Checked(kind, name or path.stem, file,
                           validate_storage(classes.values(), file, lines))
        tp, validator = SINGLE_DOCUMENTS[kind]
        doc: Any
        doc, loaded = load_document(tp, path)
    except DocumentError as exc:
        return Checked(kind or "document", name or path.stem, file, exc.problems)
    extra: dict[str, Any] = {}
    if kind == "model identity" and name:
        extra["directory"] = name
    problems = validator(doc, file, lines=loaded.lines, **extra)
    if kind == "graph" and name and doc.name and doc.name != name:
        problems.append(Problem(file, "name", f"must equal the model directory {quote(name)}, "
                                f"got {quote(doc.name)}", line=loaded.lines.get("name", 0)))
    return Checked(kind, name or getattr(doc, "name", "") or path.stem, file, problems)


# ---------------------------------------------------------------------------------------
# Roots


def check_catalog(root: Path) -> list[Checked]:
    """Every graph, identity, config, chip, fabric and the storage classes of a catalog."""
    out: list[Checked] = []
    models = root / "models"
    for d in sorted(p for p in models.iterdir() if p.is_dir()) if models.is_dir() else []:
        if (d / "graph.yaml").is_file():
            out.append(check_document(d / "graph.yaml", "graph", d.name))
        if (d / "model.yaml").is_file():
            out.append(check_document(d / "model.yaml", "model identity", d.name))
        if (d / "config.json").is_file():
            out.append(_check_config(d / "config.json", d.name))
    for sub, kind in (("hardware", "chip"), ("networks", "fabric")):
        for f in sorted((root / sub).glob("*.yaml")) if (root / sub).is_dir() else []:
            out.append(check_document(f, kind))
    storage = root / "devices" / "storage.yaml"
    if storage.is_file():
        out.append(check_document(storage, "storage", "devices/storage.yaml"))
    return out


def _check_config(path: Path, name: str) -> Checked:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
        ok = isinstance(value, dict) and bool(value)
        message = "must be a non-empty JSON object"
    except (OSError, ValueError) as exc:
        ok, message = False, f"is not readable JSON: {exc}"
    problems = [] if ok else [Problem(str(path), "", message)]
    return Checked("model config", name, str(path), problems)


def registry_files(root: Path) -> list[Path]:
    """Every ``.yaml``/``.yml`` (any case, any depth) under ``coefficients/``; no dir symlinks."""
    found = []
    for dirpath, _dirs, files in os.walk(root / "coefficients", followlinks=False):
        found += [Path(dirpath) / f for f in files
                  if f.lower().endswith((".yaml", ".yml"))]
    return sorted(found)


def check_registry(root: Path) -> list[Checked]:
    return [check_document(f, "coefficient set") for f in registry_files(root)]


# ---------------------------------------------------------------------------------------
# Scenario bundles: by-name references (model.md §12.1), then both layers


def _stem_ok(name: str) -> bool:
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and os.path.normpath(name) == name)


def check_references(scenario: Scenario, file: str, lines: dict[str, int],
                     repos: Repos) -> list[Problem]:
    """Every by-name reference that does not resolve, with ``references.*`` paths
    (model.md §12.1)."""
    catalog, registry = repos.catalog_root(), repos.registry_root()
    found: list[Problem] = []

    def add(path: str, message: str, key: str) -> None:
        found.append(Problem(file, f"references.{path}", message, line=lines.get(key, 0)))

    def stem_file(path: str, key: str, name: str, root: Path, sub: str, owner: str) -> None:
        if not _stem_ok(name):
            add(path, f"{quote(name)} is not a valid {sub} identity: a reference is a bare "
                'filename stem, with no path separator, ".", or ".."', key)
        elif not (root / sub / f"{name}.yaml").is_file():
            have = sorted(p.stem for p in (root / sub).glob("*.yaml") if p.is_file()) \
                if (root / sub).is_dir() else []
            add(path, f"{quote(name)}: looked for {sub}/{name}.yaml; the {owner} has "
                f"{go_list(have)}", key)

    if scenario.model:
        models = catalog / "models"
        if not _stem_ok(scenario.model):
            add("model", f"{quote(scenario.model)} is not a valid models identity: a reference "
                'is a bare filename stem, with no path separator, ".", or ".."', "model")
        elif not (models / scenario.model).is_dir():
            have = sorted(p.name for p in models.iterdir() if p.is_dir()) \
                if models.is_dir() else []
            add("model", f"{quote(scenario.model)}: looked for models/{scenario.model}/; the "
                f"catalog has {go_list(have)}", "model")
    if not scenario.cluster.hardware:
        add("hardware", "required: a scenario must name a hardware", "cluster")
    else:
        stem_file("hardware", "cluster.hardware", scenario.cluster.hardware, catalog,
                  "hardware", "catalog")
    if scenario.cluster.fabric:
        stem_file("fabric", "cluster.fabric", scenario.cluster.fabric, catalog, "networks",
                  "catalog")
    if scenario.workload is not None and scenario.workload.shape:
        stem_file("workload.shape", "workload.shape", scenario.workload.shape, catalog,
                  "workloads", "catalog")
    tiers = [t for t in scenario.cluster.storage if t]
    if tiers:
        storage = catalog / "devices" / "storage.yaml"
        try:
            classes, _ = decode_map(StorageDevice, read_documents(storage)[0], str(storage))
        except DocumentError as exc:
            add("storage", "devices/storage.yaml did not load, so no tier can be resolved: "
                f"{exc.problems[0].message}", "cluster.storage")
        else:
            for i, tier in enumerate(scenario.cluster.storage):
                if tier and tier not in classes:
                    add(f"storage[{i}]", f"{quote(tier)} is not a tier in devices/storage.yaml; "
                        f"it has {go_list(sorted(classes))}", "cluster.storage")
    for i, name in enumerate(scenario.coefficients):
        if name:
            stem_file(f"coefficients[{i}]", "coefficients", name, registry, "coefficients",
                      "registry")
    return found


def _decode_bundle(path: Path) -> tuple[Scenario | None, Deployment | None, dict[str, Loaded],
                                        list[Problem]]:
    file, problems = str(path), []
    try:
        docs = read_documents(path)
    except DocumentError as exc:
        return None, None, {}, exc.problems
    if len(docs) != 2:
        return None, None, {}, [Problem(file, "", "a scenario bundle is two YAML documents "
                                        f"(Scenario, then Deployment); found {len(docs)}")]
    out: list[Any] = []
    sources: dict[str, Loaded] = {}
    for key, tp, tree in (("scenario", Scenario, docs[0]), ("deployment", Deployment, docs[1])):
        try:
            doc, lines = decode(tp, tree, file)
            out.append(doc)
            sources[key] = Loaded(file, lines)
        except DocumentError as exc:
            out.append(None)
            problems += [replace(p, path=f"{key}.{p.path}" if p.path else key)
                         for p in exc.problems]
    return out[0], out[1], sources, problems


_CACHE: dict[tuple[type, str, int, int], tuple[Any, Loaded] | DocumentError] = {}


def _load_cached(tp: type, path: Path) -> tuple[Any, Loaded]:
    """``load_document``, remembered per file version: a run over many scenarios that share
    a catalog and registry reads each document once."""
    if not path.is_file():
        return load_document(tp, path)  # raises, naming the file
    stat = path.stat()
    key = (tp, str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _CACHE:
        try:
            _CACHE[key] = load_document(tp, path)
        except DocumentError as exc:
            _CACHE[key] = exc
    result = _CACHE[key]
    if isinstance(result, DocumentError):
        raise result
    return result


def _load_referenced(scenario: Scenario, repos: Repos) -> tuple[dict[str, Any], list[Problem]]:
    """Load every document the scenario names (references already resolved)."""
    catalog, registry = repos.catalog_root(), repos.registry_root()
    docs: dict[str, Any] = {"sources": {}, "coefficients": [], "devices": ()}
    problems: list[Problem] = []

    def load(key: str, tp: type, path: Path) -> Any:
        doc: Any
        try:
            doc, loaded = _load_cached(tp, path)
        except DocumentError as exc:
            problems.extend(exc.problems)
            return None
        docs["sources"][key] = loaded
        return doc

    graph = catalog / "models" / scenario.model / "graph.yaml"
    if graph.is_file():
        docs["model"] = load("model", Graph, graph)
    else:
        problems.append(Problem(str(graph.parent), "", "the model directory has no graph.yaml"))
    chip = load("chip", Chip, catalog / "hardware" / f"{scenario.cluster.hardware}.yaml")
    docs["chip"] = replace(chip, name=scenario.cluster.hardware) if chip else None
    if scenario.cluster.fabric:
        fabric = load("fabric", Fabric, catalog / "networks" / f"{scenario.cluster.fabric}.yaml")
        docs["fabric"] = replace(fabric, name=scenario.cluster.fabric) if fabric else None
    storage = catalog / "devices" / "storage.yaml"
    if storage.is_file():
        try:
            classes, lines = decode_map(StorageDevice, read_documents(storage)[0], str(storage))
            docs["devices"] = tuple(classes.values())
            docs["sources"]["devices"] = Loaded(str(storage), lines)
        except DocumentError as exc:
            problems.extend(exc.problems)
    for name in scenario.coefficients:
        cset = load(f"coefficients:{name}", CoefficientSet,
                    registry / "coefficients" / f"{name}.yaml")
        if cset is not None:
            cset = cset if cset.name else replace(cset, name=name)
            if cset.name != name:  # sources are keyed by the set's own name
                docs["sources"][f"coefficients:{cset.name}"] = \
                    docs["sources"].pop(f"coefficients:{name}")
            docs["coefficients"].append(cset)
    return docs, problems


def check_bundle(path: Path, repos: Repos, refusals: bool = True) -> Checked:
    """A scenario bundle: decode, resolve names, load what they name, validate both layers,
    then (``refusals``) run the refusal checks building a kernel runs, for every pool —
    so a bundle has errors exactly when ``kernel.open`` refuses one of its pools."""
    checked = _check_bundle(path, repos)
    return add_refusals([checked])[0] if refusals else checked


def add_refusals(checked: list[Checked]) -> list[Checked]:
    """Append to each field-valid bundle the refusals of every pool (what ``kernel.pool.build``
    raises as :class:`RefusalError`), resolving all bundles in one database."""
    from . import db

    todo = [c for c in checked if c.inputs is not None and not c.errors()]
    if not todo:
        return checked
    con = db.open_db(apply=False)
    keys: dict[int, str] = {}
    alone: list[Checked] = []
    for c in todo:
        assert c.inputs is not None
        try:
            keys[id(c)] = db.register(con, c.inputs)
        except DocumentError:  # a name another bundle uses for other content: resolve alone
            alone.append(c)
    db.apply_views(con)
    found: dict[str, list[tuple[Any, ...]]] = {}
    for row in con.execute("SELECT scenario, pool, setting, value, reason FROM refusals "
                           "ORDER BY scenario, pool, step, setting, value").fetchall():
        found.setdefault(row[0], []).append(row[1:])
    con.close()
    for c in todo:
        if c in alone:
            assert c.inputs is not None
            con = db.open_db(apply=False)
            key = db.register(con, c.inputs)
            db.apply_views(con)
            rows = con.execute("SELECT pool, setting, value, reason FROM refusals WHERE "
                               "scenario = ? ORDER BY pool, step, setting, value",
                               [key]).fetchall()
            con.close()
        else:
            rows = found.get(keys[id(c)], [])
        c.problems.extend(Problem(c.file, f"deployment.pools[{pool}]",
                                  f"the kernel refuses this pool: {setting} = {value!r}: "
                                  f"{reason}", rule="refusal")
                          for pool, setting, value, reason in rows)
    return checked


def _check_bundle(path: Path, repos: Repos) -> Checked:
    file = str(path)
    scenario, deployment, sources, problems = _decode_bundle(path)
    name = scenario.name if scenario is not None and scenario.name else path.stem
    if scenario is None:
        if deployment is not None:
            lines = sources["deployment"].lines
            problems += [replace(p, path=f"deployment.{p.path}" if p.path else "deployment")
                         for p in validate_deployment(deployment, file, lines=lines)]
        return Checked("scenario bundle", name, file, problems)
    refs = check_references(scenario, file, sources["scenario"].lines, repos)
    if refs or deployment is None:
        report = validate_documents(scenario=scenario, deployment=deployment, sources=sources)
        return Checked("scenario bundle", name, file, problems + refs + report.field)
    docs, load_problems = _load_referenced(scenario, repos)
    sources.update(docs.pop("sources"))
    pack = lookup(scenario.engine_version)
    if not load_problems and pack is not None and docs.get("model") and docs.get("chip") \
            and deployment.pools:
        # What the kernel constructor checks (require_valid) on the same documents.
        inputs = Inputs(scenario, deployment, 0, docs["model"], docs["chip"], docs.get("fabric"),
                        docs["devices"], tuple(docs["coefficients"]), pack, sources,
                        assumed_collective_widths=repos.assumed_collective_widths)
        report = check_inputs(inputs)
        if not load_problems and not report.errors():
            problems += report.problems()
            return Checked("scenario bundle", name, file, problems, inputs)
    else:
        report = validate_documents(scenario=scenario, deployment=deployment,
                                    sources=sources, **docs)
    if load_problems:  # documents that failed to load are not validated; no rule layer
        report.rule, report.rules_applied = [], ""
    problems += load_problems + report.problems()
    if pack is None and not load_problems:  # validation warns; opening the bundle refuses
        problems.append(Problem(file, "engine_version", f"the kernel cannot be built: no rules "
                                f"pack for engine version {scenario.engine_version!r}; "
                                f"published packs: {sorted(PACKS)}", rule="refusal",
                                line=sources["scenario"].lines.get("engine_version", 0)))
    return Checked("scenario bundle", name, file, problems)

