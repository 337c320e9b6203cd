"""Derive a ModelGraph from a HuggingFace ``config.json`` (model.md §13).

``config`` reads the config (aliases, dtypes, quantisation), ``nodes`` builds nodes,
``families``/``hybrids`` hold the per-architecture rules, ``registry`` picks the handler and
assembles the graph, ``emit`` writes it, ``catalog`` puts it on disk.
"""

from __future__ import annotations

import os
from typing import Any

from .config import DeriveError
from .emit import dump_graph
from .registry import DERIVER_VERSION, REFUSED, derive_config, supported_architectures

__all__ = ["DERIVER_VERSION", "REFUSED", "DeriveError", "derive_config", "derive_graph",
           "dump_graph", "supported_architectures"]


def derive_graph(config: str | os.PathLike[str] | bytes | dict[str, Any],
                 name: str | None = None,
                 quant: str | os.PathLike[str] | bytes | dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The graph a config derives, as an ordered dict (write it with :func:`dump_graph`).

    ``config`` is a path to a ``config.json``, its bytes, or a parsed dict; ``quant`` the same
    for an ``hf_quant_config.json``. ``name`` defaults to one taken from the file name.
    """
    from .catalog import derive_file

    if isinstance(config, bytes | dict):
        if not name:
            raise DeriveError("a config given as bytes or a dict needs a name")
        q = quant
        if isinstance(q, str | os.PathLike):
            with open(q, "rb") as fh:
                q = fh.read()
        return derive_config(config, name, q)
    if isinstance(quant, bytes | dict):
        raise DeriveError("give quant as a path when config is a path")
    return derive_file(config, name, quant)
