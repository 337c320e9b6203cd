"""Find and read operator tables in AISimulate's layout (one job: locate, choose, read)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

# The catalog's chip names and the AISimulate system directory that measured each.
SYSTEMS: dict[str, str] = {
    "a100-sxm": "a100_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200-nvl72": "gb200",
    "gb300": "gb300",
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "l40s": "l40s",
}


@dataclass(frozen=True)
class OperatorTable:
    """One operator table as found: where it is, what was asked, what was taken."""

    path: Path
    system: str
    family: str
    backend: str
    version: str  # the version the table was measured at
    requested: str  # the engine version asked for
    frame: pl.DataFrame

    @property
    def exact(self) -> bool:
        return self.version == self.requested

    def cite(self) -> str:
        """Where the rows came from, as provenance names it."""
        return (f"NVIDIA AISimulate systems/data/{self.system}/{self.family}/{self.backend}/"
                f"{self.version}/{self.path.name}")


def _version_key(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def choose_version(available: list[str], requested: str) -> str:
    """The requested version when measured, else the newest one below it, else the oldest
    above it (stated in provenance as the nearest the tables have)."""
    if not available:
        raise ValueError("no versions to choose from")
    if requested in available:
        return requested
    want = _version_key(requested)
    below = [v for v in available if _version_key(v) < want]
    if below:
        return max(below, key=_version_key)
    return min(available, key=_version_key)


def data_root(root: str | Path) -> Path:
    """``root`` may be the wheel's unpacked top, ``…/systems`` or ``…/systems/data``."""
    root = Path(root)
    for cand in (root / "aisimulate_core" / "systems" / "data", root / "systems" / "data",
                 root / "data", root):
        if cand.is_dir() and any(p.is_dir() for p in cand.iterdir()):
            if any((cand / s).is_dir() for s in SYSTEMS.values()):
                return cand
    raise ValueError(f"{root}: no operator tables found (expected systems/data/<system>/"
                     f"<family>/<backend>/<version>/*.parquet with one of the systems "
                     f"{sorted(SYSTEMS.values())})")


def family_root(root: str | Path, chip: str, family: str, engine: str
                ) -> tuple[Path, str, str]:
    """(the folder of ``family``'s tables for ``chip`` under ``engine``'s backend, the
    backend, the version asked for), with ``engine`` (``vllm:0.31.0``) and ``chip`` checked."""
    if ":" not in engine:
        raise ValueError(f"--engine {engine!r}: expected BACKEND:VERSION, e.g. vllm:0.31.0")
    backend, version = engine.split(":", 1)
    if chip not in SYSTEMS:
        raise ValueError(f"--chip {chip!r}: no operator-table system for it; known chips: "
                         f"{sorted(SYSTEMS)}")
    return data_root(root) / SYSTEMS[chip] / family / backend, backend, version


def find_table(root: str | Path, chip: str, family: str, table: str, engine: str) -> OperatorTable:
    """The ``table`` parquet of ``family`` for ``chip`` at the engine version nearest
    ``engine`` (``vllm:0.31.0``)."""
    base, backend, version = family_root(root, chip, family, engine)
    system = SYSTEMS[chip]
    versions = sorted((p.name for p in base.iterdir() if (p / f"{table}.parquet").is_file())
                      if base.is_dir() else [], key=_version_key)
    if not versions:
        raise ValueError(f"{base}: no {table}.parquet at any {backend} version for {chip}")
    chosen = choose_version(versions, version)
    path = base / chosen / f"{table}.parquet"
    return OperatorTable(path, system, family, backend, chosen, version, pl.read_parquet(path))
