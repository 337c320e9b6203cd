"""The scheduler's shortcuts give what its general path gives (decisions EF4, EF5, RS3-RS5).

``Simulation._step_steady`` (a steady core's step in one piece: its decodes, its tail and
Phase B's admissions, with the fill wheel), ``_schedule``'s tail route (a steady core's tail
scheduled as scalars after its decodes) and the blocked-head shortcut (a waiting head known
to be still blocked is not looked up again) only skip work: with all three turned off, every
step goes through ``_schedule``'s general Phase A and ``_launch_one``, and every blocked head
is looked up again, and the outputs must hash the same, column by column. The pinned replays
(tests/test_replay_pin.py) compare with stored digests; this compares the two paths directly
(on the pinned cases and on two more with chunked prefills under async scheduling), and
checks that each case really took the shortcuts it is meant to cover. These are the Python
engine's (``BLIS_JIT=0``); the compiled engine is compared with it in
tests/test_replay_compiled.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kernel.replay import ReplayOptions, engine, replay
from tests.jit_modes import jit_switched
from tests.replay_pin import DENSE, MOE, _rows, digest, run_case
from tests.replay_support import kernel_for, request_set

# the pinned cases where the fast paths run: open and closed loops, prefix hits with a small
# pool (blocked heads), preemption, MoE lockstep groups (_schedule for every step), chunked
# prefills (sync), DP cores, P/D pools
CASES = ("dense_open", "prefix", "prefix_small_kv", "preempt_small_kv", "preempt_small_kv_moe",
         "dense_sync_chunked", "dp_round_robin", "pd")
# and two more, compared here only: long prompts chunked under a small budget with async
# scheduling (tails, admissions behind them, budget cuts while finished requests wait to
# leave), on a dense core with prefix hits and on an MoE lockstep group
_LONG = _rows(5, 160, rate_ns=2_000_000, prompt=(200, 3000), output=(1, 60), groups=3)
EXTRA = {
    "chunked_prefix": (DENSE, ReplayOptions(max_num_batched_tokens=512), 16),
    "chunked_moe": (MOE, ReplayOptions(dp=2, max_num_batched_tokens=512), None),
}


@pytest.fixture(autouse=True)
def _python_engine() -> Any:
    with jit_switched(False):  # the engine whose shortcuts these are
        yield


def _run(name: str) -> Any:
    if name not in EXTRA:
        return run_case(name)
    scenario, opts, hash_tokens = EXTRA[name]
    rows = _LONG if hash_tokens else [{k: v for k, v in r.items() if k != "prefix_hashes"}
                                      for r in _LONG]
    return replay(kernel_for(scenario), request_set(rows, hash_block_tokens=hash_tokens), opts)


def _general_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.Simulation, "_step_steady", lambda *a, **kw: False)
    steady_a = engine.Simulation._phase_a_steady

    def no_tail_route(self: Any, c: Any, budget: int) -> Any:
        # a core with a tail takes the general Phase A (it rebuilds its running array)
        return None if c.tail else steady_a(self, c, budget)

    monkeypatch.setattr(engine.Simulation, "_phase_a_steady", no_tail_route)
    phase_b = engine.Simulation._phase_b

    def looked_up_again(self: Any, c: Any, budget: int, start: int) -> Any:
        out = phase_b(self, c, budget, start)
        c.blocked_head = -1  # never known blocked: the next step looks the head up again
        return out

    monkeypatch.setattr(engine.Simulation, "_phase_b", looked_up_again)


def _count(mp: pytest.MonkeyPatch, name: str, counts: dict[str, int], key: str,
           weight: Callable[[Any], int] = lambda out: 1) -> None:
    """Count the calls of ``Simulation.<name>`` in ``counts[key]`` (each by ``weight`` of
    what it returns)."""
    method = getattr(engine.Simulation, name)

    def counted(self: Any, *a: Any) -> Any:
        out = method(self, *a)
        counts[key] += weight(out)
        return out

    mp.setattr(engine.Simulation, name, counted)


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"fast": 0, "phase_b": 0, "fast_rows_after": 0, "tail_route": 0}
    _count(monkeypatch, "_step_steady", counts, "fast", bool)
    _count(monkeypatch, "_phase_b", counts, "phase_b")
    # a fast step with a tail or admissions
    _count(monkeypatch, "_tail_sampled", counts, "fast_rows_after")
    _count(monkeypatch, "_phase_a_steady", counts, "tail_route",
           lambda out: out is not None and out[4] is not None)
    return counts


# the shortcuts each case must take (besides _step_steady on every one-core case)
TAKES = {"dense_open": "fast_rows_after", "dense_sync_chunked": "fast_rows_after",
         "chunked_prefix": "fast_rows_after", "pd": "tail_route", "chunked_moe": "tail_route"}


@pytest.mark.parametrize("name", CASES + tuple(EXTRA))
def test_fast_paths_match_the_general_path(name: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        counts = _counting(mp)
        fast = digest(_run(name))
    with pytest.MonkeyPatch.context() as mp:
        _general_only(mp)
        b_calls = {"n": 0}
        _count(mp, "_phase_b", b_calls, "n")
        general = digest(_run(name))
    diff = sorted(f"{t}.{c}" for t in general for c in general[t]
                  if fast[t].get(c) != general[t][c])
    assert not diff, f"{name}: the fast paths change {diff}"
    if name not in ("preempt_small_kv_moe", "chunked_moe", "pd"):  # (two-core groups:
        assert counts["fast"] > 0, f"{name}: no step took _step_steady"  # _schedule only)
    if name in TAKES:
        assert counts[TAKES[name]] > 0, f"{name}: no step took {TAKES[name]} ({counts})"
    if name == "prefix_small_kv":  # blocked heads are known blocked, not looked up again
        assert counts["phase_b"] < b_calls["n"], (counts, b_calls)
