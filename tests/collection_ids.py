"""Test ids that differ from one process to the next.

pytest-xdist has every worker collect the suite and refuses to run when two workers disagree
on one id or on their order ("Different tests were collected between gw0 and gw1"). An id that
holds a memory address (the default repr of an object) or a temporary path is new in every
process, so it is rejected at collection (tests/conftest.py); ids or orders that follow the
hash seed (a set of strings, say) are caught by tests/test_collection_ids.py.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")  # <X object at 0x7f...>, <function f at 0x...>


def _temporary_roots() -> tuple[str, ...]:
    roots = {tempfile.gettempdir(), str(Path(tempfile.gettempdir()).resolve())}
    return tuple(sorted(r.rstrip("/") + "/" for r in roots)) + ("pytest-of-",)


def unstable_ids(ids: list[str]) -> list[str]:
    """The ids that name a memory address or a temporary path, in their order."""
    roots = _temporary_roots()
    return [i for i in ids if _ADDRESS.search(i) or any(r in i for r in roots)]
