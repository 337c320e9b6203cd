"""The replay's outputs are pinned: fixed-seed replays on every engine path (tests/replay_pin.py)
hash column by column to the digests main's replay gave before the speed-up, at c19e098
(tests/data/replay_pin.json; regenerated only when behaviour is meant to change: see
tests/replay_pin.py for the command).
Speed work on the scheduler's bookkeeping must leave every byte of the outputs as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.replay_pin import cases, digest, run_case

PINNED = json.loads((Path(__file__).parent / "data" / "replay_pin.json").read_text())


def test_every_case_is_pinned():
    assert sorted(PINNED) == sorted(cases())


def test_the_cases_reach_the_paths_they_pin():
    """Preemption, prefix hits and evictions, rejects: each case still exercises its path."""
    assert PINNED["dense_open"]["rejects"]["rows"] == 2
    for name in ("preempt_small_kv", "prefix_small_kv", "preempt_small_kv_moe"):
        assert run_case(name).summary["preemptions"] > 0
    assert run_case("prefix").summary["prefix_hit_rate"] > 0.2


@pytest.mark.parametrize("name", sorted(cases()))
def test_replay_outputs_unchanged(name):
    got, want = digest(run_case(name)), PINNED[name]
    diff = {f"{table}.{col}": (got[table].get(col), v) for table, cols in want.items()
            for col, v in cols.items() if got[table].get(col) != v}
    extra = {f"{t}.{c}" for t in got for c in got[t] if c not in want.get(t, {})}
    assert not diff and not extra, f"{name}: changed {sorted(diff)} new {sorted(extra)}"
