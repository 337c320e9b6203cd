"""The scheduler's shortcuts give what its general path gives (decisions EF4, EF5).

``Simulation._step_steady`` (a steady decode step in one piece) and the blocked-head shortcut
(a waiting head known to be still blocked is not looked up again) only skip work: with both
turned off, every step goes through ``_schedule``/``_launch_one`` and every blocked head is
looked up again, and the outputs must hash the same, column by column. The pinned replays
(tests/test_replay_pin.py) compare with stored digests; this compares the two paths directly,
and checks that each case really took the shortcuts it is meant to cover.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel.replay import engine
from tests.replay_pin import digest, run_case

# the pinned cases where the fast paths run: open and closed loops, prefix hits with a small
# pool (blocked heads), preemption, an MoE lockstep group (its steps take the general path)
CASES = ("dense_open", "prefix", "prefix_small_kv", "preempt_small_kv", "preempt_small_kv_moe")


def _general_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.Simulation, "_step_steady", lambda *a, **kw: False)
    phase_b = engine.Simulation._phase_b

    def looked_up_again(self: Any, c: Any, budget: int, start: int) -> Any:
        out = phase_b(self, c, budget, start)
        c.blocked_head = -1  # never known blocked: the next step looks the head up again
        return out

    monkeypatch.setattr(engine.Simulation, "_phase_b", looked_up_again)


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"fast": 0, "phase_b": 0}
    fast, phase_b = engine.Simulation._step_steady, engine.Simulation._phase_b

    def counted_fast(self: Any, *a: Any) -> bool:
        took = fast(self, *a)
        counts["fast"] += took
        return took

    def counted_b(self: Any, *a: Any) -> Any:
        counts["phase_b"] += 1
        return phase_b(self, *a)

    monkeypatch.setattr(engine.Simulation, "_step_steady", counted_fast)
    monkeypatch.setattr(engine.Simulation, "_phase_b", counted_b)
    return counts


@pytest.mark.parametrize("name", CASES)
def test_fast_paths_match_the_general_path(name: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        counts = _counting(mp)
        fast = digest(run_case(name))
    with pytest.MonkeyPatch.context() as mp:
        _general_only(mp)
        b_calls = {"n": 0}
        phase_b = engine.Simulation._phase_b

        def counted_b(self: Any, *a: Any) -> Any:
            b_calls["n"] += 1
            return phase_b(self, *a)

        mp.setattr(engine.Simulation, "_phase_b", counted_b)
        general = digest(run_case(name))
    diff = sorted(f"{t}.{c}" for t in general for c in general[t]
                  if fast[t].get(c) != general[t][c])
    assert not diff, f"{name}: the fast paths change {diff}"
    if name != "preempt_small_kv_moe":  # (a two-core lockstep group: general path only)
        assert counts["fast"] > 0, f"{name}: no step took _step_steady"
    if name == "prefix_small_kv":  # blocked heads are known blocked, not looked up again
        assert counts["phase_b"] < b_calls["n"], (counts, b_calls)
