"""Fixed-seed replays whose outputs are pinned (tests/test_replay_pin.py).

Each case is a seeded request set, a scenario and replay options covering one engine path
(dense, MoE lockstep, sliding-window rings, P/D handoff, DP routers, prefix caching,
preemption under a small KV pool, sync scheduling, chunked prefill, no steps table). A case's
digest is a SHA-256 per output column (requests, steps, engine_steps, rejects) and of the
summary, so a change in behaviour names the column it touched.

The pinned digests, tests/data/replay_pin.json, were generated from main's replay before the
bookkeeping speed-up (issue 29), first at f75f2e3, then at c19e098 (whose MoE pricing changed
the MoE, sliding-window and P/D cases; its replay code is f75f2e3's), with this file copied
into a checkout of that commit:

    PYTHONPATH=. python -m tests.replay_pin > tests/data/replay_pin.json

Regenerated since, on purpose: `prefix_small_kv` when duplicate blocks of one hash became
cached as vLLM caches them (decision KD1); no other case moved.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from typing import Any

import numpy as np

from kernel.replay import ReplayOptions, replay
from tests.replay_support import kernel_for, request_set

DENSE = "llama-3.1-8b-h100-tp1"
MOE = "qwen3-30b-a3b-h100-tp2"
WINDOW = "gpt-oss-120b-h200-fp4-vllm-tp8"
PD = "deepseek-v3-h200-1p1d"


def _rows(seed: int, n: int, *, rate_ns: int, prompt: tuple[int, int], output: tuple[int, int],
          groups: int = 0, closed: int = 0) -> list[dict[str, Any]]:
    """``n`` seeded requests: open loop (exponential gaps of mean ``rate_ns``) or, with
    ``closed`` > 0, that many sessions whose later requests follow the previous one after a
    think time. ``groups`` > 0 gives prompts a shared prefix of one of that many groups."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(rate_ns, n).astype(np.int64)
    arrivals = np.cumsum(gaps)
    out = []
    for i in range(n):
        p = int(rng.integers(prompt[0], prompt[1] + 1))
        row: dict[str, Any] = {"request_id": f"q{i}", "prompt_tokens": p,
                               "output_tokens": int(rng.integers(output[0], output[1] + 1))}
        if closed:
            row["session_id"] = f"s{i % closed}"
            if i < closed:
                row["arrival_ns"] = int(arrivals[i])
            else:
                row["think_ns"] = int(rng.integers(0, 5_000_000))
        else:
            row["arrival_ns"] = int(arrivals[i])
        if groups:
            g = int(rng.integers(0, groups))
            shared = int(rng.integers(0, p // 16 + 1))
            row["prefix_hashes"] = ([1000 * g + j for j in range(shared)]
                                    + [10**6 + 1000 * i + j for j in range(p // 16 - shared)])
        out.append(row)
    return out


def cases() -> dict[str, tuple[str, list[dict[str, Any]], ReplayOptions, int | None]]:
    """name -> (scenario, rows, options, hash_block_tokens)."""
    open_ = _rows(1, 300, rate_ns=4_000_000, prompt=(20, 1500), output=(1, 120))
    open_[7]["output_tokens"] = 0  # rejected: the rejects table and a request's reason
    open_[150]["prompt_tokens"] = 10**7  # longer than max_model_len
    closed = _rows(2, 400, rate_ns=1_000_000, prompt=(50, 1200), output=(1, 80), closed=48)
    shared = _rows(3, 300, rate_ns=3_000_000, prompt=(16, 900), output=(1, 60), groups=4)
    return {
        "dense_open": (DENSE, open_, ReplayOptions(), None),
        "dense_closed": (DENSE, closed, ReplayOptions(), None),
        "dense_sync_chunked": (DENSE, open_, ReplayOptions(
            async_scheduling=False, long_prefill_token_threshold=256,
            max_num_batched_tokens=1024, estimate="no_overlap"), None),
        "moe_lockstep": (MOE, closed, ReplayOptions(dp=2), None),
        "window": (WINDOW, open_, ReplayOptions(), None),
        "dp_least_loaded": (DENSE, closed, ReplayOptions(dp=3, lockstep=False), None),
        "dp_round_robin": (DENSE, open_, ReplayOptions(dp=2, lockstep=False,
                                                       router="round_robin"), None),
        "prefix": (DENSE, shared, ReplayOptions(), 16),
        "prefix_small_kv": (DENSE, shared, ReplayOptions(num_blocks=140, max_num_seqs=24), 16),
        "preempt_small_kv": (DENSE, closed, ReplayOptions(num_blocks=120,
                                                          enable_prefix_caching=False), None),
        "preempt_small_kv_moe": (MOE, closed, ReplayOptions(num_blocks=160, dp=2), None),
        "lean": (DENSE, closed, ReplayOptions(keep_steps=False), None),
        "pd": (PD, _rows(4, 120, rate_ns=20_000_000, prompt=(100, 3000), output=(1, 40)),
               ReplayOptions(), None),
    }


@lru_cache(maxsize=2)
def _pools(scenario: str) -> Any:
    from kernel.replay import open_pools

    return open_pools(scenario)


def run_case(name: str) -> Any:
    scenario, rows, opts, hash_tokens = cases()[name]
    k = _pools(scenario) if scenario == PD else kernel_for(scenario)
    return replay(k, request_set(rows, hash_block_tokens=hash_tokens), opts,
                  slo={"ttft": 0.5, "itl": 0.05})


def _canon(v: Any) -> Any:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else float.hex(v)  # exact, bit for bit
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_canon(x) for x in v]
    return v


def _sha(v: Any) -> str:
    return hashlib.sha256(json.dumps(_canon(v), sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def digest(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tables = {"requests": res.requests, "steps": res.steps, "engine_steps": res.engine_steps,
              "rejects": res.rejects}
    for tname, table in tables.items():
        out[tname] = {"rows": table.num_rows,
                      "schema": _sha([f"{f.name}:{f.type}" for f in table.schema]),
                      **{c: _sha(table.column(c).to_pylist()) for c in table.column_names}}
    out["summary"] = {k: _sha(v) for k, v in res.summary.items()}
    return out


def main() -> None:
    print(json.dumps({name: digest(run_case(name)) for name in cases()}, indent=1,
                     sort_keys=True))


if __name__ == "__main__":
    main()
