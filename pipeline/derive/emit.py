"""Writing a derived graph exactly as the reference deriver does (model.md §13.1)."""

from __future__ import annotations

from typing import Any

import yaml


def dump_graph(graph: dict[str, Any]) -> str:
    """Block-style YAML, keys in insertion order, width 100: byte-identical to the reference."""
    return yaml.safe_dump(graph, sort_keys=False, default_flow_style=False, width=100)
