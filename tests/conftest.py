"""Suite-wide collection rules: every process must collect the same test ids in the same order
(pytest-xdist workers each collect the suite and compare), see tests/collection_ids.py."""

from __future__ import annotations

import pytest

from tests.collection_ids import unstable_ids

# The ids collected, before -k/-m deselection, for tests/test_collection_ids.py to compare
# with a collection in another process.
COLLECTED = pytest.StashKey[list[str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    ids = [item.nodeid for item in items]
    bad = unstable_ids(ids)
    if bad:
        raise pytest.UsageError(
            f"{len(bad)} test id(s) name a memory address or a temporary path, so they differ "
            "from one process to the next (pytest-xdist workers would disagree): "
            + "; ".join(bad[:5]) + ". Give the parametrization explicit ids= (or a __repr__).")
    session.stash[COLLECTED] = ids
