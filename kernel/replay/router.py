"""The DP router: which engine core a new request goes to.

``least_loaded`` follows vLLM's internal DP load balancer
(``vllm/v1/engine/core_client.py: DPLBAsyncMPClient.get_core_engine_for_request``): the score
of a core is waiting + running, plus waiting × 6 × max(0, KV usage − 0.5); the lowest score
wins and the scan starts at a rotating index, so ties go round robin. vLLM reads the counts
from coordinator snapshots taken at most every 100 ms; the replay reads them exactly when the
request is ready (a simplification, docs/model.md §15). ``round_robin`` cycles over the cores.
"""

from __future__ import annotations

from collections.abc import Callable

from .engine import Core

__all__ = ["ROUTERS", "make_router"]

ROUTERS = ("least_loaded", "round_robin")


def make_router(name: str) -> Callable[[list[Core], int], Core]:
    """A router: (cores, request index) → the core the request joins."""
    turn = [0]

    def round_robin(cores: list[Core], _request: int) -> Core:
        core = cores[turn[0] % len(cores)]
        turn[0] += 1
        return core

    def least_loaded(cores: list[Core], _request: int) -> Core:
        n = len(cores)
        if n == 1:
            return cores[0]
        start = turn[0] % n
        turn[0] += 1
        best, best_score = cores[start], None
        for j in range(n):
            c = cores[(start + j) % n]
            waiting = len(c.inbox) + len(c.waiting)
            score = c.load() + waiting * 6 * max(0.0, c.kv_usage() - 0.5)
            if best_score is None or score < best_score:
                best, best_score = c, score
        return best

    if name == "round_robin":
        return round_robin
    if name == "least_loaded":
        return least_loaded
    raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {name!r}")
