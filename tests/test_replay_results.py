"""The replay results' vectorised computations against plain per-request references
(hypothesis): token times and inter-token latencies (``token_times``), per-request percentiles
(``run_percentiles``); the replay's setup: reject reasons, session chains and arrivals
(``_arrivals``) (decisions RR1, RR2)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kernel.replay.api import _arrivals, _reject_reason
from kernel.replay.engine import EngineLimits
from kernel.replay.results import run_percentiles, token_times
from tests.jit_modes import jit_mode  # noqa: F401  (a fixture: the compiled engine, then none)

QS = (0.0, 0.5, 0.9, 0.99, 1.0)


def percentile_reference(run: list[float], q: float) -> float:
    """The q-th of one run: linear interpolation between the sorted values around q·(n − 1)."""
    if not run:
        return -1.0
    v = sorted(run)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    a, b = float(v[lo]), float(v[hi])
    return a + (b - a) * (pos - lo)


def runs(values: np.ndarray, counts: list[int]) -> list[list[float]]:
    out, i = [], 0
    for c in counts:
        out.append(values[i:i + c].tolist())
        i += c
    return out


value_sets = st.sampled_from([
    st.integers(0, 3),  # many ties
    st.integers(0, 10**9),
    st.integers(2**40 - 3, 2**41),  # past the (group, value) key's 40 bits
    st.integers(-5, 5),  # negative: the general sort
])


@pytest.mark.usefixtures("jit_mode")  # (each run sorted alone, compiled; the key sort)
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), st.lists(st.integers(0, 6), max_size=12), value_sets,
       st.sampled_from(["int64", "float64", "half"]))
def test_run_percentiles_are_the_plain_ones(data, counts, values, kind):
    total = sum(counts)
    v = np.asarray(data.draw(st.lists(values, min_size=total, max_size=total)), np.int64)
    if kind == "float64":
        v = v.astype(np.float64)  # integral floats: the key sort too
    elif kind == "half":
        v = v + 0.5  # not integral: the general sort
    got = run_percentiles(v, np.asarray(counts, np.int64), QS)
    for q, out in zip(QS, got, strict=True):
        want = [percentile_reference(r, q) for r in runs(v, counts)]
        assert out.tolist() == want, q


def tokens_of(draw_counts: list[int], prompts: list[int], rng: random.Random,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[list[int]]]:
    """A random sampled order of every request's tokens (each request's in its own order),
    cut into steps with nondecreasing ends: (request, known before, step) per token, the
    steps' ends, and each request's step ends in token order."""
    left = list(draw_counts)
    sampled = []
    while any(left):
        r = rng.choice([i for i, c in enumerate(left) if c])
        sampled.append(r)
        left[r] -= 1
    seen = [0] * len(draw_counts)
    req, known, batch = [], [], []
    step_end = [rng.randrange(0, 1000)]
    per: list[list[int]] = [[] for _ in draw_counts]
    for r in sampled:
        if rng.random() < 0.6:  # a new step
            step_end.append(step_end[-1] + rng.choice([0, 1, 7, rng.randrange(0, 10**6)]))
        req.append(r)
        known.append(prompts[r] + seen[r])
        seen[r] += 1
        batch.append(len(step_end) - 1)
        per[r].append(step_end[-1])
    return (np.asarray(req, np.int64), np.asarray(known, np.int64),
            np.asarray(batch, np.int64), np.asarray(step_end, np.int64), per)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 50)), min_size=1, max_size=10),
       st.integers(0, 5000), st.randoms(use_true_random=False))
def test_token_times_are_the_plain_ones(reqs, otok, rng):
    counts = [c for c, _ in reqs]
    prompts = [p for _, p in reqs]
    req, known, batch, step_end, per = tokens_of(counts, prompts, rng)
    emitted, first, last, itl = token_times(req, known, batch, step_end,
                                            np.asarray(prompts, np.int64), otok)
    visible = [[e + (j + 1) * otok for j, e in enumerate(ends)] for ends in per]
    assert emitted.tolist() == counts
    assert first.tolist() == [v[0] if v else -1 for v in visible]
    assert last.tolist() == [v[-1] if v else -1 for v in visible]
    assert itl.tolist() == [b - a for v in visible for a, b in zip(v, v[1:], strict=False)]


def test_a_token_before_its_prompt_or_of_no_step_is_refused():
    with pytest.raises(AssertionError, match="before its prompt"):
        token_times(np.array([0, 0]), np.array([4, 5]), np.array([0, 1]), np.array([10, 20]),
                    np.array([5]), 1)
    with pytest.raises(AssertionError, match="not recorded"):
        token_times(np.array([0, 0]), np.array([5, 6]), np.array([0, 2]), np.array([10, 20]),
                    np.array([5]), 1)


# -- the setup before the engine runs -------------------------------------------------------

def arrivals_reference(sessions: list[Any], arrival: list[int], prompt: list[int],
                       output: list[int], think: list[int], limits: list[EngineLimits]
                       ) -> tuple[list[str | None], dict[int, int], list[int]]:
    """Row by row: the scalar reject reason, then the session chain (each row with a
    think time and no arrival follows the last earlier row of its session)."""
    reason = [_reject_reason(p, o, a, t, limits, False)
              for p, o, a, t in zip(prompt, output, arrival, think, strict=True)]
    follower: dict[int, int] = {}
    last_of: dict[Any, int] = {}
    first: list[int] = []
    for i, sid in enumerate(sessions):
        if arrival[i] < 0 and think[i] >= 0:
            prev = last_of.get(sid) if sid is not None else None
            if prev is None:
                if reason[i] is None:
                    reason[i] = (f"think_ns set but no earlier request of session {sid!r} "
                                 f"to follow")
            else:
                follower[prev] = i
        elif reason[i] is None or arrival[i] >= 0:
            first.append(i)
        if sid is not None:
            last_of[sid] = i
    # what follows a request that never arrives never arrives: rejected, naming the request
    # it follows
    reached: set[int] = set()
    for i in first:
        j: int | None = i
        while j is not None and j not in reached:
            reached.add(j)
            j = follower.get(j)
    leader = {b: a for a, b in follower.items()}
    for i in range(len(sessions)):
        if i not in reached and reason[i] is None:
            reason[i] = (f"follows request {str(leader[i])!r} of session {sessions[i]!r}, "
                         f"which never arrives")
    return reason, follower, first


def limits_of(max_model_len: int, blocks: int, fixed: int, block_size: int) -> EngineLimits:
    return EngineLimits(max_num_seqs=8, max_num_batched_tokens=64,
                        long_prefill_token_threshold=0, block_size=block_size,
                        num_blocks=blocks, fixed_blocks=fixed, max_model_len=max_model_len,
                        prefix_caching=False, async_scheduling=True)


lengths = st.one_of(st.integers(-2, 3), st.integers(0, 200),
                    st.sampled_from([2**62 - 1, 2**62, 2**63 - 1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "a", "b", "c"]), st.integers(-1, 3),
                          lengths, lengths, st.integers(-1, 2)), max_size=12),
       st.lists(st.tuples(st.sampled_from([0, 50, 120, 2**62]),
                          st.one_of(st.integers(1, 12), st.sampled_from([2**58, 2**60])),
                          st.integers(0, 3), st.sampled_from([1, 4, 16])),
                min_size=1, max_size=2),
       st.booleans())
# lengths whose sum passes int64, on a core whose blocks hold 2**62 tokens
@example(rows=[(None, 0, 2**62, 2**62, -1)], lims=[(0, 2**58, 0, 16)], with_sessions=False)
def test_arrivals_are_the_row_by_row_ones(rows, lims, with_sessions):
    sessions = [r[0] if with_sessions else None for r in rows]
    cols = {name: [r[j] for r in rows] for j, name in
            enumerate(("session_id", "arrival_ns", "prompt_tokens", "output_tokens",
                       "think_ns"))}
    table = pa.table({name: pa.array(v, pa.int64()) for name, v in cols.items()
                      if name != "session_id"})
    if with_sessions:
        table = table.append_column("session_id", pa.array(sessions, pa.string()))
    limits = [limits_of(*x) for x in lims]
    a = [np.asarray(cols[c], np.int64) for c in ("arrival_ns", "prompt_tokens",
                                                 "output_tokens", "think_ns")]
    got = _arrivals(table, a[0], a[1], a[2], a[3], limits, False)
    want = arrivals_reference(sessions, cols["arrival_ns"], cols["prompt_tokens"],
                              cols["output_tokens"], cols["think_ns"], limits)
    assert got == want


@pytest.mark.usefixtures("jit_mode")  # (both engines)
def test_turns_after_a_turn_that_never_arrives_are_rejected_with_their_reason() -> None:
    # session y's first turn has a think time and nothing to follow, so it never arrives; the
    # turn after it cannot arrive either: both are rejects with their reasons, and the rest
    # of the replay runs (before, the second turn was never scheduled and the replay failed)
    from kernel.replay import replay
    from tests.replay_support import kernel_for, request_set

    rows = [{"request_id": "a", "arrival_ns": 0, "prompt_tokens": 50, "output_tokens": 3,
             "session_id": "x"},
            {"request_id": "b", "think_ns": 1000, "prompt_tokens": 50, "output_tokens": 3,
             "session_id": "y"},
            {"request_id": "c", "think_ns": 1000, "prompt_tokens": 50, "output_tokens": 3,
             "session_id": "y"},
            {"request_id": "d", "think_ns": 1000, "prompt_tokens": 50, "output_tokens": 3,
             "session_id": "x"}]
    res = replay(kernel_for(), request_set(rows))
    reasons = dict(zip(res.rejects.column("request_id").to_pylist(),
                       res.rejects.column("reason").to_pylist(), strict=True))
    assert reasons == {"b": "think_ns set but no earlier request of session 'y' to follow",
                       "c": "follows request 'b' of session 'y', which never arrives"}
    assert res.summary["finished"] == 2 and res.summary["rejected"] == 2
