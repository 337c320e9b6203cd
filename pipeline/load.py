"""Load a scenario bundle and everything it names (model.md §12.1, §9.1)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from . import safe_output
from .decode import decode, decode_map
from .documents import (
    Chip,
    CoefficientSet,
    Deployment,
    Fabric,
    Graph,
    Pool,
    Scenario,
    StorageDevice,
)
from .errors import DocumentError, Problem
from .resources import data_dir
from .rules import PACKS, RulesPack, lookup
from .yamlio import read_documents

T = TypeVar("T")

# How a kernel prices (Repos.pricing): the measured layer over the scenario's sets, or the
# reference's sets alone.
PRICINGS = ("measured", "reference")
MEASURED_LAYER = "vllm-0.31.0"


@dataclass(frozen=True)
class Repos:
    """The three roots a scenario's names resolve against. Unset means the embedded default.

    ``assumed_collective_widths`` (default on) lets a collective group of 16 ranks or more
    that the registry never measured be priced from figures derived from the widest
    measurement, each marked ``assumed`` in provenance (docs/decisions.md, issue 18); off, such
    a group is refused as the reference refuses it.

    ``stated_caches`` (default on) holds sliding-window and hybrid models' caches as vLLM's
    hybrid allocator does (rings, padded state pages: docs/decisions.md G11–G16); off, every
    graph keeps the reference's legacy formulas (window layers held as full KV).

    ``pricing`` (default ``"measured"``) layers the coefficient sets fitted from measured
    operator tables (``layer``, default the embedded ``registry/layers/vllm-0.31.0``) over
    every scenario's own sets, for its chip only: vLLM's tensor-parallel all-reduce priced as
    the engine runs it (docs/decisions.md AC1–AC3). ``"reference"`` prices with the
    scenario's sets alone, the reference's numbers bit for bit.
    """

    scenarios: str | os.PathLike[str] | None = None
    catalog: str | os.PathLike[str] | None = None
    registry: str | os.PathLike[str] | None = None
    assumed_collective_widths: bool = True
    stated_caches: bool = True
    pricing: str = "measured"
    layer: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.pricing not in PRICINGS:
            raise ValueError(f"Repos(pricing={self.pricing!r}): expected one of "
                             f"{list(PRICINGS)} ('reference' reproduces the reference's "
                             "numbers)")

    def layer_root(self) -> Path | None:
        """The measured layer laid over the scenario's coefficient sets (None: reference)."""
        if self.pricing == "reference":
            return None
        return Path(self.layer) if self.layer else data_dir() / "registry" / "layers" / \
            MEASURED_LAYER

    def scenarios_root(self) -> Path:
        return Path(self.scenarios) if self.scenarios else data_dir() / "scenarios"

    def catalog_root(self) -> Path:
        return Path(self.catalog) if self.catalog else data_dir() / "catalog"

    def catalog_roots(self) -> list[Path]:
        """Where catalog names resolve, first match wins: a user catalog layers over the
        embedded one (issue 15), so it need only hold what it adds or replaces."""
        embedded = data_dir() / "catalog"
        user = self.catalog_root()
        return [user] if user.resolve() == embedded.resolve() else [user, embedded]

    def catalog_file(self, relative: str) -> Path:
        """The first catalog root holding ``relative`` (else the user root's path)."""
        roots = self.catalog_roots()
        return next((r / relative for r in roots if (r / relative).exists()), roots[0] / relative)

    def registry_root(self) -> Path:
        return Path(self.registry) if self.registry else data_dir() / "registry"


@dataclass(frozen=True)
class Loaded:
    """Where a document came from and the source line of each key path (for messages)."""

    file: str
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Inputs:
    """The documents a kernel is built from (api.md ``Inputs``)."""

    scenario: Scenario
    deployment: Deployment
    pool_index: int
    model: Graph
    chip: Chip
    fabric: Fabric | None
    devices: tuple[StorageDevice, ...]
    coefficients: tuple[CoefficientSet, ...]
    rules: RulesPack
    sources: dict[str, Loaded] = field(default_factory=dict, compare=False, repr=False)
    # the assumed extension for unmeasured collective widths (see Repos)
    assumed_collective_widths: bool = True
    # caches held as vLLM's hybrid allocator holds them (see Repos)
    stated_caches: bool = True

    @property
    def pool(self) -> Pool:
        return self.deployment.pools[self.pool_index]


