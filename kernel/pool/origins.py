"""Where each catalog entry a pool uses came from, for provenance (issue 15).

With a user catalog layered over the embedded one, a model, chip, fabric or storage class can
come from either; each gets one provenance row naming its file. Pools that use only the
embedded catalog get none, so their provenance is unchanged.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.load import Inputs
from pipeline.resources import data_dir

from ..model.resolved import Origin

USER_CATALOG = "user-catalog"
EMBEDDED_CATALOG = "embedded-catalog"
ORIGIN_SETS = frozenset({USER_CATALOG, EMBEDDED_CATALOG})
_ENTRIES = (("model", "model"), ("chip", "hardware"), ("fabric", "network"),
            ("devices", "storage"))


def _embedded(file: str) -> bool:
    try:
        return Path(file).resolve().is_relative_to((data_dir() / "catalog").resolve())
    except (OSError, RuntimeError):
        return False


def catalog_origins(inputs: Inputs) -> tuple[Origin, ...]:
    """One row per catalog document when any of them came from a user catalog."""
    found = [(key, label, inputs.sources[key].file) for key, label in _ENTRIES
             if key in inputs.sources]
    if all(_embedded(file) for _, _, file in found):
        return ()
    names = {"model": inputs.model.name, "chip": inputs.chip.name,
             "fabric": inputs.fabric.name if inputs.fabric else "", "devices": "storage.yaml"}
    rows = []
    for key, label, file in found:
        derived = key == "model" and inputs.model.derived_from.format == "hf_config_json"
        rows.append(Origin(name=f"catalog {label} {names[key]}",
                           set=EMBEDDED_CATALOG if _embedded(file) else USER_CATALOG,
                           method="derived" if derived else "catalog", scope=file))
    return tuple(rows)
