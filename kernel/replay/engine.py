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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .block_keys import block_keys
from .kv_cache import KVBlocks

__all__ = ["Core", "EngineLimits", "Group", "RunState", "Simulation"]

READY, STEP_END = 0, 1  # event kinds: at one instant arrivals are polled before a schedule


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
    """Per-request state, as Python lists (scalar reads in the step loop are list reads)."""

    def __init__(self, prompt: Sequence[int], output: Sequence[int],
                 hashes: Sequence[Sequence[int] | None] | None, hash_tokens: int | None):
        n = len(prompt)
        self.prompt = list(prompt)
        self.output = list(output)
        self.hashes = hashes
        self.hash_tokens = hash_tokens
        self.gen = [0] * n  # tokens sampled so far
        self.computed = [0] * n  # vLLM num_computed_tokens (after this step's schedule)
        self.held = [0] * n  # KV blocks held
        self.registered = [0] * n  # leading blocks already offered to the prefix cache
        self.refs: list[list[int] | None] = [None] * n  # cached keys held, block order
        self.keys: list[list[int] | None] = [None] * n
        self.finished = [False] * n
        self.preemptions = [0] * n
        self.cached_tokens = [0] * n  # prefix hit tokens at the (last) admission
        self.core = [-1] * n


class Core:
    """One engine core: waiting queue, running list and its KV blocks."""

    def __init__(self, index: int, pool: str, limits: EngineLimits):
        self.index = index
        self.pool = pool
        self.limits = limits
        self.kv = KVBlocks(limits.num_blocks, limits.block_size, limits.prefix_caching)
        self.inbox: deque[tuple[int, int]] = deque()  # (ready_ns, request) not yet polled
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.zombies: list[int] = []  # finished in the step before, freed after this schedule

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
    """The steps table as compact growable int64 columns."""

    NAMES = ("batch_id", "request", "scheduled", "computed", "prompt_len", "cached_tokens",
             "emitted")
    STEP_NAMES = ("batch_id", "engine", "group_step", "start", "end", "batch_ns", "step_ns",
                  "requests", "tokens", "running", "waiting", "kv_used", "kv_blocks")

    def __init__(self) -> None:
        self.cols = {n: array("q") for n in self.NAMES}
        self.steps = {n: array("q") for n in self.STEP_NAMES}