def load_document(tp: type[T], path: str | Path, doc_index: int = 0) -> tuple[T, Loaded]:
    """Read one document of kind ``tp`` from ``path`` (the first YAML document by default).

    Documents are immutable, so a file read once is reused until it changes on disk (catalog
    and registry files are shared by every scenario that names them).
    """
    stat = os.stat(path)
    safe_output.note_read(f"the {getattr(tp, '__name__', 'document').lower()} document", path)
    kind: Any = tp  # a class is hashable; typing's type[T] does not say so
    doc, loaded = _load_document_cached(kind, str(Path(path).resolve()), str(path), doc_index,
                                        stat.st_mtime_ns, stat.st_size)
    return doc, loaded


@lru_cache(maxsize=512)
def _load_document_cached(tp: Any, _resolved: str, path: str, doc_index: int,
                          _mtime_ns: int, _size: int) -> tuple[Any, Loaded]:
    docs = read_documents(path)
    if doc_index >= len(docs):
        raise DocumentError(Problem(str(path), "", f"expected at least {doc_index + 1} YAML "
                                    f"document(s), found {len(docs)}"))
    obj, lines = decode(tp, docs[doc_index], str(path))
    return obj, Loaded(str(path), lines)


def load_bundle(path: str | os.PathLike[str]) -> tuple[Scenario, Deployment]:
    """Read a scenario and its deployment from one file of two YAML documents."""
    scenario, deployment, _, _ = _load_bundle(Path(path))
    return scenario, deployment


def _load_bundle(path: Path) -> tuple[Scenario, Deployment, Loaded, Loaded]:
    file = str(path)
    docs = read_documents(path)
    if len(docs) != 2:
        raise DocumentError(Problem(file, "", f"a scenario bundle is two YAML documents "
                                    f"(Scenario, then Deployment); found {len(docs)}"))
    scenario, s_lines = decode(Scenario, docs[0], file)
    deployment, d_lines = decode(Deployment, docs[1], file, "")
    problems = []
    if scenario.kind != "Scenario":
        problems.append(Problem(file, "kind", f'the first document must be kind "Scenario", '
                                f'got "{scenario.kind}"', line=s_lines.get("kind", 0)))
    if deployment.kind != "Deployment":
        problems.append(Problem(file, "kind", f'the second document must be kind "Deployment", '
                                f'got "{deployment.kind}"', line=d_lines.get("kind", 0)))
    if problems:
        raise DocumentError(problems)
    return scenario, deployment, Loaded(file, s_lines), Loaded(file, d_lines)


def resolve_scenario_path(scenario: str | os.PathLike[str], repos: Repos) -> Path:
    """A scenario argument is a filesystem path, or a name under the scenarios root."""
    text = os.fspath(scenario)
    as_path = Path(scenario)
    if as_path.suffix in (".yaml", ".yml") and _is_file(as_path, text):
        return as_path
    root = repos.scenarios_root()
    known = _listing(sorted(p.stem for p in root.glob("*.yaml")) if root.is_dir() else [])
    problem = _name_problem(text)
    if problem:
        raise DocumentError(Problem(_shown(text), "", f"{_shown(text)!r} is no scenario file, "
                                    f"and not a name: {problem}; names under {root}: {known}"))
    for candidate in (root / f"{text}.yaml", root / text):
        if _is_file(candidate, text) and inside(candidate, root):
            return candidate
    raise DocumentError(Problem(_shown(text), "", f"no scenario file {_shown(text)!r} and no "
                                f"scenario named {_shown(text)!r} under {root}; names there: "
                                f"{known}"))


def _listing(names: list[str], most: int = 8) -> str:
    """Names for a message: the first few, and how many in all."""
    if len(names) <= most:
        return ", ".join(names) or "none"
    return ", ".join(names[:most]) + f", ... ({len(names)} in all)"


