"""The replay's scheduler: vLLM v0.31.0's V1 engine core, step by step (docs/model.md §15).

One :class:`Core` is one engine core (one DP rank): its waiting queue, running list and KV
block pool. A :class:`Group` is the cores that step together: one core for a dense model's DP
rank (ranks are independent), all DP ranks for an MoE model (their collectives make them step
in lockstep, a step lasting as long as the slowest rank). :class:`Simulation` runs every group
on one event clock: request arrivals (after the host's admission overhead) and step ends.

Per step, as ``vllm/v1/core/sched/scheduler.py: Scheduler.schedule`` does:

* Phase A walks ``running`` in order: each request gets the rest of its known tokens (1 for a
  decode) capped by ``long_prefill_token_threshold`` and the token budget; when its blocks do
  not fit, the newest running request is preempted (recompute: computed back to 0, to the
  front of ``waiting``, its cached blocks kept) until they do;
* Phase B, only when nothing was preempted, admits ``waiting`` in FCFS order while the token
  budget lasts and ``running`` < ``max_num_seqs``; the head must fit whole (prompt plus any
  tokens generated before a preemption, minus prefix hits: ``scheduler_reserve_full_isl``)
  or admission stops (head-of-line blocking);
* a request whose scheduled tokens reach its known length samples a token at the step's end.

Async scheduling (on by default, as vLLM v0.31): the schedule of step j runs while step j−1
executes, so it sees only requests that were ready when step j−1 started, and the blocks of
requests that finished in step j−1 come back only after it (those requests still count in
``running``). Everything else follows from the placeholders vLLM uses (a decode continues
without waiting for its sampled token), so token counts are the synchronous ones.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .block_keys import block_units
from .kv_units import Chain, KVUnits, Refs

__all__ = ["Core", "EngineLimits", "Group", "RunState", "Simulation"]

# Event kinds, in their order at one instant: arrivals, timers, then schedules (an idle
# group's first step and step ends), so a step sees every request ready at its instant.
READY, TIMER, KICK, STEP_END = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineLimits:
    """What one engine core may schedule (per DP rank, vllm/config/cache.py)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    block_size: int
    num_blocks: int
    fixed_blocks: int  # pages every request holds whatever its length (rings, state)
    max_model_len: int
    prefix_caching: bool
    async_scheduling: bool


class RunState:
    """Per-request state as numpy arrays (the step loop reads and writes them by fancy
    indexing over the running requests) plus the few per-request Python objects."""

    def __init__(self, prompt: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray,
                 hashes: Sequence[Sequence[int] | None] | None, hash_tokens: int | None):
        n = len(prompt)
        self.prompt = np.asarray(prompt, np.int64)
        self.output = np.asarray(output, np.int64)
        self.hashes = hashes
        self.hash_tokens = hash_tokens
        self.known = self.prompt.copy()  # prompt + tokens sampled so far (vLLM num_tokens)
        self.admitted = np.full(n, -1, np.int64)  # start of the request's first step
        self.target = self.prompt + self.output  # known when the request is done
        self.computed = np.zeros(n, np.int64)  # vLLM num_computed_tokens (after schedule)
        self.held = np.zeros(n, np.int64)  # KV blocks held
        self.registered = np.zeros(n, np.int64)  # leading blocks offered to the prefix cache
        self.n_shared = np.zeros(n, np.int64)  # blocks its hash chain names (once keys built)
        self.finished = np.zeros(n, bool)
        self.preemptions = np.zeros(n, np.int64)
        self.lost = np.zeros(n, np.int64)  # computed tokens thrown away by preemptions
        # tokens whose KV arrives from elsewhere at the first admission (a P/D handoff)
        self.remote = np.zeros(n, np.int64)
        self.cached_tokens = np.zeros(n, np.int64)  # prefix-hit tokens at the last admission
        self.core = np.full(n, -1, np.int64)
        self.refs: list[Refs | None] = [None] * n  # cached keys held, block order
        self.keys: list[Chain | None] = [None] * n  # its chain's units


class Core:
    """One engine core: waiting queue, running list and its KV blocks."""

    def __init__(self, index: int, pool: str, limits: EngineLimits, state: RunState,
                 pool_index: int = 0):
        self.index = index
        self.pool = pool
        self.pool_index = pool_index
        self.state = state
        self.limits = limits
        self.kv = KVUnits(limits.num_blocks, limits.block_size, limits.prefix_caching)
        self.inbox: deque[tuple[int, int]] = deque()  # (ready_ns, request) not yet polled
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.zombies: list[int] = []  # finished in the step before, freed after this schedule
        self.run_arr = np.zeros(0, np.int64)  # ``running`` as an array, rebuilt when dirty
        self.run_prompt = self.run_arr  # their prompt and target lengths, rebuilt with it
        self.run_target = self.run_arr
        self.dirty = False
        # Steady decode: the last step scheduled every request in ``run_arr`` whole (each
        # sampled a token) and ``run_arr`` is ``running`` without the requests that step
        # finished, so each now knows one token more than it has computed, holds exactly the
        # blocks its computed tokens fill and has offered every full one to the prefix cache.
        # ``next_computed``/``next_known`` are then their computed and known tokens, in
        # ``run_arr`` order (what the last step left). Admissions scheduled whole keep it;
        # other admissions, preemptions and sync finishes mark the core dirty, which ends it
        # until a step is whole again.
        self.steady = False
        self.next_computed = self.run_arr
        self.next_known = self.run_arr
        # While steady, ``run_arr`` may be followed in ``running`` by the *tail*: requests
        # not (yet) in steady decode (a prefill being chunked, one admitted behind it), which
        # Phase A handles one at a time, as scalars, after the steady part (decision RS3).
        # ``running`` is ``run_arr`` then ``tail`` (both with the step in flight's zombies).
        self.tail: list[int] = []
        # _step_steady's *wheel* (decision RS4): its requests by their known tokens mod B
        # when it was built (``run_arr`` order within a bucket; requests finished since are
        # skipped). Each steady step adds one token to every request, so the requests whose
        # known token completes a block this step are bucket ``wheel_at``, which moves back
        # one bucket a step, and the next step's block growers are the bucket after it: no
        # array pass over the running requests. Any schedule by _schedule forgets it.
        self.wheel: list[list[int]] | None = None
        self.wheel_at = 0
        # _step_steady's last step: its requests and the fewest tokens any of them still
        # lacked after it (any other step forgets them: _schedule)
        self.done_ra: np.ndarray | None = None
        self.done_in = 0
        # (ones, zeros, trues) of the last fast step's size
        self.consts: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        # the waiting head last found blocked (_phase_b) and the free blocks it needed then
        # (a lower bound), -1 once something could have lowered that need: an admission
        # (touch), a preemption or the registration of a key of its chain (its hit's held
        # blocks grew). While free blocks stay below it, _schedule knows it is still blocked
        # without a lookup (decision EF4). ``blocked_keys``: its chain's unit keys
        # (``blocked_set`` the same, built when a registration first checks them).
        self.blocked_head = -1
        self.blocked_need = 0
        self.blocked_ev = -1  # kv.evictions then, when duplicates were cached (else -1)
        self.blocked_keys: list[int] = []
        self.blocked_set: set[int] | None = None

    def load(self) -> int:
        """waiting + running (the DP load balancer's count), inbox included."""
        return len(self.inbox) + len(self.waiting) + len(self.running) - len(self.zombies)

    def kv_usage(self) -> float:
        return self.kv.used() / self.kv.num_blocks


