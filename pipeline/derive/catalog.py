"""Derived graphs on disk: deriving from files, adding a model to a user catalog, and the
``--check`` pass that re-derives every graph that has a config beside it."""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import safe_output
from .config import DeriveError
from .emit import dump_graph
from .registry import derive_config

QUANT_FILE = "hf_quant_config.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def default_name(config_path: Path) -> str:
    """A catalog name from a config file name: ``org--Repo_config.json`` -> ``repo``."""
    stem = config_path.name
    for suffix in ("_config.json", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if stem == "config":
        stem = config_path.resolve().parent.name
    return stem.split("--")[-1].lower()


def check_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise DeriveError(f"{name!r} is not a valid model name: use letters, digits, '.', '_' "
                          f"and '-', starting with a letter or digit")
    return name


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    safe_output.note_read(f"the {what}", path)
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DeriveError(f"{path}: cannot read the {what}: {exc.strerror}") from None


def derive_file(config: str | os.PathLike[str], name: str | None = None,
                quant: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Derive the graph of a ``config.json`` on disk (and an optional hf_quant_config)."""
    path = Path(config)
    model = check_name(name or default_name(path))
    data = _read(path, "config")
    qdata = _read(quant, "quantisation config") if quant is not None else None
    try:
        return derive_config(data, model, qdata, source=str(path))
    except (KeyError, TypeError) as exc:  # a malformed value deep in a config
        raise DeriveError(f"{path}: cannot derive {model!r}: {type(exc).__name__}: {exc}") \
            from None


def write_graph(graph: dict[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "graph.yaml"
    safe_output.write_text(target, dump_graph(graph))
    return target


def add_model(config: str | os.PathLike[str], catalog: str | os.PathLike[str],
              name: str | None = None, quant: str | os.PathLike[str] | None = None,
              repo: str | None = None, revision: str = "main") -> Path:
    """Create ``models/<name>/{config.json, model.yaml, graph.yaml}`` under ``catalog``; the
    config is copied byte for byte (so the graph's sha256 names it) and refused if the entry
    already exists with different contents."""
    path = Path(config)
    graph = derive_file(path, name, quant)
    model = graph["name"]
    entry = Path(catalog) / "models" / model
    data = _read(path, "config")
    if (entry / "config.json").is_file() and (entry / "config.json").read_bytes() != data:
        raise DeriveError(f"{entry}: already holds a different config.json; remove the entry "
                          f"or choose another --name")
    entry.mkdir(parents=True, exist_ok=True)
    safe_output.write_bytes(entry / "config.json", data)
    if quant is not None:
        safe_output.write_bytes(entry / QUANT_FILE, _read(quant, "quantisation config"))
    identity = {"name": model,
                "source": {"provider": "huggingface",
                           "repo": repo or _repo_from_file(path, model),
                           "revision": revision,
                           "retrieved": _dt.date.today().isoformat()}}
    safe_output.write_text(entry / "model.yaml", yaml.safe_dump(identity, sort_keys=False))
    return write_graph(graph, entry)


def _repo_from_file(path: Path, model: str) -> str:
    stem = path.name.removesuffix("_config.json")
    return stem.replace("--", "/", 1) if "--" in stem else model


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # current | stale | failed
    detail: str = ""


def check_catalog(catalog: str | os.PathLike[str]) -> list[CheckResult]:
    """Re-derive every ``models/<name>/graph.yaml`` that has a ``config.json`` beside it.

    A graph is current when its document equals the re-derivation (our embedded catalog stores
    graphs re-serialised, so documents are compared, not bytes; decisions.md)."""
    models = Path(catalog) / "models"
    out: list[CheckResult] = []
    if not models.is_dir():
        return out
    for entry in sorted(p for p in models.iterdir() if (p / "config.json").is_file()):
        quant = entry / QUANT_FILE
        try:
            derived = derive_file(entry / "config.json", entry.name,
                                  quant if quant.is_file() else None)
        except DeriveError as exc:
            out.append(CheckResult(entry.name, "failed", str(exc)))
            continue
        graph_file = entry / "graph.yaml"
        if not graph_file.is_file():
            out.append(CheckResult(entry.name, "stale", "graph.yaml is missing"))
            continue
        stored = yaml.safe_load(graph_file.read_text())
        if stored == json.loads(json.dumps(derived)):
            out.append(CheckResult(entry.name, "current"))
        else:
            out.append(CheckResult(entry.name, "stale", "graph.yaml differs from a "
                                   "re-derivation: " + "; ".join(diff(derived, stored)[:5])))
    return out


def diff(derived: Any, stored: Any, path: str = "") -> list[str]:
    """Where two graph documents differ, as ``key.path: derived vs stored`` lines."""
    if isinstance(derived, dict) and isinstance(stored, dict):
        lines = []
        for key in dict.fromkeys([*derived, *stored]):
            where = f"{path}.{key}" if path else str(key)
            if key not in stored:
                lines.append(f"{where}: only in the derivation ({derived[key]!r})")
            elif key not in derived:
                lines.append(f"{where}: only in the stored graph ({stored[key]!r})")
            else:
                lines += diff(derived[key], stored[key], where)
        return lines
    if isinstance(derived, list) and isinstance(stored, list):
        lines = [] if len(derived) == len(stored) else [
            f"{path}: {len(derived)} entries derived, {len(stored)} stored"]
        for i, (a, b) in enumerate(zip(derived, stored, strict=False)):
            lines += diff(a, b, f"{path}[{i}]")
        return lines
    return [] if derived == stored else [f"{path}: derived {derived!r}, stored {stored!r}"]