def _stem_ok(name: str) -> bool:
    return _name_problem(name) is None


# A file name is at most this many bytes on the filesystems we run on (NAME_MAX).
NAME_MAX = 255


def _name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a bare name under a root (None when it can)."""
    if not name or name in (".", ".."):
        return "a name is not empty, '.' or '..'"
    if "/" in name or "\\" in name or ".." in name or os.sep in name:
        return "a name has no path separator and no '..'"
    if "\x00" in name:
        return "a name has no NUL byte"
    if len(name.encode("utf-8", "surrogateescape")) + len(".yaml") > NAME_MAX:
        return f"a name is at most {NAME_MAX - len('.yaml')} bytes"
    return None


def _is_file(path: Path, shown: str) -> bool:
    """``path.is_file()``, with an over-long or otherwise unusable path as a clear error."""
    try:
        return path.is_file()
    except (OSError, ValueError) as exc:
        raise DocumentError(Problem(_shown(shown), "", f"cannot use this path: "
                                    f"{getattr(exc, 'strerror', None) or exc}")) from None


def inside(path: Path, root: Path) -> bool:
    """True when ``path``, symlinks resolved, lies under ``root`` (also resolved)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def _named_file(kind_dir: Path, name: str, file: str, path: str, line: int, what: str) -> Path:
    if not _stem_ok(name):
        raise DocumentError(Problem(file, path, f"{name!r} is not a valid {what} identity: a "
                                    "reference is a bare filename stem, with no path separator, "
                                    "'.', or '..'", line=line))
    target = kind_dir / f"{name}.yaml"
    if not target.is_file() or not inside(target, kind_dir):
        have = sorted(p.stem for p in kind_dir.glob("*.yaml")) if kind_dir.is_dir() else []
        raise DocumentError(Problem(file, path, f"{name!r}: looked for {kind_dir.name}/{name}"
                                    f".yaml under {kind_dir.parent}; there are {have}", line=line))
    return target


def _kind_dir(repos: Repos, kind: str, name: str) -> Path:
    """The catalog root's ``kind`` directory that holds ``name`` (user root first)."""
    roots = repos.catalog_roots()
    if _stem_ok(name):
        for root in roots:
            if (root / kind / f"{name}.yaml").is_file():
                return root / kind
    return roots[0] / kind


