"""Test ids are the same in every process: what lets pytest-xdist run the suite in parallel.

One collection of the same arguments in a subprocess under another PYTHONHASHSEED must give
the ids this session collected, in the same order (sets of strings, dict orders built from
them and default reprs would all show here); and the collection-time rule of tests/conftest.py
recognises addresses and temporary paths.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from tests.collection_ids import unstable_ids
from tests.conftest import COLLECTED


def _other_seed() -> str:
    mine = os.environ.get("PYTHONHASHSEED", "random")
    return str(int(mine) + 1) if mine.isdigit() else "4242"


def test_another_hash_seed_collects_the_same_ids_in_the_same_order(
        request: pytest.FixtureRequest) -> None:
    config = request.config
    here = request.session.stash[COLLECTED]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONHASHSEED"] = _other_seed()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
         "-p", "no:cacheprovider", "-p", "no:xdist", *config.args],
        cwd=config.invocation_params.dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = {i.split("::")[0] for i in here}
    there = [line for line in done.stdout.splitlines()
             if "::" in line and line.split("::")[0] in files]
    first = next((n for n, (a, b) in enumerate(zip(here, there, strict=False)) if a != b),
                 min(len(here), len(there)))
    assert here == there, (f"PYTHONHASHSEED={env['PYTHONHASHSEED']} collects differently "
                           f"from test {first}: here {here[first:first + 3]}, "
                           f"there {there[first:first + 3]} ({len(here)} vs {len(there)} ids)")


def test_addresses_and_temporary_paths_are_unstable_ids() -> None:
    tmp = tempfile.gettempdir()
    bad = ["t.py::f[<t.Index object at 0x7f3a2c1b9d50>]", "t.py::f[<function g at 0x10ab>]",
           f"t.py::f[{tmp}/pytest-of-root/pytest-3/x0/a.parquet]", "t.py::f[/x/pytest-of-ci/b]"]
    good = ["t.py::f[Index(-2)]", "t.py::f[0x7fffffffffffffff-True]", "t.py::f[at-0]",
            "t.py::f[tmpfile]", "t.py::f[../../../../etc/passwd]"]
    assert unstable_ids(bad + good) == bad
