"""``replay(k, requests)``: a request set through the vLLM scheduler, priced by the kernel.

The options, the engine limits read from the kernel, the request columns read from the
contract's REQUEST_SCHEMA, and the event loop's wiring; the scheduler is
:mod:`kernel.replay.engine`, the outputs :mod:`kernel.replay.results`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.load import open_inputs

from ..facade.factory import new
from ..facade.kernel import Kernel
from ..model.types import Placement
from . import jit_driver
from .engine import Core, EngineLimits, Group, RunState, Simulation
from .pricing import ESTIMATES, price_step, step_ns
from .results import build_result
from .router import ROUTERS, make_router
from .transfers import LinkShare

if TYPE_CHECKING:
    from ..facade.kernel import Kernel
    from .results import ReplayResult

__all__ = ["ReplayOptions", "engine_limits", "open_pools", "replay"]

log = logging.getLogger(__name__)  # no handler here: the CLI attaches one (CF5)


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay. Engine limits default to the kernel's resolved engine block."""

    # the step clock: "overlap" | "no_overlap" | "calibrated"; Overlap by default (decision MO3:
    # closer on measured vLLM serving, docs/accuracy.md)
    estimate: str = "overlap"
    router: str = "least_loaded"  # "round_robin" | "least_loaded"
    async_scheduling: bool = True  # vLLM v0.31 default (vllm/config/vllm.py)
    seed: int = 0  # nothing in the engine draws at random; kept for the contract and stamps
    max_steps: int | None = None  # a bound on engine steps; exceeding it is an error
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = 0  # vLLM default: 0 = off
    enable_prefix_caching: bool | None = None  # None: the deployment's setting (vLLM: on)
    num_blocks: int | None = None  # KV blocks per engine core (None: the kernel's capacity)
    dp: int | None = None  # engine cores (None: the deployment's data-parallel width)
    lockstep: bool | None = None  # DP ranks step together (None: when the model is MoE)
    keep_steps: bool = True  # False: no steps table (only what request latencies need)

    def __post_init__(self) -> None:
        if self.estimate not in ESTIMATES:
            raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, "
                             f"not {self.estimate!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {self.router!r}")
        for name in ("max_steps", "max_num_seqs", "max_num_batched_tokens", "num_blocks", "dp"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"ReplayOptions.{name} must be a positive integer or None, "
                                 f"got {v!r}")
        t = self.long_prefill_token_threshold
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"ReplayOptions.long_prefill_token_threshold must be an integer "
                             f">= 0 (0 = off), got {t!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Arrivals:
    """What either engine's clock needs of each request's arrival (made by :func:`replay`)."""

    arrival: np.ndarray  # its own arrival time, -1 when it follows its session
    think: np.ndarray  # after the previous turn of its session is done for the user
    follower: dict[int, int]  # request -> the next turn of its session
    rejected: np.ndarray  # it never runs (its turn ends when it arrives)
    admission_ns: np.ndarray  # host admission overhead before it can be scheduled
    done_ns: np.ndarray  # its last token's step end -> its session's next turn may start
    first_rows: Sequence[int]  # the requests arriving on their own, in row order