def open_inputs(scenario: str | os.PathLike[str], repos: Repos | None = None,
                pool: int = 0) -> Inputs:
    """Load the bundle and every document it names, without building a kernel."""
    repos = repos or Repos()
    bundle_path = resolve_scenario_path(scenario, repos)
    scen, dep, s_loaded, d_loaded = _load_bundle(bundle_path)
    file = str(bundle_path)
    s_line = s_loaded.lines.get
    if not 0 <= pool < len(dep.pools):
        raise DocumentError(Problem(file, "pools", f"pool index {pool} is outside the "
                                    f"deployment's {len(dep.pools)} pool(s)"))
    catalog, registry = repos.catalog_root(), repos.registry_root()
    for label, root in (("--catalog", repos.catalog), ("--registry", repos.registry)):
        if root is not None:  # a command writes nothing into a folder it reads (RL1)
            safe_output.note_read_dir(label, root)
    sources: dict[str, Loaded] = {"scenario": s_loaded, "deployment": d_loaded}

    model_dir = repos.catalog_file(f"models/{scen.model}") if _stem_ok(scen.model) else catalog
    if not _stem_ok(scen.model) or not (model_dir / "graph.yaml").is_file() \
            or not inside(model_dir / "graph.yaml", model_dir.parent):
        have = sorted({p.name for root in repos.catalog_roots() if (root / "models").is_dir()
                       for p in (root / "models").iterdir() if (p / "graph.yaml").is_file()})
        raise DocumentError(Problem(file, "model", f"{scen.model!r}: looked for models/"
                                    f"{scen.model}/graph.yaml under "
                                    f"{', '.join(map(str, repos.catalog_roots()))}; the "
                                    f"catalog has {have}", line=s_line("model", 0)))
    graph, sources["model"] = load_document(Graph, model_dir / "graph.yaml")

    if not scen.cluster.hardware:
        raise DocumentError(Problem(file, "cluster.hardware",
                                    "required: a scenario must name a hardware",
                                    line=s_line("cluster", 0)))
    chip_path = _named_file(_kind_dir(repos, "hardware", scen.cluster.hardware),
                            scen.cluster.hardware, file,
                            "cluster.hardware", s_line("cluster.hardware", 0), "hardware")
    chip, sources["chip"] = load_document(Chip, chip_path)
    chip = replace(chip, name=scen.cluster.hardware)

    fabric = None
    if scen.cluster.fabric:
        fabric_path = _named_file(_kind_dir(repos, "networks", scen.cluster.fabric),
                                  scen.cluster.fabric, file,
                                  "cluster.fabric", s_line("cluster.fabric", 0), "fabric")
        fabric, sources["fabric"] = load_document(Fabric, fabric_path)
        fabric = replace(fabric, name=scen.cluster.fabric)

    devices: tuple[StorageDevice, ...] = ()
    storage_path = repos.catalog_file("devices/storage.yaml")
    if storage_path.is_file():
        classes, lines = decode_map(StorageDevice, read_documents(storage_path)[0],
                                    str(storage_path))
        sources["devices"] = Loaded(str(storage_path), lines)
        for i, tier in enumerate(scen.cluster.storage):
            if tier not in classes:
                raise DocumentError(Problem(file, f"cluster.storage[{i}]", f"{tier!r} is not a "
                                            f"tier in devices/storage.yaml; it has "
                                            f"{sorted(classes)}",
                                            line=s_line("cluster.storage", 0)))
        devices = tuple(classes.values())
    elif scen.cluster.storage:
        raise DocumentError(Problem(file, "cluster.storage", f"storage tiers cannot be resolved: "
                                    f"{storage_path} does not exist",
                                    line=s_line("cluster.storage", 0)))

    sets = []
    for i, set_name in enumerate(scen.coefficients):
        set_path = _named_file(registry / "coefficients", set_name, file, f"coefficients[{i}]",
                               s_line("coefficients", 0), "coefficient set")
        cset, sources[f"coefficients:{set_name}"] = load_document(CoefficientSet, set_path)
        sets.append(replace(cset, name=set_name) if not cset.name else cset)

    for set_path in layer_sets(repos, scen.cluster.hardware):
        if set_path.stem in scen.coefficients:
            continue
        cset, sources[f"coefficients:{set_path.stem}"] = load_document(CoefficientSet, set_path)
        sets.append(replace(cset, name=set_path.stem))
        scen = replace(scen, coefficients=(*scen.coefficients, set_path.stem))

    rules = lookup(scen.engine_version)
    if rules is None:
        raise DocumentError(Problem(file, "engine_version", f"no rules pack for engine version "
                                    f"{scen.engine_version!r}; published packs: {sorted(PACKS)}",
                                    line=s_line("engine_version", 0)))
    return Inputs(scen, dep, pool, graph, chip, fabric, devices, tuple(sets), rules, sources,
                  assumed_collective_widths=repos.assumed_collective_widths,
                  stated_caches=repos.stated_caches)


def layer_sets(repos: Repos, chip: str) -> list[Path]:
    """The measured layer's coefficient sets for ``chip``: ``<layer>/coefficients/
    <family>-<chip>.yaml``, in name order (none under reference pricing or for a chip the
    layer does not cover). A set the scenario already names is not added twice."""
    root = repos.layer_root()
    if root is None:
        return []
    where = root / "coefficients"
    if repos.layer and not where.is_dir():
        raise DocumentError(Problem(str(root), "", "a registry layer holds its sets under "
                                    "coefficients/; that directory does not exist"))
    if not _stem_ok(chip) or not where.is_dir():
        return []
    return sorted(p for p in where.glob(f"*-{chip}.yaml") if p.is_file())


def _shown(text: str) -> str:
    """A name as a message shows it: at most 80 characters, control characters escaped."""
    short = text if len(text) <= 80 else text[:77] + "..."
    return short.encode("unicode_escape", "backslashreplace").decode("ascii")