class Group:
    """Cores stepping together on one clock."""

    def __init__(self, cores: list[Core]):
        self.cores = cores
        self.busy = False
        self.start = 0  # start of the step in flight


class Rows:
    """The steps table, kept as each step's own arrays (joined only when the table is read: no
    copy per step), one engine-step record per batch, and the tokens the user receives: per
    batch of the client pool, the requests that sampled a token and how many tokens each knew
    before it (its prompt plus that token's ordinal), which is all the request latencies need.

    ``keep_steps=False`` keeps only the tokens and the engine steps (a 1M-request replay
    without its steps table)."""

    NAMES = ("batch_id", "request", "scheduled", "computed", "prompt_len", "cached_tokens",
             "emitted", "pool")
    PER_ROW = ("request", "scheduled", "computed", "prompt_len", "cached_tokens", "emitted")
    STEP_NAMES = ("batch_id", "pool", "engine", "group_step", "start", "end", "batch_ns",
                  "step_ns", "requests", "tokens", "running", "waiting", "kv_used",
                  "kv_blocks")

    def __init__(self, keep_steps: bool = True, client_pool: int = 0) -> None:
        self.keep = keep_steps
        self.client_pool = client_pool
        self.parts: list[tuple[np.ndarray, ...]] = []  # per batch: its PER_ROW columns
        self.batch: list[int] = []  # per part: batch id, pool, rows
        self.pool: list[int] = []
        self.count: list[int] = []
        # the client pool's sampled tokens, per batch: requests, their known tokens before
        self.tok_req: list[np.ndarray] = []
        self.tok_known: list[np.ndarray] = []
        self.tok_batch: list[int] = []
        self.tok_count: list[int] = []
        self.step_buf = array("q")
        self._cols: dict[str, np.ndarray] | None = None

    def add(self, b: int, rq: np.ndarray, sc: np.ndarray, cp: np.ndarray, pl: np.ndarray,
            ch: np.ndarray, emitted: np.ndarray, pool: int, who: np.ndarray,
            who_known: np.ndarray) -> None:
        """One batch's rows and its sampled tokens (``who``, ``who_known``). The arrays are
        kept as they are: the engine never writes into an array after handing it here."""
        if self.keep:
            self.parts.append((rq, sc, cp, pl, ch, emitted))
            self.batch.append(b)
            self.pool.append(pool)
            self.count.append(rq.size)
            self._cols = None
        if pool == self.client_pool and who.size:
            self.tok_req.append(who)
            self.tok_known.append(who_known)
            self.tok_batch.append(b)
            self.tok_count.append(who.size)

    def tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request, known tokens before it, batch) of every token the user receives, in the
        order they were sampled."""
        if not self.tok_req:
            z = np.zeros(0, np.int64)
            return z, z, z
        return (np.concatenate(self.tok_req), np.concatenate(self.tok_known),
                np.repeat(np.asarray(self.tok_batch, np.int64),
                          np.asarray(self.tok_count, np.int64)))

    @property
    def cols(self) -> dict[str, np.ndarray]:
        """The steps table's per-row columns (``keep_steps`` only)."""
        if self._cols is None:
            counts = np.asarray(self.count, np.int64)
            out = {"batch_id": np.repeat(np.asarray(self.batch, np.int64), counts)}
            for i, name in enumerate(self.PER_ROW):
                out[name] = (np.concatenate([p[i] for p in self.parts]) if self.parts else
                             np.zeros(0, bool if name == "emitted" else np.int64))
            out["pool"] = np.repeat(np.asarray(self.pool, np.int64), counts)
            self._cols = out
        return self._cols

    @property
    def steps(self) -> dict[str, np.ndarray]:
        a = np.frombuffer(self.step_buf, np.int64) if len(self.step_buf) else np.zeros(0, np.int64)
        a = a.reshape(-1, len(self.STEP_NAMES))
        return {name: a[:, i] for i, name in enumerate(self.STEP_NAMES)}


# (requests, scheduled, computed before, prompt_len, cached tokens, computed after, known)
Plan = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
             np.ndarray]
# a step's rows after its steady part, as scalars: (requests, tokens, computed and known
# tokens before, prefix-hit tokens)
Extra = tuple[list[int], list[int], list[int], list[int], list[int]]
_EMPTY = np.zeros(0, np.int64)
_NO_REFS: Refs = ([], [])  # never written (release only reads)
_NO_CHAIN: Chain = ([], [], [])
_CONST: dict[tuple[int, int], np.ndarray] = {}
_min = np.minimum.reduce  # (ndarray.min and .sum go through a Python-level wrapper)
_sum = np.add.reduce
_max = np.maximum.reduce
_all = np.logical_and.reduce


def _const(n: int, value: int) -> np.ndarray:
    """A read-only array of ``n`` times ``value`` (0 or 1 as int64, 2 for True as bool),
    shared: the steps table keeps each step's arrays, and these are never written."""
    a = _CONST.get((n, value))
    if a is None:
        a = np.ones(n, bool) if value == 2 else np.full(n, value, np.int64)
        a.flags.writeable = False
        _CONST[(n, value)] = a
    return a


