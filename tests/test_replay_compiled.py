"""The compiled engine (kernel/replay/jit_engine.py) gives what the Python engine
(kernel/replay/engine.py) gives, byte for byte (decision CE1).

The Python engine is the statement of vLLM v0.31's scheduler the replay implements (its
shortcuts against its general path: tests/test_replay_fast_paths.py; its KV pool against a
literal model of vLLM's block pool: tests/test_replay_kv_cache.py, test_replay_kv_units.py),
and runs where numba is missing or ``BLIS_JIT=0``. Here random request sets under random engine
settings are replayed by both, every output column hashed (tests/replay_pin.py's digest): small
KV pools (preemption, evictions, blocked heads), prefix hash chains whose entries cover less
than, exactly or more than an engine block (units of several blocks, split when two requests'
blocks diverge, duplicates), chunked prefills under small budgets and thresholds, async and
sync scheduling, DP cores behind both routers, MoE lockstep groups, closed-loop sessions, and
a P/D deployment. The pinned replays (tests/test_replay_pin.py) run on the compiled engine
wherever numba is installed.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.replay import ReplayOptions, replay
from kernel.replay.api import engine_limits
from tests.jit_modes import jit_switched
from tests.replay_pin import PD, _pools, digest
from tests.replay_support import kernel_for, request_set

pytest.importorskip("numba", reason="the compiled engine needs numba")

SCENARIOS = ("llama-3.1-8b-h100-tp1", "qwen3-30b-a3b-h100-tp2")


@st.composite
def loads(draw: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Requests open loop or in closed sessions, with prefix chains from a few groups."""
    n = draw(st.integers(1, 30))
    hash_tokens = draw(st.sampled_from([None, 8, 16, 24, 32, 64]))
    groups = draw(st.integers(1, 3))
    sessions = draw(st.sampled_from([0, 0, 2, 5]))
    rows: list[dict[str, Any]] = []
    t = 0
    for i in range(n):
        t += draw(st.integers(0, 30_000_000))
        p = draw(st.integers(1, 700))
        row: dict[str, Any] = {"request_id": f"r{i}", "prompt_tokens": p,
                               "output_tokens": draw(st.integers(1, 40))}
        if sessions and i >= sessions:
            row["session_id"] = f"s{i % sessions}"
            row["think_ns"] = draw(st.integers(0, 5_000_000))
        else:
            row["arrival_ns"] = t
            if sessions:
                row["session_id"] = f"s{i % sessions}"
        if hash_tokens:
            entries = p // hash_tokens
            g = draw(st.integers(0, groups - 1))
            shared = draw(st.integers(0, entries))
            row["prefix_hashes"] = ([1000 * g + j for j in range(shared)]
                                    + [10**6 + 1000 * i + j for j in range(entries - shared)])
        rows.append(row)
    return rows, hash_tokens


@st.composite
def settings_for(draw: Any, scenario: str) -> ReplayOptions:
    fixed = engine_limits(kernel_for(scenario), ReplayOptions())[0].fixed_blocks
    return ReplayOptions(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.sampled_from([16, 48, 100, 512, 8192])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 64])),
        # 47 blocks hold the longest request (740 tokens) alone
        num_blocks=fixed + draw(st.integers(47, 160)),
        enable_prefix_caching=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        dp=draw(st.sampled_from([1, 1, 2, 3])),
        lockstep=draw(st.booleans()),
        router=draw(st.sampled_from(["least_loaded", "round_robin"])),
        estimate=draw(st.sampled_from(["overlap", "no_overlap"])),
        keep_steps=draw(st.booleans()),
    )


def _both(k: Any, rows: list[dict[str, Any]], hash_tokens: int | None,
          opts: ReplayOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    rs = request_set(rows, hash_block_tokens=hash_tokens)
    with jit_switched(False):
        python = digest(replay(k, rs, opts, slo={"ttft": 0.2, "itl": 0.02}))
    with jit_switched(True):
        compiled = digest(replay(k, rs, opts, slo={"ttft": 0.2, "itl": 0.02}))
    return python, compiled


def _differ(python: dict[str, Any], compiled: dict[str, Any]) -> list[str]:
    return sorted(f"{t}.{c}" for t in python for c in python[t]
                  if python[t][c] != compiled.get(t, {}).get(c))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_compiled_engine_replays_as_the_python_engine(data: Any) -> None:
    scenario = data.draw(st.sampled_from(SCENARIOS))
    rows, hash_tokens = data.draw(loads())
    opts = data.draw(settings_for(scenario))
    python, compiled = _both(kernel_for(scenario), rows, hash_tokens, opts)
    assert not _differ(python, compiled), (_differ(python, compiled), opts)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loads(), st.booleans(), st.sampled_from([0, 64]))
def test_the_compiled_engine_hands_off_as_the_python_engine(load: Any, sync: bool,
                                                            threshold: int) -> None:
    rows, hash_tokens = load
    opts = ReplayOptions(async_scheduling=not sync, long_prefill_token_threshold=threshold)
    python, compiled = _both(_pools(PD), rows, hash_tokens, opts)
    assert not _differ(python, compiled), _differ(python, compiled)


def test_a_unit_split_by_a_partial_hit_replays_as_the_python_engine() -> None:
    # 512-token chain entries (32 blocks a unit): the second request's prompt ends inside the
    # first's unit, so its hit takes part of a unit (split), and the third registers a block
    # the first holds (a duplicate)
    chain = list(range(8))
    rows = [{"request_id": "a", "arrival_ns": 0, "prompt_tokens": 4096, "output_tokens": 30,
             "prefix_hashes": chain},
            {"request_id": "b", "arrival_ns": 200_000_000, "prompt_tokens": 1300,
             "output_tokens": 5, "prefix_hashes": chain[:2]},
            {"request_id": "c", "arrival_ns": 200_000_000, "prompt_tokens": 4096,
             "output_tokens": 5, "prefix_hashes": chain}]
    python, compiled = _both(kernel_for(), rows, 512, ReplayOptions(num_blocks=400))
    assert python == compiled


def test_the_pinned_replays_run_compiled_where_numba_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.replay import jit_driver
    from tests.replay_pin import run_case

    calls = []
    run = jit_driver.run
    monkeypatch.setattr(jit_driver, "run", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    with jit_switched(True):
        run_case("prefix_small_kv")
    assert calls == [1]