class Simulation:
    """Every group on one event clock; :meth:`run` until every request is done."""

    def __init__(self, state: RunState, groups: list[Group],
                 price_ns: Callable[[Core, np.ndarray, np.ndarray, np.ndarray], int],
                 route: Callable[[list[Core], int], Core], *, max_steps: int | None = None):
        self.s = state
        self.groups = groups
        self.cores = [c for g in groups for c in g.cores]
        self.group_of = {id(c): g for g in groups for c in g.cores}
        self.price_ns = price_ns
        self.route = route
        self.max_steps = max_steps
        self.rows = Rows()
        self.events: list[tuple[int, int, int, int]] = []
        self.seq = 0
        self.batches = 0
        self.group_steps = 0
        # requests finished at a step end: (request, end_ns), for the caller's bookkeeping
        self.on_finish: Callable[[int, int], None] | None = None

    # -- events --------------------------------------------------------------------------
    def push_ready(self, ready_ns: int, request: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (ready_ns, READY, self.seq, request))

    def _push_end(self, end_ns: int, gi: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (end_ns, STEP_END, self.seq, gi))

    def run(self) -> None:
        events = self.events
        gindex = {id(g): i for i, g in enumerate(self.groups)}
        while events:
            t, kind, _seq, x = heapq.heappop(events)
            if kind == READY:
                core = self.route(self.cores, x)
                self.s.core[x] = core.index
                core.inbox.append((t, x))
                g = self.group_of[id(core)]
                if not g.busy:
                    self._step(g, gindex[id(g)], t, t)
            else:
                g = self.groups[x]
                self._step(g, x, t, g.start if self._async(g) else t)

    @staticmethod
    def _async(g: Group) -> bool:
        return g.cores[0].limits.async_scheduling

    # -- one group step ------------------------------------------------------------------
    def _step(self, g: Group, gi: int, now: int, sched_time: int) -> None:
        """Schedule and launch the group's next step at ``now`` (the previous step's end, or
        an arrival at an idle group); ``sched_time`` is when its schedule ran (async: the
        previous step's start)."""
        plans = [self._schedule(c, sched_time) for c in g.cores]
        if all(not p[0] for p in plans):
            # Nothing to run with what the early schedule saw: the engine loop polls again
            # after the step in flight ends, with the finished requests gone.
            for c in g.cores:
                self._drop_zombies(c)
            plans = [self._schedule(c, now) for c in g.cores]
            if all(not p[0] for p in plans):
                # A step whose only request preempted itself: schedule once more.
                plans = [self._schedule(c, now) for c in g.cores]
        for c in g.cores:
            self._drop_zombies(c)
        if all(not p[0] for p in plans):
            g.busy = False
            if any(c.waiting for c in g.cores):
                raise AssertionError("an idle engine core with waiting requests")
            return
        prices = []
        for c, (rq, sc, cp, pl, _ch) in zip(g.cores, plans, strict=True):
            prices.append(self.price_ns(c, np.array(sc, np.int64), np.array(cp, np.int64),
                                        np.array(pl, np.int64)) if rq else 0)
        step = max(prices)
        end = now + step
        self.group_steps += 1
        if self.max_steps is not None and self.group_steps > self.max_steps:
            raise RuntimeError(f"the replay exceeded max_steps={self.max_steps} engine steps "
                               f"(raise ReplayOptions.max_steps or check the load)")
        s, cols, steps = self.s, self.rows.cols, self.rows.steps
        for c, (rq, sc, cp, pl, ch), price in zip(g.cores, plans, prices, strict=True):
            if not rq:
                continue
            b = self.batches
            self.batches += 1
            emitted = self._finish_step(c, rq, end)
            n = len(rq)
            cols["batch_id"].extend([b] * n)
            cols["request"].extend(rq)
            cols["scheduled"].extend(sc)
            cols["computed"].extend(cp)
            cols["prompt_len"].extend(pl)
            cols["cached_tokens"].extend(ch)
            cols["emitted"].extend(emitted)
            for name, v in (("batch_id", b), ("engine", c.index),
                            ("group_step", self.group_steps), ("start", now), ("end", end),
                            ("batch_ns", price), ("step_ns", step), ("requests", n),
                            ("tokens", sum(sc)), ("running", len(c.running)),
                            ("waiting", len(c.waiting) + len(c.inbox)),
                            ("kv_used", c.kv.used()), ("kv_blocks", c.kv.num_blocks)):
                steps[name].append(v)
        g.busy = True
        g.start = now
        self._push_end(end, gi)

    def _drop_zombies(self, c: Core) -> None:
        if not c.zombies:
            return
        s = self.s
        for r in c.zombies:
            c.running.remove(r)
            self._release(c, r)
            s.keys[r] = None
        c.zombies.clear()

    def _release(self, c: Core, r: int) -> None:
        s = self.s
        refs = s.refs[r] or []
        c.kv.release(s.held[r], refs)
        s.held[r] = 0
        s.refs[r] = None
        s.registered[r] = 0

    def _finish_step(self, c: Core, rq: list[int], end: int) -> list[int]:
        """Tokens sampled at the step's end; finished requests leave (async: after the next
        schedule)."""
        s = self.s
        prompt, gen, computed, output = s.prompt, s.gen, s.computed, s.output
        emitted = [0] * len(rq)
        done = []
        for i, r in enumerate(rq):
            if computed[r] == prompt[r] + gen[r]:
                emitted[i] = 1
                g = gen[r] + 1
                gen[r] = g
                if g == output[r]:
                    done.append(r)
        if done:
            for r in done:
                s.finished[r] = True
            if c.limits.async_scheduling:
                c.zombies.extend(done)
            else:
                for r in done:
                    c.running.remove(r)
                    self._release(c, r)
                    s.keys[r] = None
            if self.on_finish is not None:
                for r in done:
                    self.on_finish(r, end)
        return emitted

    # -- the scheduler -------------------------------------------------------------------
    def _keys(self, r: int) -> list[int]:
        s = self.s
        keys = s.keys[r]
        if keys is None:
            B = self.cores[s.core[r]].limits.block_size if s.core[r] >= 0 else 1
            n = -(-(s.prompt[r] + s.output[r]) // B)
            h = s.hashes[r] if s.hashes is not None else None
            keys = block_keys(h, s.hash_tokens, B, n, r)
            s.keys[r] = keys
        return keys

    def _preempt(self, c: Core, r: int) -> None:
        """vLLM ``Scheduler._preempt_request``: recompute from scratch, front of waiting."""
        s = self.s
        c.running.remove(r)
        self._release(c, r)
        s.computed[r] = 0
        s.preemptions[r] += 1
        c.waiting.appendleft(r)

    def _schedule(self, c: Core, sched_time: int
                  ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """One engine core's schedule: (requests, scheduled, computed before, prompt_len,
        cached tokens) in batch order. Applies the schedule (computed, blocks)."""
        s = self.s
        prompt, gen, computed, held, finished = s.prompt, s.gen, s.computed, s.held, s.finished
        L = c.limits
        B = L.block_size
        thr = L.long_prefill_token_threshold
        F = L.fixed_blocks
        kv = c.kv
        inbox, waiting, running = c.inbox, c.waiting, c.running
        while inbox and inbox[0][0] <= sched_time:
            waiting.append(inbox.popleft()[1])
        budget = L.max_num_batched_tokens
        rq: list[int] = []
        sc: list[int] = []
        cp: list[int] = []
        ch: list[int] = []
        preempted = False
        i = 0
        # Phase A: running requests in order.
        while i < len(running) and budget > 0:
            r = running[i]
            if finished[r]:
                i += 1
                continue
            cr = computed[r]
            n = prompt[r] + gen[r] - cr
            if thr and n > thr:
                n = thr
            if n > budget:
                n = budget
            if n <= 0:
                i += 1
                continue
            need = (cr + n + B - 1) // B + F - held[r]
            if need > kv.free:
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
            if need > 0:
                kv.allocate(need)
                held[r] += need
            rq.append(r)
            sc.append(n)
            cp.append(cr)
            ch.append(0)
            budget -= n
            i += 1
        # Phase B: waiting requests, FCFS, only if nothing was preempted.
        if not preempted:
            while waiting and budget > 0 and len(running) < L.max_num_seqs:
                r = waiting[0]
                num_tokens = prompt[r] + gen[r]
                full = (num_tokens + B - 1) // B + F
                hit = 0
                hit_keys: list[int] = []
                if L.prefix_caching:
                    keys = self._keys(r)
                    hit = kv.longest_hit(keys, (num_tokens - 1) // B)
                    hit_keys = keys[:hit]
                if full - hit + (kv.evictable_among(hit_keys) if hit else 0) > kv.free:
                    break  # head-of-line blocking: nothing behind it is admitted
                waiting.popleft()
                cr = hit * B
                n = num_tokens - cr
                if thr and n > thr:
                    n = thr
                if n > budget:
                    n = budget
                if hit:
                    kv.touch(hit_keys)
                s.refs[r] = list(hit_keys)
                s.registered[r] = hit
                need = (cr + n + B - 1) // B + F - hit
                kv.allocate(need)
                held[r] = hit + need
                computed[r] = cr
                s.cached_tokens[r] = cr
                running.append(r)
                rq.append(r)
                sc.append(n)
                cp.append(cr)
                ch.append(cr)
                budget -= n
        # vLLM _update_after_schedule: computed grows now; full blocks join the prefix cache.
        pl = [prompt[r] for r in rq]
        for r, n in zip(rq, sc, strict=True):
            computed[r] += n
        if L.prefix_caching:
            refs, registered = s.refs, s.registered
            for r in rq:
                full = min(computed[r], prompt[r] + gen[r]) // B
                j = registered[r]
                if full > j:
                    keys = self._keys(r)
                    mine = refs[r]
                    assert mine is not None
                    while j < full:
                        if kv.register(keys[j]):
                            mine.append(keys[j])
                        j += 1
                    registered[r] = j
        return rq, sc, cp, pl, ch
