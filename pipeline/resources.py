"""Where the embedded data and SQL live, in a checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_RESOURCES = Path(__file__).resolve().parent.parent / "kernel" / "_resources"
_CHECKOUT = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    """The ``sql`` or ``data`` directory: the wheel's copy if installed, else the checkout's."""
    for base in (_PACKAGE_RESOURCES, _CHECKOUT):
        candidate = base / name
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the {name}/ directory is missing from this installation")


def data_dir() -> Path:
    return resource_dir("data")


def sql_dir() -> Path:
    return resource_dir("sql")