class Simulation:
    """Every group on one event clock; :meth:`run` until every request is done."""

    def __init__(self, groups: list[Group],
                 price_ns: Callable[[Core, np.ndarray, np.ndarray, np.ndarray], int],
                 routes: Sequence[Callable[[list[Core], int], Core]], *,
                 max_steps: int | None = None, keep_steps: bool = True):
        self.groups = groups
        self.cores = [c for g in groups for c in g.cores]
        npools = len(routes)
        self.pool_cores = [[c for c in self.cores if c.pool_index == i] for i in range(npools)]
        self.group_of = {id(c): g for g in groups for c in g.cores}
        self.price_ns = price_ns
        self.routes = routes
        self.max_steps = max_steps
        self.rows = Rows(keep_steps, npools - 1)
        self.events: list[tuple[int, int, int, int]] = []
        # the earliest step end pushed and not yet in ``events`` (decision RS7): a lone
        # group's next event is usually its own step end, which then costs one comparison
        # with the heap's top instead of a push and a pop through every pending arrival
        self.pending: tuple[int, int, int, int] | None = None
        self.seq = 0
        self.batches = 0
        self.group_steps = 0
        # called with (core, request, end of the step that sampled its last token)
        self.on_finish: Callable[[Core, int, int], None] | None = None
        # called with (timer token, time) for timers pushed by push_timer
        self.on_timer: Callable[[int, int], None] | None = None

    # -- events --------------------------------------------------------------------------
    def push_ready(self, ready_ns: int, request: int, pool: int = 0) -> None:
        """``request`` joins pool ``pool`` (its router picks the core) at ``ready_ns``."""
        self.seq += 1
        heapq.heappush(self.events, (ready_ns, READY, self.seq,
                                     request * len(self.routes) + pool))

    def push_timer(self, at_ns: int, token: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_ns, TIMER, self.seq, token))

    def _push_end(self, end_ns: int, gi: int) -> None:
        self.seq += 1
        event = (end_ns, STEP_END, self.seq, gi)
        if self.pending is None:
            self.pending = event
        else:
            heapq.heappush(self.events, event)

    def _count_step(self) -> None:
        """One more engine step (any group), refused past ``max_steps``."""
        self.group_steps += 1
        if self.max_steps is not None and self.group_steps > self.max_steps:
            raise RuntimeError(f"the replay exceeded max_steps={self.max_steps} engine steps "
                               f"(raise ReplayOptions.max_steps or check the load)")

    def _running(self, g: Group, gi: int, now: int, end: int) -> None:
        """The group's step runs from ``now`` to ``end``: busy until its end event."""
        g.busy = True
        g.start = now
        self._push_end(end, gi)

    def _finished(self, c: Core, done: np.ndarray, end: int) -> None:
        """Requests that sampled their last token at ``end`` leave (async: as zombies, after
        the next schedule), their blocks released."""
        s = c.state
        s.finished[done] = True
        if c.limits.async_scheduling:
            c.zombies.extend(done.tolist())
        else:
            for r in done.tolist():
                c.running.remove(r)
                self._release(c, r)
                s.keys[r] = None
            c.dirty = True
        if self.on_finish is not None:
            for r in done.tolist():
                self.on_finish(c, r, end)

    def run(self) -> None:
        events = self.events
        groups = self.groups
        gindex = {id(g): i for i, g in enumerate(groups)}
        is_async = [g.cores[0].limits.async_scheduling for g in groups]
        pop = heapq.heappop
        step = self._step
        while events or self.pending is not None:
            p = self.pending  # the smaller of it and the heap's top: the heap's order
            if p is not None and (not events or p < events[0]):
                self.pending = None
                t, kind, _seq, x = p
            else:
                t, kind, _seq, x = pop(events)
            if kind == STEP_END:  # the common event first
                g = groups[x]
                step(g, x, t, g.start if is_async[x] else t)
            elif kind == READY:
                r, pool = divmod(x, len(self.routes))
                core = self.routes[pool](self.pool_cores[pool], r)
                core.state.core[r] = core.index
                core.inbox.append((t, r))
                g = self.group_of[id(core)]
                if not g.busy:  # an idle group steps once everything at this instant is in
                    g.busy = True
                    self.seq += 1
                    heapq.heappush(events, (t, KICK, self.seq, gindex[id(g)]))
            elif kind == TIMER:
                if self.on_timer is not None:
                    self.on_timer(x, t)
            else:  # KICK
                step(groups[x], x, t, t)

    # -- one group step ------------------------------------------------------------------
    def _step(self, g: Group, gi: int, now: int, sched_time: int) -> None:
        """Schedule and launch the group's next step at ``now`` (the previous step's end, or
        an arrival at an idle group); ``sched_time`` is when its schedule ran (async: the
        previous step's start)."""
        cores = g.cores
        if len(cores) == 1:  # one core (a dense model's DP rank): the common case, lean
            c = cores[0]
            if c.steady and not c.dirty and self._step_steady(g, gi, now, sched_time, c):
                return
            plan = self._schedule(c, sched_time, now)
            if plan[0].size:
                if c.zombies:
                    self._drop_zombies(c)
                self._launch_one(g, gi, now, c, plan, self.price_ns(c, plan[1], plan[2],
                                                                    plan[3]))
                return
            plans = [plan]
        else:
            plans = [self._schedule(c, sched_time, now) for c in cores]
        if all(not p[0].size for p in plans):
            # Nothing to run with what the early schedule saw: the engine loop polls again
            # after the step in flight ends, with the finished requests gone.
            for c in g.cores:
                self._drop_zombies(c)
            plans = [self._schedule(c, now, now) for c in g.cores]
            if all(not p[0].size for p in plans):
                # A step whose only request preempted itself: schedule once more.
                plans = [self._schedule(c, now, now) for c in g.cores]
        for c in g.cores:
            self._drop_zombies(c)
        if all(not p[0].size for p in plans):
            g.busy = False
            if any(c.waiting for c in g.cores):
                raise AssertionError("an idle engine core with waiting requests")
            return
        prices = [self.price_ns(c, p[1], p[2], p[3]) if p[0].size else 0
                  for c, p in zip(g.cores, plans, strict=True)]
        self._launch(g, gi, now, plans, prices, max(prices))

    def _step_steady(self, g: Group, gi: int, now: int, sched_time: int, c: Core) -> bool:
        """The most common step, in one piece (decisions EF5, RS4): a lone core in steady
        decode (see :attr:`Core.steady`): its steady part one token each, its tail (if any)
        and the admissions Phase B makes one request at a time, as scalars; requests
        finished in the step in flight (async) schedule nothing and leave after the
        schedule. Does what :meth:`_schedule` (its steady branch and :meth:`_steady_plan`),
        :meth:`_drop_zombies`, :meth:`_launch_one` and :meth:`_finish_step` do for it,
        without their calls and array passes; returns False when the step is not such a one
        (the steady part does not fit the budget, the tail's schedule is not this path's,
        the blocks do not fit), having changed nothing but the arrivals' move to
        ``waiting`` (the general path then runs, and does that first)."""
        L = c.limits
        inbox, waiting = c.inbox, c.waiting
        while inbox and inbox[0][0] <= sched_time:  # (what _schedule does first, too)
            waiting.append(inbox.popleft()[1])
        ra = c.run_arr
        cr, kn = c.next_computed, c.next_known
        s = c.state
        finished = s.finished
        zombies = c.zombies
        if zombies:
            keep = ~finished[ra]
            ra, cr, kn = ra[keep], cr[keep], kn[keep]
        nk = ra.size
        budget = L.max_num_batched_tokens - nk
        if not nk or budget < 0:
            return False
        kv = c.kv
        B = L.block_size
        wheel = c.wheel
        if wheel is None:
            wheel = c.wheel = self._wheel(ra, kn, B)
            c.wheel_at = 0
        at = c.wheel_at
        # A request needs a block when its computed tokens fill their last one: those whose
        # known token completed a block in the step before (the bucket after this step's)
        grow = [r for r in wheel[at + 1 if at + 1 < B else 0] if not finished[r]]
        blocks = len(grow)
        x: Extra | None = None  # the rows after the steady part
        needs: list[int] = []  # the tail's blocks
        if c.tail:  # the tail's requests, one at a time (see Core.tail)
            tail = self._tail_schedule(c, budget)
            if tail is None:
                return False
            x = (tail[0], tail[1], tail[2], tail[3], [0] * len(tail[0]))
            needs, budget = tail[4], tail[5]
            blocks += sum(needs)
        if blocks > kv.free:
            return False
        # -- the schedule: one token each, a block where one fills; the tail's blocks
        held = s.held
        if blocks:
            kv.allocate(blocks)
            for r in grow:
                held[r] += 1
            if x is not None:
                for r, need in zip(x[0], needs, strict=True):
                    held[r] += need
        # Phase B as _schedule runs it (after Phase A's blocks, before this step's offers)
        if (waiting and budget > 0 and len(c.running) < L.max_num_seqs
                and not self._head_blocked(c)):
            admitted = self._phase_b(c, budget, now)
            if admitted[0].size:
                x = self._with_admitted(c, x, admitted)
                c.dirty = False  # (``running`` is the steady part, the tail, then these)
        s.computed[ra] = kn
        if x is not None:
            computed = s.computed
            for r, n, cp in zip(x[0], x[1], x[2], strict=True):
                computed[r] = cp + n
        if zombies:  # ``running`` is ``ra`` (and the tail) once they leave
            c.run_arr, c.run_prompt, c.run_target = ra, s.prompt[ra], s.target[ra]
        # the requests whose known token completes a block (computed mod B was B - 1): the
        # blocks vLLM offers to the prefix cache now (finished ones leave their bucket)
        fills = wheel[at]
        if fills:
            fills = wheel[at] = [r for r in fills if not finished[r]]
            if fills and L.prefix_caching:
                known = s.known.item  # (this step's known tokens: updated below)
                self._offer_blocks(c, fills, [known(r) // B for r in fills])
        if x is not None and L.prefix_caching:  # (after the steady part's, in batch order)
            self._offer_blocks(c, x[0], [(cp + n) // B for n, cp in zip(x[1], x[2],
                                                                       strict=True)])
        c.wheel_at = at - 1 if at else B - 1
        if zombies:
            self._drop_zombies(c)
        # -- price and launch
        consts = c.consts
        if consts[0].size != nk:
            consts = c.consts = (_const(nk, 1), _const(nk, 0), _const(nk, 2))
        one, zero, true = consts
        rq, sc, cp_, pl, ch = ra, one, cr, c.run_prompt, zero
        if x is not None and x[0]:  # the tail's rows after the steady part's
            rq = np.concatenate((ra, x[0]))
            sc = np.concatenate((one, x[1]))
            cp_ = np.concatenate((cr, x[2]))
            pl = np.concatenate((pl, s.prompt[x[0]]))
            ch = np.concatenate((zero, x[4])) if any(x[4]) else _const(rq.size, 0)
        step = self.price_ns(c, sc, cp_, pl)
        end = now + step
        self._count_step()
        b = self._log_step(c, now, end, step, step, rq.size,
                           nk if x is None else nk + sum(x[1]))
        rows = self.rows
        # -- every request samples a token; the ones reaching their target finish
        grown = kn + 1
        s.known[ra] = grown
        c.next_computed, c.next_known = kn, grown
        # tokens each request still lacks fall by one a step: while the fewest (``done_in``,
        # for ``done_ra``, the last fast step's requests) stays above 0, nobody finishes
        left = c.done_in - 1 if c.done_ra is ra else -1
        if left > 0:
            c.done_in = left
            done = _EMPTY
        else:
            rest = c.run_target - grown
            left = int(_min(rest))
            c.done_in, c.done_ra = left, ra
            done = ra[rest == 0] if left == 0 else _EMPTY
        if x is None or not x[0]:
            if x is not None:
                c.tail = []  # (its requests all finished in the step in flight)
            rows.add(b, ra, one, cr, pl, zero, true, c.pool_index, ra, kn)
        else:
            emitted, who, who_known, done = self._tail_sampled(c, x, rq, pl, kn, true, done)
            rows.add(b, rq, sc, cp_, pl, ch, emitted, c.pool_index, who, who_known)
        if done.size:
            self._finished(c, done, end)
        self._running(g, gi, now, end)
        return True

    def _head_blocked(self, c: Core) -> bool:
        """The waiting head is known to be still blocked, without a lookup (decision EF4):
        found blocked before (_phase_b), needing ``blocked_need`` blocks (its blocks less its
        held hits), and since then no admission (touch) and no registration of a key of its
        chain: releases and evictions only leave its hits unheld or cut them (but for an
        evicted first block whose held duplicate takes its place, KD1: one block less each),
        so it needs at least that many still, and they do not fit. (A request with a segment
        is looked up again: a lookup may make it explicit, KF1.)"""
        kv = c.kv
        head = c.waiting[0]
        return c.blocked_head == head and head not in kv.segment and (
            c.blocked_need > kv.free if c.blocked_ev < 0 else
            c.blocked_need - (kv.evictions - c.blocked_ev) > kv.free)

    @staticmethod
    def _with_admitted(c: Core, x: Extra | None,
                       admitted: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Extra:
        """The rows after the steady part (see _step_steady) with Phase B's admissions after
        the tail's: their computed tokens (their hits) and known tokens as _phase_b left."""
        s = c.state
        computed, known = s.computed, s.known
        ar, asc, ach = admitted[0].tolist(), admitted[1].tolist(), admitted[2].tolist()
        cps, kns = [computed.item(r) for r in ar], [known.item(r) for r in ar]
        if x is None:
            return ar, asc, cps, kns, ach
        return x[0] + ar, x[1] + asc, x[2] + cps, x[3] + kns, x[4] + ach

    def _tail_sampled(self, c: Core, x: Extra, rq: np.ndarray, pl: np.ndarray,
                      kn: np.ndarray, true: np.ndarray, done: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """_step_steady's end for the rows after the steady part, ``x`` (requests, tokens,
        computed and known tokens before): those scheduled whole sample a token too (after
        the steady part's, whose known tokens were ``kn``; ``true`` its emitted flags;
        ``done`` those of it finishing). The leading ones that sampled join the steady part
        (each is now in steady decode, as _settle has it); the rest are the tail. ``rq`` and
        ``pl``: the step's requests and prompt lengths. Returns the rows' emitted flags, the
        requests that sampled, their known tokens before, and those finishing, in batch
        order."""
        s = c.state
        known, target = s.known, s.target
        xr, xk = x[0], x[3]
        got = [cp + n == k for n, cp, k in zip(x[1], x[2], xk, strict=True)]
        who = [r for r, g in zip(xr, got, strict=True) if g]
        who_known = [k for k, g in zip(xk, got, strict=True) if g]
        emitted = np.concatenate((true, got))
        if not who:
            c.tail = xr
            return emitted, rq[:kn.size], kn, done
        for r, k in zip(who, who_known, strict=True):
            known[r] = k + 1
        ends = [r for r, k in zip(who, who_known, strict=True) if k + 1 == target[r]]
        if ends:
            done = np.concatenate((done, ends)) if done.size else np.array(ends, np.int64)
        who_arr = np.concatenate((rq[:kn.size], who))
        wk = np.concatenate((kn, who_known))
        j = got.index(False) if False in got else len(got)  # the leading ones sampled
        c.tail = xr[j:]
        if j:  # they join the steady part: its arrays are the step's leading rows
            m = kn.size + j
            c.run_arr, c.run_prompt, c.run_target = rq[:m], pl[:m], target[rq[:m]]
            c.next_computed, c.next_known = wk[:m], wk[:m] + 1
            B = c.limits.block_size
            at, wheel = c.wheel_at, c.wheel
            if wheel is not None:  # each in the bucket of its next known tokens (Core.wheel)
                for r, k in zip(xr[:j], xk[:j], strict=True):
                    wheel[(k + 1 + at) % B].append(r)
        return emitted, who_arr, wk, done

    @staticmethod
    def _wheel(ra: np.ndarray, kn: np.ndarray, B: int) -> list[list[int]]:
        """:attr:`Core.wheel` built from the steady requests ``ra`` and their known tokens."""
        wheel: list[list[int]] = [[] for _ in range(B)]
        for r, k in zip(ra.tolist(), (kn & (B - 1) if B & (B - 1) == 0 else kn % B).tolist(),
                        strict=True):
            wheel[k].append(r)
        return wheel

    def _launch(self, g: Group, gi: int, now: int, plans: list[Plan], prices: list[int],
                step: int) -> None:
        """The group's step runs from ``now`` for ``step`` ns: record it, sample its tokens."""
        end = now + step
        self._count_step()
        for c, plan, price in zip(g.cores, plans, prices, strict=True):
            if plan[0].size:
                self._record(c, now, end, price, step, plan)
        self._running(g, gi, now, end)

    def _launch_one(self, g: Group, gi: int, now: int, c: Core, plan: Plan, step: int
                    ) -> None:
        """:meth:`_launch` for a group of one core with a non-empty plan (the common step),
        without its per-core lists."""
        end = now + step
        self._count_step()
        self._record(c, now, end, step, step, plan)
        self._running(g, gi, now, end)

    def _record(self, c: Core, now: int, end: int, price: int, step: int, plan: Plan
                ) -> None:
        """One core's batch of the group's step (``price`` its own time, ``step`` the
        group's): its engine-step record, its rows and the tokens it samples."""
        rq, sc, cp, pl, ch, after, kn = plan
        n = rq.size
        b = self._log_step(c, now, end, price, step, n,
                           n if sc is _CONST.get((n, 1)) else int(_sum(sc)))  # steady: 1 each
        emitted, who, who_known = self._finish_step(c, rq, after, kn, end)
        self.rows.add(b, rq, sc, cp, pl, ch, emitted, c.pool_index, who, who_known)

    def _log_step(self, c: Core, now: int, end: int, price: int, step: int, n: int,
                  tokens: int) -> int:
        """The engine-step record of one core's batch of ``n`` requests and ``tokens``
        tokens (Rows.STEP_NAMES), with the occupancy while the step runs, before its
        finished requests leave; returns its batch id."""
        b = self.batches
        self.batches += 1
        kv = c.kv
        self.rows.step_buf.extend((
            b, c.pool_index, c.index, self.group_steps, now, end, price, step, n, tokens,
            len(c.running), len(c.waiting) + len(c.inbox), kv.num_blocks - kv.free,
            kv.num_blocks))
        return b

    def _drop_zombies(self, c: Core) -> None:
        if not c.zombies:
            return
        for r in c.zombies:
            c.running.remove(r)
            self._release(c, r)
            c.state.keys[r] = None
        c.zombies.clear()
        if not c.steady:  # steady: the schedule already set run_arr to what is left
            c.dirty = True

    def _release(self, c: Core, r: int) -> None:
        s = c.state
        c.kv.release_units(int(s.held[r]), s.refs[r] or _NO_REFS, r)
        s.held[r] = 0
        s.refs[r] = None
        s.registered[r] = 0

    def _finish_step(self, c: Core, rq: np.ndarray, after: np.ndarray, known: np.ndarray,
                     end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens sampled at the step's end (a request whose scheduled tokens reached all it
        knew): (emitted per row, the requests that sampled, their known tokens before it);
        finished requests leave (async: after the next schedule)."""
        s = c.state
        if after is known:  # every request got all it knew: each samples a token
            emitted = _const(rq.size, 2)
            who = rq
            who_known = known
            grown = known + 1
            s.known[who] = grown
            done = who[grown == (c.run_target if rq is c.run_arr else s.target[who])]
        else:
            emitted = after == known
            who = rq[emitted]
            if not who.size:
                if c.steady:  # (no steady row: the step was its tail alone)
                    c.next_computed = c.next_known = _EMPTY
                return emitted, who, who
            who_known = known[emitted]
            grown = who_known + 1
            s.known[who] = grown
            done = who[grown == s.target[who]]
        if c.steady:  # the steady part (leading rows) sampled: computed = its known before,
            m = c.run_arr.size  # known one more
            if m == rq.size:
                c.next_computed, c.next_known = known, grown
            else:  # (a tail follows: every steady row sampled, so ``who`` starts with them)
                c.next_computed, c.next_known = known[:m], grown[:m]
        if done.size:
            self._finished(c, done, end)
        return emitted, who, who_known

    # -- the scheduler -------------------------------------------------------------------
    @staticmethod
    def _keys(c: Core, r: int) -> Chain:
        s = c.state
        keys = s.keys[r]
        if keys is None:
            B = c.limits.block_size
            n = -(-int(s.target[r]) // B)
            h = s.hashes[r] if s.hashes is not None else None
            keys = block_units(h, s.hash_tokens, B, n)
            s.keys[r] = keys
            s.n_shared[r] = keys[2][-1] if keys[2] else 0
        return keys

    def _preempt(self, c: Core, r: int) -> None:
        """vLLM ``Scheduler._preempt_request``: recompute from scratch, front of waiting."""
        s = c.state
        c.running.remove(r)
        c.dirty = True
        c.blocked_head = -1  # (the head changes too)
        self._release(c, r)
        s.lost[r] += s.computed[r]
        s.computed[r] = 0
        s.preemptions[r] += 1
        c.waiting.appendleft(r)

    def _schedule(self, c: Core, sched_time: int, start: int) -> Plan:
        """One engine core's schedule, made at ``sched_time`` for a step starting at
        ``start``: (requests, scheduled, computed before, prompt_len, cached tokens, computed
        after, known tokens) in batch order. Applies the schedule (computed, blocks)."""
        s = c.state
        L = c.limits
        B = L.block_size
        F = L.fixed_blocks
        thr = L.long_prefill_token_threshold
        kv = c.kv
        c.done_ra = None  # this step's tokens are not _step_steady's count
        c.wheel = None  # nor its requests
        inbox, waiting, running = c.inbox, c.waiting, c.running
        while inbox and inbox[0][0] <= sched_time:
            waiting.append(inbox.popleft()[1])
        budget = L.max_num_batched_tokens
        preempted = False
        # (requests, tokens, prefix-hit tokens or None for none)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        # Phase A, vectorised: running requests in order, each the rest of its known tokens
        # capped by the threshold and what the budget has left after the ones before it.
        fast = None  # Phase A alone, every running request scheduled: (cr, kn)
        # Steady decode (see Core.steady): the part Phase A scheduled (every running request
        # but those finished in the step in flight, in order); steady_rem: its computed tokens
        # mod B
        steady_part = None
        everyone = False  # Phase A scheduled every running request, in order
        a = None
        if c.steady and not c.dirty and running:
            a = self._phase_a_steady(c, budget)
            if a is not None:
                steady_part, steady_cr, steady_kn, steady_rem, tail_part, budget = a
                parts.append((steady_part, _const(steady_part.size, 1), None))
                if tail_part is not None:
                    parts.append(tail_part)
                else:
                    fast = (steady_cr, steady_kn, True)
                everyone = True
            elif c.tail:  # ``run_arr`` is not all of ``running``: the general path rebuilds
                c.dirty = True
        c.steady = False
        if running and steady_part is None:
            if c.dirty:
                c.run_arr = ra = np.array(running, np.int64)
                c.run_prompt = s.prompt[ra]
                c.run_target = s.target[ra]
                c.dirty = False
            ra = c.run_arr
            cr = s.computed[ra]
            kn = s.known[ra]
            want = kn - cr
            partial = bool(c.zombies)
            if partial:
                want[s.finished[ra]] = 0  # finished in the step in flight (async)
            whole = not partial  # every running request gets all it knows (so samples)
            if thr and int(_max(want)) > thr:
                np.minimum(want, thr, out=want)
                whole = False
            asked = int(_sum(want))
            if asked <= budget:
                n = want
            else:
                # the budget runs out: the requests past it get nothing and are not in the
                # batch (vLLM's running loop stops at a zero budget; decision RS8)
                partial, whole = True, False
                n = np.minimum(np.maximum(budget - (np.cumsum(want) - want), 0), want)
            # blocks for computed + scheduled tokens (kn when whole), >= 0 where n > 0
            need = ((kn if whole else cr + n) + (B - 1)) // B + (F - s.held[ra])
            if partial:
                need[n == 0] = 0
            total = int(_sum(need))
            if total <= kv.free:
                if total:
                    kv.allocate(total)
                    s.held[ra] += need
                if partial:
                    take = n > 0
                    parts.append((ra[take], n[take], None))
                else:
                    parts.append((ra, n, None))
                    fast = (cr, kn, whole)
                everyone = asked <= budget or bool(_all(n))
                budget -= min(asked, budget)
            else:  # some request cannot grow: the scalar loop with preemption from there
                cum = np.cumsum(need)
                first = int(np.searchsorted(cum, kv.free, side="right"))
                fit = need[:first]
                if first:
                    kv.allocate(int(fit.sum()))
                    s.held[ra[:first]] += fit
                    take = n[:first] > 0
                    parts.append((ra[:first][take], n[:first][take], None))
                    budget -= int(n[:first].sum())
                done_a, budget, preempted = self._phase_a_scalar(c, first, budget)
                parts.append(done_a)
        admit = waiting and budget > 0 and len(running) < L.max_num_seqs
        # Phase B: waiting requests, FCFS, only if nothing was preempted.
        if admit and not preempted:
            if self._head_blocked(c):
                admit = False
            else:
                admitted = self._phase_b(c, budget, start)
                if admitted[0].size:
                    parts.append(admitted)
                else:
                    admit = False  # the head is blocked (the usual step of a full pool)
        if a is not None and fast is not None and not admit:  # the steady part alone
            return self._steady_plan(c, a[0], a[1], a[2], a[3])
        parts = [p for p in parts if p[0].size]
        if not parts:
            return _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY
        if len(parts) == 1:
            rq, sc, hits = parts[0]
            ch = hits if hits is not None else _const(rq.size, 0)
        else:
            fast = None
            rq = np.concatenate([p[0] for p in parts])
            sc = np.concatenate([p[1] for p in parts])
            ch = np.concatenate([p[2] if p[2] is not None else np.zeros(p[0].size, np.int64)
                                 for p in parts])
        # vLLM _update_after_schedule: computed grows now; full blocks join the prefix cache.
        if fast is not None:
            cp, kn, whole = fast
        else:
            cp = s.computed[rq]
            kn = s.known[rq]
            whole = False
        after = kn if whole else cp + sc
        s.computed[rq] = after
        pl = c.run_prompt if rq is c.run_arr else s.prompt[rq]
        if everyone and not preempted:
            self._settle(c, rq, pl, after, kn, whole)
        if L.prefix_caching:
            if steady_part is None:
                self._offer(c, rq, after, kn, whole)
            else:  # the steady part by its remainders, the rest (a few) one at a time
                # (the steady part alone returned by _steady_plan above)
                self._offer_steady(c, steady_part, steady_kn, steady_rem)
                ns = steady_part.size  # (a schedule never passes the known tokens: after)
                self._offer_blocks(c, rq[ns:].tolist(), (after[ns:] // B).tolist())
        return rq, sc, cp, pl, ch, after, kn

    def _settle(self, c: Core, rq: np.ndarray, pl: np.ndarray, after: np.ndarray,
                kn: np.ndarray, whole: bool) -> None:
        """After a schedule that gave tokens to every running request in order (no
        preemption, nobody left out by the budget): the core is steady from now on, its
        steady part the leading requests scheduled whole (each samples, so it ends the step
        in steady decode), the rest its tail. ``running`` will be ``rq`` once this step's
        zombies leave; _finish_step records the steady part's arrays."""
        m = rq.size
        if not whole:
            got = after == kn
            if not _all(got):
                m = int(got.argmin())  # the first request not scheduled whole
        if m == rq.size:
            tail = []
            if rq is not c.run_arr:
                c.run_arr, c.run_prompt, c.run_target = rq, pl, c.state.target[rq]
        else:
            tail = rq[m:].tolist()
            ra = rq[:m]
            c.run_arr, c.run_prompt, c.run_target = ra, pl[:m], c.state.target[ra]
        c.tail = tail
        c.dirty = False
        c.steady = True

    def _phase_a_steady(self, c: Core, budget: int) -> tuple[
            np.ndarray, np.ndarray, np.ndarray, np.ndarray,
            tuple[np.ndarray, np.ndarray, None] | None, int] | None:
        """Phase A of a steady core (see :attr:`Core.steady`): each steady request its one
        known token (whole, so it samples), a block where its computed tokens fill their
        last one; then the tail's requests in order, each the rest of its known tokens capped
        by the threshold and the budget left (vLLM ``Scheduler.schedule``'s running loop).
        Returns (steady part, its computed and known tokens, their remainders mod B, the
        tail's (requests, tokens, None) or None, the budget left), having allocated their
        blocks; or None, having changed nothing, when the budget does not cover the steady
        part, the tail's schedule is not this path's (:meth:`_tail_schedule`), the blocks do
        not fit (the general Phase A then preempts), or nothing would be scheduled. Requests
        that finished in the step in flight (async) schedule nothing."""
        s = c.state
        L = c.limits
        B = L.block_size
        kv = c.kv
        part, cr, kn = c.run_arr, c.next_computed, c.next_known
        if c.zombies:
            keep = ~s.finished[part]
            part, cr, kn = part[keep], cr[keep], kn[keep]
        nk = part.size
        if nk > budget:
            return None
        rem = cr & (B - 1) if B & (B - 1) == 0 else cr % B  # (a power of 2: no division)
        grow = (rem == 0).nonzero()[0]
        blocks = grow.size
        budget -= nk
        tail_part = None
        if c.tail:
            tail = self._tail_schedule(c, budget)
            if tail is None:
                return None
            trq, tsc, _cps, _kns, needs, budget = tail
            blocks += sum(needs)
            if trq:
                tail_part = (np.array(trq, np.int64), np.array(tsc, np.int64), None)
        if blocks > kv.free or not (nk or tail_part):
            return None
        if blocks:
            kv.allocate(blocks)
            if grow.size:
                s.held[part[grow]] += 1
            if tail_part is not None:
                s.held[tail_part[0]] += needs
        return part, cr, kn, rem, tail_part, budget

    def _tail_schedule(self, c: Core, budget: int) -> tuple[
            list[int], list[int], list[int], list[int], list[int], int] | None:
        """Phase A over a steady core's tail (:attr:`Core.tail`), changing nothing: each
        request the rest of its known tokens capped by the threshold and the budget left, in
        order, as vLLM's running loop does. Returns (requests, tokens, computed and known
        tokens before, blocks each needs, the budget left). A few requests: Python scalars
        cost less than the array rule's calls.

        None when the budget runs out before a running request that is not finished, or
        cuts one while requests finished in the step in flight wait to leave: the tail is
        rebuilt from the step's rows, which would lose the requests left out, so the general
        Phase A takes those steps (decisions RS5, RS8)."""
        s = c.state
        L = c.limits
        B, F, thr = L.block_size, L.fixed_blocks, L.long_prefill_token_threshold
        computed, known, held = s.computed.item, s.known.item, s.held.item
        finished = s.finished
        rq: list[int] = []
        sc: list[int] = []
        cps: list[int] = []
        kns: list[int] = []
        needs: list[int] = []
        cut = False
        for r in c.tail:
            if finished[r]:  # (finished in the step in flight: leaves after the schedule)
                continue
            if budget <= 0:
                return None
            cp = computed(r)
            k = known(r)
            n = k - cp
            if thr and n > thr:
                n = thr
            if n > budget:
                n = budget
                cut = True
            rq.append(r)
            sc.append(n)
            cps.append(cp)
            kns.append(k)
            needs.append((cp + n + B - 1) // B + F - held(r))
            budget -= n
        if cut and c.zombies:
            return None
        return rq, sc, cps, kns, needs, budget

    def _steady_plan(self, c: Core, rq: np.ndarray, cr: np.ndarray, kn: np.ndarray,
                     rem: np.ndarray) -> Plan:
        """The plan of a step that is the steady decode part alone (what the general
        combination in :meth:`_schedule` gives for it, without its branches)."""
        s = c.state
        s.computed[rq] = kn
        # (rq is not run_arr when the step in flight's zombies leave after this schedule;
        # a tail's requests all finished in it)
        pl = c.run_prompt if rq is c.run_arr else s.prompt[rq]
        self._settle(c, rq, pl, kn, kn, True)
        if c.limits.prefix_caching:
            self._offer_steady(c, rq, kn, rem)
        n = rq.size
        return rq, _const(n, 1), cr, pl, _const(n, 0), kn, kn

    def _offer(self, c: Core, rq: np.ndarray, after: np.ndarray, kn: np.ndarray, whole: bool
               ) -> None:
        """vLLM ``_update_after_schedule``'s prefix-cache side: the blocks the schedule filled
        join the cache (shared keys) or the request's own segment (vLLM's rule, whatever the
        state)."""
        s = c.state
        B = c.limits.block_size
        full = (after if whole else np.minimum(after, kn)) // B
        grow = (full > s.registered[rq]).nonzero()[0]
        if grow.size:
            self._offer_blocks(c, rq[grow].tolist(), full[grow].tolist())

    def _offer_steady(self, c: Core, rq: np.ndarray, kn: np.ndarray, rem: np.ndarray) -> None:
        """:meth:`_offer` for a steady decode part ``rq`` scheduled whole (its known tokens
        ``kn``, its computed tokens mod B before ``rem``): a block fills when the known token
        completes it (computed mod B was B - 1); each had offered all its full blocks, so
        these are the requests vLLM's rule (full > registered) picks, one block each. A few a
        step: a Python loop costs less than the rule's array calls."""
        B = c.limits.block_size
        fills = (rem == B - 1).nonzero()[0]
        if fills.size:
            self._offer_blocks(c, rq[fills].tolist(), (kn[fills] // B).tolist())

    def _offer_blocks(self, c: Core, reqs: list[int], fulls: list[int]) -> None:
        """:meth:`_offer` for requests ``reqs`` whose leading ``fulls`` blocks are now full:
        those past the ones each registered join the cache (in request order)."""
        s = c.state
        registered = s.registered
        reg_of, shared_of = registered.item, s.n_shared.item  # (ints, without numpy scalars)
        segment, explicit = c.kv.segment, c.kv.explicit
        keyed = []  # (request, full, before) within its shared keys, or explicit
        for r, f in zip(reqs, fulls, strict=True):
            b = reg_of(r)
            if f <= b:
                continue
            registered[r] = f
            if b >= shared_of(r) and r not in explicit:  # its own segment grows
                segment[r] = segment.get(r, 0) + f - b
            else:
                keyed.append((r, f, b))
        for r, f, b in keyed:
            self._register(c, r, f, b)

    def _register(self, c: Core, r: int, full: int, reg: int) -> None:
        """The request's leading ``full`` blocks are full (``reg`` were before): offer the new
        ones to the cache (its shared keys, then its own segment)."""
        s = c.state
        keys = self._keys(c, r)
        shared = keys[2][-1] if keys[2] else 0
        if reg < shared:
            mine = s.refs[r]
            if mine is None:
                mine = s.refs[r] = ([], [])
            hi = min(full, shared)
            if c.blocked_head >= 0 and c.limits.prefix_caching and hi > reg:
                # a key of the blocked head's chain cached (or held) anew may lengthen its hit
                bk = c.blocked_set
                if bk is None:
                    bk = c.blocked_set = set(c.blocked_keys)
                ends = keys[2]
                i = bisect_right(ends, reg)  # the unit holding block ``reg``, then on to hi
                j = bisect_left(ends, hi)  # the unit holding block ``hi - 1``
                if not bk.isdisjoint(keys[0][i:j + 1]):
                    c.blocked_head = -1
            c.kv.register_units(keys, reg, hi, mine)
        c.kv.register_private(r, full - max(reg, shared))

    def _phase_a_scalar(self, c: Core, i: int, budget: int
                        ) -> tuple[tuple[np.ndarray, np.ndarray, None], int, bool]:
        """Phase A from running[i] on, one request at a time, preempting the newest running
        request while the current one's blocks do not fit (vLLM ``Scheduler.schedule``)."""
        s = c.state
        L = c.limits
        B, F, thr = L.block_size, L.fixed_blocks, L.long_prefill_token_threshold
        kv, running, finished = c.kv, c.running, s.finished
        rq: list[int] = []
        sc: list[int] = []
        preempted = False
        while i < len(running) and budget > 0:
            r = running[i]
            if finished[r]:
                i += 1
                continue
            cr = int(s.computed[r])
            n = int(s.known[r]) - cr
            if thr and n > thr:
                n = thr
            n = min(n, budget)
            if n <= 0:
                i += 1
                continue
            need = max((cr + n + B - 1) // B + F - int(s.held[r]), 0)
            stop = False
            while need > kv.free:
                victim = next(v for v in reversed(running) if not finished[v])
                self._preempt(c, victim)
                preempted = True
                if victim == r:
                    stop = True
                    break
            if stop:
                break
            if need:
                kv.allocate(need)
                s.held[r] += need
            rq.append(r)
            sc.append(n)
            budget -= n
            i += 1
        return (np.array(rq, np.int64), np.array(sc, np.int64), None), budget, preempted

    def _phase_b(self, c: Core, budget: int, start: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Admit waiting requests in FCFS order while the token budget lasts, running stays
        under max_num_seqs and the head's whole current sequence fits (else stop)."""
        s = c.state
        L = c.limits
        B, F, thr = L.block_size, L.fixed_blocks, L.long_prefill_token_threshold
        kv, waiting, running = c.kv, c.waiting, c.running
        rq: list[int] = []
        sc: list[int] = []
        ch: list[int] = []
        c.blocked_head = -1  # an admission's touch may lower a later head's need: look again
        while waiting and budget > 0 and len(running) < L.max_num_seqs:
            r = waiting[0]
            num_tokens = int(s.known[r])
            full = (num_tokens + B - 1) // B + F
            hit = shared = private = 0
            keys = _NO_CHAIN
            if L.prefix_caching:
                keys = self._keys(c, r)
                shared, private = kv.hit_units(keys, (num_tokens - 1) // B, r)
                hit = shared + private
            # evictable hits (0..hit of them) consume free blocks: counted only when the
            # answer depends on them
            if full > kv.free:
                need = full - hit  # (a lower bound when it alone does not fit)
                if need <= kv.free:
                    need += kv.evictable_units(keys, shared, private)
                if need > kv.free:
                    c.blocked_head, c.blocked_need = r, need  # see _schedule
                    # with duplicate blocks cached (KD1), an eviction of a key's first
                    # block may leave a held duplicate first: its need may fall by one an
                    # evicted block, so those are counted from here
                    c.blocked_ev = kv.evictions if kv.dups else -1
                    c.blocked_keys, c.blocked_set = keys[0], None
                    break  # head-of-line blocking: nothing behind it is admitted this step
            waiting.popleft()
            cr = hit * B
            remote = int(s.remote[r])
            if remote > cr:  # KV loaded from the prefill pool: computed, not scheduled
                cr = remote
                s.remote[r] = 0
            n = num_tokens - cr
            if thr and n > thr:
                n = thr
            n = min(n, budget)
            s.refs[r] = kv.touch_units(keys, shared, r, private) if hit else ([], [])
            s.registered[r] = hit
            need = (cr + n + B - 1) // B + F - hit
            kv.allocate(need)
            s.held[r] = hit + need
            s.computed[r] = cr
            s.cached_tokens[r] = hit * B
            if s.admitted[r] < 0:
                s.admitted[r] = start
            running.append(r)
            c.dirty = True
            rq.append(r)
            sc.append(n)
            ch.append(hit * B)
            budget -= n
        if not rq:  # the head is blocked (the usual step of a full pool): nothing new
            return _EMPTY, _EMPTY, _EMPTY
        return (np.array(rq, np.int64), np.array(sc, np.int64), np.array(ch, np.int64))
