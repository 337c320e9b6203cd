"""YAML files of the request side (TraceV2 headers, load specs, inference-perf configs), read
with the project's guards: pipeline.yamlio refuses binary files, billion-laughs aliases and
runaway nesting before anything expands; the typed values then come from PyYAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.yamlio import read_documents


def load_yaml(path: str | Path) -> Any:
    """The first YAML document of ``path`` as plain Python values."""
    read_documents(path)  # raises DocumentError naming the file on any unsafe input
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