def engine_limits(k: Kernel, options: ReplayOptions) -> tuple[EngineLimits, int, bool]:
    """(per-core limits, engine cores, lockstep) from the kernel and the overrides.

    KV: the kernel's KV capacity in pages (``k.kv_capacity()``) less vLLM's null block; a
    request holds ceil(context / block tokens) pages for its tokens (block_size × DCP shards,
    ``k.limits.block_tokens``) plus the pages of what admission reserves whatever the length
    (``k.sequence_admission_bytes()``: window rings and recurrent state where the graph states
    them)."""
    r = k.resolved_pool
    cap = k.kv_capacity()
    lim = k.limits
    page = max(int(cap.page_bytes), 1)
    fixed = -(-int(k.sequence_admission_bytes()) // page)
    blocks = options.num_blocks if options.num_blocks is not None else int(cap.num_blocks) - 1
    if blocks <= 0:
        raise ValueError(f"scenario {r.scenario!r} pool {r.pool_index}: the KV cache holds no "
                         f"block ({cap.num_blocks} blocks of {cap.page_bytes} bytes in "
                         f"{cap.budget_bytes} bytes); nothing can be replayed")
    stated = k.deployment().engine.enable_prefix_caching
    caching = (options.enable_prefix_caching if options.enable_prefix_caching is not None
               else (True if stated is None else bool(stated)))
    limits = EngineLimits(
        max_num_seqs=options.max_num_seqs or int(r.max_num_seqs),
        max_num_batched_tokens=options.max_num_batched_tokens or int(r.max_num_batched_tokens),
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        block_size=int(lim.block_tokens), num_blocks=blocks, fixed_blocks=fixed,
        max_model_len=int(r.max_model_len), prefix_caching=caching,
        async_scheduling=options.async_scheduling)
    dp = options.dp or max(int(r.layout.dp), 1)
    lockstep = options.lockstep if options.lockstep is not None else r.total_experts > 0
    return limits, dp, bool(lockstep)


def _table(requests: Any) -> tuple[pa.Table, int | None]:
    if isinstance(requests, pa.Table):
        return requests, None
    table = getattr(requests, "table", None)
    if not isinstance(table, pa.Table):
        raise TypeError(f"requests must be a RequestSet (with .table and .hash_block_tokens) "
                        f"or a pyarrow Table in REQUEST_SCHEMA, got {type(requests).__name__}")
    return table, getattr(requests, "hash_block_tokens", None)


def _ints(table: pa.Table, name: str, default: int | None = None) -> np.ndarray:
    """An int64 column (nulls → -1), or the default everywhere when the column is absent."""
    if name not in table.column_names:
        if default is None:
            raise ValueError(f"requests: the column {name!r} is required (REQUEST_SCHEMA)")
        return np.full(table.num_rows, default, np.int64)
    col = table.column(name)
    if not (pa.types.is_integer(col.type) or pa.types.is_null(col.type)):
        raise ValueError(f"requests: column {name!r} must be an integer column, "
                         f"got {col.type}")
    return np.asarray(col.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)


def open_pools(scenario: str, repos: Any = None) -> list[Kernel]:
    """A kernel for every pool of the scenario's deployment, in pool order (what
    :func:`replay` takes for a disaggregated prefill/decode deployment)."""


    first = open_inputs(scenario, repos, 0)
    return [new(first), *(new(open_inputs(scenario, repos, i))
                          for i in range(1, len(first.deployment.pools)))]


def _kernels(k: Any) -> list[Kernel]:
    """One kernel (a colocated pool) or the [prefill, decode] kernels of a P/D deployment."""

    if isinstance(k, Kernel):
        return [k]
    ks = list(k)
    if len(ks) == 1 and isinstance(ks[0], Kernel):
        return ks
    roles = [str(getattr(x.resolved_pool, "role", "")) for x in ks]
    if len(ks) != 2 or roles != ["prefill", "decode"]:
        raise ValueError(f"replay takes one kernel, or the prefill and decode kernels of a "
                         f"disaggregated deployment in that order (open_pools); got pools "
                         f"with roles {roles}")
    return ks


def _placements(k: Kernel, node_offset: int) -> list[Placement]:
    """Where each engine core of a pool sits: its first GPU's node (and rack)."""
    lay = k.resolved_pool.layout
    per_core = max(lay.tp, 1) * max(lay.pp, 1) * max(lay.pcp, 1)
    gpn = max(lay.gpus_per_node, 1)
    out = []
    for i in range(max(lay.dp, 1)):
        gpu = i * per_core
        node = node_offset + gpu // gpn
        rack = (node * gpn) // lay.gpus_per_rack if lay.gpus_per_rack else 0
        out.append(Placement(node=node, rack=rack, pool=str(k.resolved_pool.role)))
    return out


def replay(k: Any, requests: Any, options: ReplayOptions | None = None, *,
           slo: dict[str, float] | None = None) -> ReplayResult:
    """Replay ``requests`` on the deployment ``k`` prices (docs/replay.md).

    ``k``: a :class:`kernel.Kernel` (one pool; its DP engine cores behind the router), or the
    [prefill, decode] kernels of a disaggregated deployment (:func:`open_pools`): each request
    is prefilled on the prefill pool (one token, as vLLM's disaggregated proxy asks), its
    prompt KV handed off (:mod:`kernel.replay.transfers`), then decoded on the decode pool."""

    options = options or ReplayOptions()
    kernels = _kernels(k)
    pd = len(kernels) == 2
    table, hash_tokens = _table(requests)
    n = table.num_rows
    pools = [engine_limits(kp, options) for kp in kernels]
    log.info("replay of %d requests, %s; limits per pool: %s", table.num_rows, options,
             [p[0] for p in pools])
    arrival = _ints(table, "arrival_ns")
    prompt = _ints(table, "prompt_tokens")
    output = _ints(table, "output_tokens")
    think = _ints(table, "think_ns", -1)
    ids = (table.column("request_id").to_pylist() if "request_id" in table.column_names
           else [str(i) for i in range(n)])
    hash_col = (table.column("prefix_hashes")
                if "prefix_hashes" in table.column_names and hash_tokens else None)
    reason, follower, first_rows = _arrivals(table, arrival, prompt, output, think,
                                             [p[0] for p in pools], pd)
    compiled = jit_driver.available()
    # the Python engine reads each request's chain as a list; the compiled one, the column
    hashes = hash_col.to_pylist() if hash_col is not None and not compiled else None
    if pd:  # the prefill pool samples one token; the decode pool gets the prompt's KV
        states = [RunState(prompt, np.ones(n, np.int64), hashes, hash_tokens),
                  RunState(prompt, output, hashes, hash_tokens)]
        states[1].remote[:] = prompt - 1
    else:
        states = [RunState(prompt, output, hashes, hash_tokens)]
    groups: list[Group] = []
    for pi, (kp, (limits, dp, lockstep)) in enumerate(zip(kernels, pools, strict=True)):
        cores = [Core(i, _pool_name(kp), limits, states[pi], pi) for i in range(dp)]
        groups.extend([Group(cores)] if lockstep else [Group([c]) for c in cores])
    estimate = options.estimate

    # the estimate's field read directly where it is one (decision EF3)
    ns_of: Callable[[Any], int] = (attrgetter(estimate) if estimate in ("overlap", "no_overlap")
                                   else partial(step_ns, estimate=estimate))
    if len(kernels) == 1:
        k0 = kernels[0]

        def price_ns(core: Core, s: np.ndarray, c: np.ndarray, p: np.ndarray) -> int:
            return ns_of(price_step(k0, s, c, p))
    else:
        def price_ns(core: Core, s: np.ndarray, c: np.ndarray, p: np.ndarray) -> int:
            return ns_of(price_step(kernels[core.pool_index], s, c, p))

    client = kernels[-1]  # the pool whose tokens reach the user
    otok = int(client.output_token_overhead())
    done_ns = int(client.completion_overhead())
    arrival_eff = arrival.copy()
    ready = np.full(n, -1, np.int64)
    handoff = np.full((n, 2), -1, np.int64)  # P/D: handoff start and end
    handoffs = _Handoffs(kernels, prompt, handoff) if pd else None
    rejected = np.array([r is not None for r in reason], bool)
    arrivals = Arrivals(arrival=arrival, think=think, follower=follower, rejected=rejected,
                        admission_ns=_admission_ns(kernels[0], prompt, rejected),
                        done_ns=output * otok + done_ns, first_rows=first_rows)
    if compiled:
        sim: Any = jit_driver.run(
            groups, states, price_ns, arrivals, router=options.router,
            max_steps=options.max_steps, keep_steps=options.keep_steps, hashes=hash_col,
            hash_tokens=hash_tokens, arrival_eff=arrival_eff, ready=ready, handoffs=handoffs)
    else:
        sim = _run_python(groups, price_ns, arrivals, options, arrival_eff, ready, handoffs)
    return build_result(kernels, options, table, ids, sim, states, arrival_eff, ready, reason,
                        otok=otok, completion_ns=done_ns, slo=slo,
                        lockstep=[p[2] for p in pools], handoff=handoff if pd else None)


def _admission_ns(k: Kernel, prompt: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    """Each request's host admission overhead (0 for a rejected one), once per prompt length."""
    out = np.zeros(prompt.size, np.int64)
    lengths, where = np.unique(prompt[~rejected], return_inverse=True)
    out[~rejected] = np.array([int(k.admission_overhead(int(p))) for p in lengths.tolist()],
                              np.int64)[where]
    return out


class _Handoffs:
    """P/D: each prefilled request's prompt KV handed to its decode core over shared links
    (:class:`~kernel.replay.transfers.LinkShare`); ``bind`` gives it the clock's entries."""

    def __init__(self, kernels: list[Kernel], prompt: np.ndarray, handoff: np.ndarray):
        self.kernels = kernels
        self.prompt = prompt
        self.handoff = handoff  # per request: handoff start and end
        node_offset = 0
        self.places = []
        for kp in kernels:
            self.places.append(_placements(kp, node_offset))
            node_offset += max(int(kp.deployment().nodes or 0), 1)
        self.links: LinkShare | None = None

    def bind(self, push_ready: Callable[[int, int], None],
             push_timer: Callable[[int, int], None]) -> None:
        """``push_ready(t, request)``: the request joins the decode pool at ``t``;
        ``push_timer(t, token)``: wake the links at ``t``."""
        def handed_off(i: int, t: int) -> None:
            self.handoff[i, 1] = t
            push_ready(t, i)

        self.links = LinkShare(push_timer, handed_off)

    def start(self, i: int, end_ns: int, src: int, dst: int) -> None:
        """Request ``i``'s prefill ended at ``end_ns`` on prefill core ``src``: its KV leaves
        for decode core ``dst``."""
        assert self.links is not None
        self.handoff[i, 0] = end_ns
        demand = self.kernels[0].pd_transfer_demand(int(self.prompt[i]), self.places[0][src],
                                                    self.places[1][dst])
        self.links.start(i, end_ns, demand)

    def wake(self, token: int, t: int) -> None:
        assert self.links is not None
        self.links.wake(token, t)


def _run_python(groups: list[Group], price_ns: Callable[..., int], arrivals: Arrivals,
                options: ReplayOptions, arrival_eff: np.ndarray, ready: np.ndarray,
                handoffs: _Handoffs | None) -> Simulation:
    """The replay on :class:`~kernel.replay.engine.Simulation` (numba missing, BLIS_JIT=0)."""
    pools = 1 + max(c.pool_index for g in groups for c in g.cores)
    sim = Simulation(groups, price_ns, [make_router(options.router) for _ in range(pools)],
                     max_steps=options.max_steps, keep_steps=options.keep_steps)
    follower, think = arrivals.follower, arrivals.think

    def arrive(i: int, t: int) -> None:
        arrival_eff[i] = t
        if arrivals.rejected[i]:
            finished_at(i, t)  # a rejected request ends its session turn at once
            return
        ready[i] = t + arrivals.admission_ns[i]
        sim.push_ready(int(ready[i]), i, 0)

    def finished_at(i: int, visible_ns: int) -> None:
        nxt = follower.get(i)
        if nxt is not None:
            arrive(nxt, visible_ns + int(think[nxt]))

    decode_router = make_router(options.router)
    pinned: dict[int, Core] = {}

    def on_finish(c: Core, i: int, end_ns: int) -> None:
        if handoffs is not None and c.pool_index == 0:  # prefill done: KV to a decode core
            dst = decode_router(sim.pool_cores[1], i)
            pinned[i] = dst
            handoffs.start(i, end_ns, c.index, dst.index)
            return
        finished_at(i, end_ns + int(arrivals.done_ns[i]))

    if handoffs is not None:  # the decode request goes to the core its KV was sent to
        handoffs.bind(lambda t, i: sim.push_ready(t, i, 1), sim.push_timer)
        routes = list(sim.routes)
        routes[1] = lambda cores, i: pinned.pop(i)
        sim.routes = routes
        sim.on_timer = handoffs.wake
    sim.on_finish = on_finish
    for i in arrivals.first_rows:
        arrive(i, int(arrivals.arrival[i]))
    sim.run()
    return sim


def _reject_reason(p: int, o: int, arrival: int, think: int, limits: list[EngineLimits],
                   pd: bool) -> str | None:
    if p <= 0 or o <= 0:
        return f"prompt_tokens ({p}) and output_tokens ({o}) must be > 0"
    for lim in limits:
        if lim.max_model_len and p + o > lim.max_model_len:
            return (f"prompt_tokens + output_tokens = {p + o} exceeds max_model_len "
                    f"{lim.max_model_len}")
        need = -(-(p + o) // lim.block_size) + lim.fixed_blocks
        if need > lim.num_blocks:
            return f"needs {need} KV blocks at its full length; an engine core has " \
                   f"{lim.num_blocks}"
    if arrival < 0 and think < 0:
        return "no arrival_ns and no think_ns: the request never arrives"
    return None


def _arrivals(table: pa.Table, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
              think: np.ndarray, limits: list[EngineLimits], pd: bool
              ) -> tuple[list[str | None], dict[int, int], list[int]]:
    """Each request's reject reason (None: it runs); closed loop: the request that follows
    each one in its session (a request with ``think_ns`` and no arrival follows the previous
    request of its session); the rows arriving on their own, in row order."""
    reason = _reject_reasons(prompt, output, arrival, think, limits, pd)
    prev = _previous_of_session(table)
    follows = np.flatnonzero((arrival < 0) & (think >= 0))
    led = prev[follows] >= 0
    follower = dict(zip(prev[follows[led]].tolist(), follows[led].tolist(), strict=True))
    def session(i: int) -> Any:
        return (table.column("session_id")[i].as_py() if "session_id" in table.column_names
                else None)

    for i in follows[~led].tolist():
        if reason[i] is None:
            reason[i] = f"think_ns set but no earlier request of session {session(i)!r} to follow"
    # (a row neither following nor arriving has a reason: it never arrives)
    heads = np.flatnonzero(arrival >= 0).tolist()
    # a request following one that never arrives (itself rejected so) never arrives either
    reached = np.zeros(arrival.size, bool)
    for i in heads:
        while i is not None and not reached[i]:
            reached[i] = True
            i = follower.get(i)
    for i in np.flatnonzero(~reached).tolist():
        if reason[i] is None:
            j = int(prev[i])
            rid = (table.column("request_id")[j].as_py() if "request_id" in table.column_names
                   else str(j))
            reason[i] = (f"follows request {rid!r} of session {session(i)!r}, which never "
                         f"arrives")
    return reason, follower, heads


def _reject_reasons(prompt: np.ndarray, output: np.ndarray, arrival: np.ndarray,
                    think: np.ndarray, limits: list[EngineLimits], pd: bool
                    ) -> list[str | None]:
    """:func:`_reject_reason` of every request, asked only of those a vectorised test
    cannot clear: both lengths positive, their sum within every core's model length and KV
    blocks (``ceil(x / B) + fixed <= blocks`` is ``x <= (blocks - fixed) * B``), and an
    arrival or a think time."""
    room = min(min((lim.num_blocks - lim.fixed_blocks) * lim.block_size,
                   lim.max_model_len or 1 << 62) for lim in limits)
    room = min(room, (1 << 62) - 1)  # (the sum below stays inside int64 where it is read)
    clear = ((prompt > 0) & (output > 0) & (prompt <= room) & (output <= room)
             & (prompt + output <= room) & ((arrival >= 0) | (think >= 0)))
    reason: list[str | None] = [None] * prompt.size
    for i in np.flatnonzero(~clear).tolist():
        reason[i] = _reject_reason(int(prompt[i]), int(output[i]), int(arrival[i]),
                                   int(think[i]), limits, pd)
    return reason


def _previous_of_session(table: pa.Table) -> np.ndarray:
    """Per row, the row before it with the same ``session_id`` (-1: none, or no session)."""
    if "session_id" not in table.column_names:
        return np.full(table.num_rows, -1, np.int64)
    codes = table.column("session_id").dictionary_encode().combine_chunks().indices
    code = np.asarray(codes.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    order = np.argsort(code, kind="stable")  # each session's rows together, in row order
    sorted_code = code[order]
    same = (sorted_code[1:] == sorted_code[:-1]) & (sorted_code[1:] >= 0)
    prev = np.full(table.num_rows, -1, np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _pool_name(k: Kernel) -> str:
    role = getattr(k.resolved_pool, "role", "") or ""
    return str(role) or "colocated"
