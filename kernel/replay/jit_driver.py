"""The compiled engine's Python side (decision CE1): its arrays, the step loop that prices each
step, and what :func:`kernel.replay.results.build_result` reads of a run.

:func:`run` takes the cores, groups and per-request state :func:`kernel.replay.api.replay`
built for :class:`kernel.replay.engine.Simulation`, lays them out as the arrays of
:mod:`kernel.replay.jit_engine` (:class:`_Arrays`), and calls
:func:`~kernel.replay.jit_engine.advance` until the clock runs out: each call returns with the
next step's rows, which Python prices through the replay's pricing seam (the same ``price_ns``
the Python engine calls, so the step clock and a re-priced ``steps.parquet`` agree bit for
bit), or asks for a bigger log, or hands Python a P/D handoff or a link timer. Afterwards the
per-request arrays are copied back into the :class:`~kernel.replay.engine.RunState` planes and
the logs exposed as :class:`CompiledRows`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model import jit
from .engine import Core, Group, Rows, RunState
from .hashes import chain_lengths

if TYPE_CHECKING:
    from .api import Arrivals

__all__ = ["CompiledRows", "CompiledRun", "available", "run"]


def available() -> bool:
    """Whether the compiled engine runs replays in this process (numba importable and
    ``BLIS_JIT`` not 0; else :class:`~kernel.replay.engine.Simulation` does)."""
    return jit.enabled()


@dataclass
class CompiledRows:
    """The run's logs in the shape :class:`kernel.replay.engine.Rows` gives them."""

    keep: bool
    steps: dict[str, np.ndarray]  # Rows.STEP_NAMES -> one value per engine step
    _rows: np.ndarray  # LR[:, :rows]
    _tokens: np.ndarray  # LT[:, :tokens]

    def tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request, known tokens before it, batch) of every token the user receives, in the
        order sampled (the caller may use them as scratch)."""
        return self._tokens[0], self._tokens[1], self._tokens[2]

    @property
    def cols(self) -> dict[str, np.ndarray]:
        """The steps table's per-row columns (``keep_steps`` only)."""
        lr = self._rows
        counts = self.steps["requests"]
        return {"batch_id": np.repeat(self.steps["batch_id"], counts),
                "request": lr[0], "scheduled": lr[1], "computed": lr[2], "prompt_len": lr[3],
                "cached_tokens": lr[4], "emitted": lr[5].astype(bool),
                "pool": np.repeat(self.steps["pool"], counts)}


@dataclass
class CompiledRun:
    """What :func:`kernel.replay.results.build_result` reads of a finished run."""

    rows: CompiledRows
    cores: list[Core]


def run(groups: list[Group], states: list[RunState], price_ns: Callable[..., int],
        arrivals: Arrivals, *, router: str, max_steps: int | None, keep_steps: bool,
        hashes: pa.Array | pa.ChunkedArray | None, hash_tokens: int | None,
        arrival_eff: np.ndarray, ready: np.ndarray, handoffs: Any = None) -> CompiledRun:
    """Replay on the compiled engine, pricing each step with ``price_ns(core, scheduled,
    computed, prompt_len)``. ``handoffs`` (P/D only): ``bind(push_ready, push_timer)``, then
    ``start(request, end, src, dst)`` as a prefilled request's KV leaves prefill core ``src``
    for decode core ``dst``, and ``wake(token, t)`` at the links' timers (``api._Handoffs``).
    Fills ``arrival_eff`` and ``ready`` (times per request) and the states' arrays."""
    from . import jit_engine as je  # (imports numba: only when the engine runs)

    a = _Arrays(je, groups, states, arrivals, hashes, hash_tokens, router=router,
                max_steps=max_steps, keep_steps=keep_steps, pd=handoffs is not None)
    if handoffs is not None:
        handoffs.bind(a.push_ready, a.push_timer)
    je.init_arrivals(a.Q, a.H, a.S, np.asarray(arrivals.first_rows, np.int64))
    _step_loop(a, price_ns, handoffs, max_steps)
    _write_back(a, states, arrival_eff, ready)
    return CompiledRun(_rows_of(a, keep_steps), a.cores)


class _Arrays:
    """The compiled engine's state (the layouts of :mod:`kernel.replay.jit_engine`)."""

    def __init__(self, je: Any, groups: list[Group], states: list[RunState],
                 arrivals: Arrivals, hashes: pa.Array | pa.ChunkedArray | None,
                 hash_tokens: int | None, *, router: str, max_steps: int | None,
                 keep_steps: bool, pd: bool):
        self.je = je
        self.cores = [c for g in groups for c in g.cores]
        self.npools = len(states)
        self._requests(states, arrivals, hashes, hash_tokens)
        self._pools(groups, hash_tokens)
        self._clock(states, arrivals, router=router, max_steps=max_steps,
                    keep_steps=keep_steps, pd=pd, group_sizes=[len(g.cores) for g in groups])

    def _requests(self, states: list[RunState], arrivals: Arrivals,
                  hashes: pa.Array | pa.ChunkedArray | None, hash_tokens: int | None) -> None:
        je = self.je
        n = states[0].prompt.size
        self.HV, offsets, entries = _hash_columns(hashes, n)
        self.R = R = _aligned_zeros((self.npools, n, je.NR))  # (a row's first field on a line)
        runs = ~arrivals.rejected
        self.tcap = 1  # the most blocks a request holds: the runs its TB row may need
        for p, s in enumerate(states):
            block = next(c.limits.block_size for c in self.cores if c.pool_index == p)
            plane = R[p]
            for field, values in ((je.R_PROMPT, s.prompt), (je.R_TARGET, s.target),
                                  (je.R_KNOWN, s.known), (je.R_REMOTE, s.remote),
                                  (je.R_HOFF, offsets)):
                plane[:, field] = values
            plane[:, [je.R_ADMITTED, je.R_CORE, je.R_SLOT]] = -1
            blocks = -(-s.target // block)
            if hash_tokens:
                plane[:, je.R_NSHARED] = np.minimum(entries * hash_tokens // block, blocks)
            if runs.any():
                self.tcap = max(self.tcap, int(blocks[runs].max()))
        self.Q = Q = np.zeros((n, je.NQ), np.int64)
        Q[:, [je.Q_READY, je.Q_FOLLOW, je.Q_PIN]] = -1
        if arrivals.follower:
            Q[np.fromiter(arrivals.follower.keys(), np.int64), je.Q_FOLLOW] = np.fromiter(
                arrivals.follower.values(), np.int64)
        for field, values in ((je.Q_ARR, arrivals.arrival), (je.Q_THINK, arrivals.think),
                              (je.Q_ADM, arrivals.admission_ns), (je.Q_REJ, arrivals.rejected),
                              (je.Q_DONE_NS, arrivals.done_ns)):
            Q[:, field] = values

    def _pools(self, groups: list[Group], hash_tokens: int | None) -> None:
        """The cores, their groups, queues and KV pools."""
        je, cores = self.je, self.cores
        nc = len(cores)
        seqs = max(c.limits.max_num_seqs for c in cores)
        nb = max(c.limits.num_blocks for c in cores)
        mapcap = _pow2(2 * nb)  # (the key tables at most half full)
        self.C = C = np.zeros((nc, je.NC), np.int64)
        self.G = G = np.zeros((len(groups), je.NG), np.int64)
        k = 0
        for gi, g in enumerate(groups):
            G[gi, je.G_C0], G[gi, je.G_NC] = k, len(g.cores)
            for c in g.cores:
                if c is not cores[k]:
                    raise AssertionError("a group's cores are not consecutive")
                L = c.limits
                C[k, [je.C_POOL, je.C_PCORE, je.C_GROUP, je.C_MAXSEQS, je.C_MNBT, je.C_THR,
                      je.C_B, je.C_F, je.C_NB, je.C_CACHING, je.C_ASYNC, je.C_FREE,
                      je.C_HTOK, je.C_ETOP, je.C_STOP, je.C_MASK]] = (
                    c.pool_index, c.index, gi, L.max_num_seqs, L.max_num_batched_tokens,
                    L.long_prefill_token_threshold, L.block_size, L.fixed_blocks,
                    L.num_blocks, L.prefix_caching, L.async_scheduling, L.num_blocks,
                    hash_tokens or 0, L.num_blocks, L.max_num_seqs, mapcap - 1)
                C[k, [je.C_LRUH, je.C_LRUT, je.C_BLK_R]] = -1
                k += 1
        self.RUN = np.zeros((nc, seqs), np.int64)
        self.ZMB = np.zeros((nc, seqs), np.int64)
        self.SSTK = np.tile(np.arange(seqs - 1, -1, -1, dtype=np.int64), (nc, 1))
        self.E = np.zeros((nc, nb, je.NE), np.int64)
        self.ESTK = np.tile(np.arange(nb - 1, -1, -1, dtype=np.int64), (nc, 1))
        self.MAP = np.full((nc, mapcap, 3), -1, np.int64)
        self.XS = np.full((nc, mapcap, 3), -1, np.int64)
        caching = any(c.limits.prefix_caching for c in cores)
        # each running request's runs of hashed blocks, and a scratch row (a lookup's hit):
        # sized for the longest request, in virtual memory (pages are touched as runs are
        # written)
        self.TB = np.zeros((nc, seqs + 1, self.tcap if caching else 1, 2), np.int64)

    def _clock(self, states: list[RunState], arrivals: Arrivals, *, router: str,
               max_steps: int | None, keep_steps: bool, pd: bool,
               group_sizes: list[int]) -> None:
        """The logs, the event heap and the scalars."""
        je, cores = self.je, self.cores
        n = self.Q.shape[0]
        rowbound = sum(c.limits.max_num_seqs for c in cores)  # a step's most rows
        runs = ~arrivals.rejected
        client = states[-1]
        out_tokens = int(client.target[runs].sum() - client.prompt[runs].sum())
        # one row per request per step it is in: its decodes, and a prefill in a chunk or a
        # few (grown if preemptions or chunking need more); without the table, a step's rows
        rows = out_tokens + 2 * int(runs.sum()) * self.npools if keep_steps else 0
        self.LR = np.zeros((je.NLR, max(rows, 4 * rowbound, 1 << 12)), np.int64)
        self.LT = np.zeros((3, out_tokens + 1), np.int64)
        self.LS = np.zeros((1 << 14, je.NLS), np.int64)
        # every request's arrival at each pool, a step end and a kick per group (the links'
        # timers, P/D, grow it)
        self.H = np.zeros((n * self.npools + 2 * len(group_sizes) + 16, 4), np.int64)
        self.HQ = np.zeros((rowbound + 1, 4), np.int64)
        self.S = S = np.zeros(je.NS, np.int64)
        S[[je.S_MAXSTEPS, je.S_AWAIT, je.S_ERR, je.S_NPOOLS, je.S_CLIENT, je.S_KEEP,
           je.S_ROUTER, je.S_PD, je.S_ROWBOUND]] = (
            -1 if max_steps is None else max_steps, -1, -1, self.npools, self.npools - 1,
            keep_steps, je.ROUND_ROBIN if router == "round_robin" else je.LEAST_LOADED, pd,
            rowbound)
        for p in range(self.npools):
            members = [i for i, c in enumerate(cores) if c.pool_index == p]
            S[je.S_PC0 + p], S[je.S_PN + p] = members[0], len(members)
        self.prices = np.zeros(max(group_sizes), np.int64)  # a step's price per core

    def args(self) -> tuple[np.ndarray, ...]:
        """:func:`~kernel.replay.jit_engine.advance`'s arrays, in its order."""
        return (self.R, self.Q, self.C, self.G, self.RUN, self.ZMB, self.E, self.ESTK,
                self.MAP, self.XS, self.TB, self.SSTK, self.HV, self.LR, self.LT, self.LS,
                self.H, self.HQ, self.S, self.prices)

    def push_ready(self, t: int, r: int) -> None:
        """Request ``r`` joins the decode pool at ``t`` (a P/D handoff ended)."""
        self._heap_room()
        self.je.push_ready(self.H, self.S, t, r, 1)

    def push_timer(self, t: int, token: int) -> None:
        self._heap_room()
        self.je.push_timer(self.H, self.S, t, token)

    def _heap_room(self) -> None:
        if self.S[self.je.S_HEAPN] + 1 > self.H.shape[0]:  # (only the links' timers grow it)
            self.H = np.concatenate((self.H, np.zeros_like(self.H)))


def _step_loop(a: _Arrays, price_ns: Callable[..., int], handoffs: Any,
               max_steps: int | None) -> None:
    """:func:`~kernel.replay.jit_engine.advance` until the clock runs out, answering it."""
    je = a.je
    advance, item = je.advance, a.S.item
    PRICE, S_PA, S_PM, S_PPOOL = je.PRICE, je.S_PA, je.S_PM, je.S_PPOOL
    pool_core = [next(c for c in a.cores if c.pool_index == p) for p in range(a.npools)]
    prices, S, C, G = a.prices, a.S, a.C, a.G
    sc, cp, pl = a.LR[je.LR_SC], a.LR[je.LR_CP], a.LR[je.LR_PL]
    args = a.args()
    while True:
        st = advance(*args)
        if st == PRICE:  # (the common answer: a group of one core)
            lo = item(S_PA)
            hi = lo + item(S_PM)
            prices[0] = price_ns(pool_core[item(S_PPOOL)], sc[lo:hi], cp[lo:hi], pl[lo:hi])
        elif st == je.PRICE_GROUP:  # each core's rows priced; the group lasts the slowest
            g = item(je.S_AWAIT)
            c0 = int(G[g, je.G_C0])
            for j in range(int(G[g, je.G_NC])):
                m = int(C[c0 + j, je.C_ROWN])
                if m:
                    lo = int(C[c0 + j, je.C_ROWA])
                    prices[j] = price_ns(pool_core[int(C[c0 + j, je.C_POOL])], sc[lo:lo + m],
                                         cp[lo:lo + m], pl[lo:lo + m])
        elif st == je.DONE:
            return
        elif st in (je.GROW_ROWS, je.GROW_STEPS):
            if st == je.GROW_ROWS:
                a.LR = np.concatenate((a.LR, np.zeros_like(a.LR)), axis=1)
                sc, cp, pl = a.LR[je.LR_SC], a.LR[je.LR_CP], a.LR[je.LR_PL]
            else:
                a.LS = np.concatenate((a.LS, np.zeros_like(a.LS)))
            args = a.args()
        elif st in (je.WAKE, je.HANDOFF):  # the P/D links, kept in Python
            if st == je.WAKE:
                handoffs.wake(item(je.S_TIMER_TOK), item(je.S_TIMER_T))
            else:
                for h in range(item(je.S_NHQ)):
                    r, end, src, dst = (int(x) for x in a.HQ[h])
                    handoffs.start(r, end, src, dst)
                S[je.S_NHQ] = 0
            args = a.args()  # (a timer may have grown the heap)
        elif st == je.ERR_MAX_STEPS:
            raise RuntimeError(f"the replay exceeded max_steps={max_steps} engine steps "
                               f"(raise ReplayOptions.max_steps or check the load)")
        elif st == je.ERR_IDLE:
            raise AssertionError("an idle engine core with waiting requests")
        else:
            raise AssertionError(f"the compiled engine answered {st}")


def _write_back(a: _Arrays, states: list[RunState], arrival_eff: np.ndarray,
                ready: np.ndarray) -> None:
    """What ``build_result`` reads of a run into the states (per request) and the cores
    (each pool's evictions); the states' other arrays are the engine's own, left as set up."""
    je = a.je
    for p, s in enumerate(states):
        plane = a.R[p]
        for name, f in (("admitted", je.R_ADMITTED), ("preemptions", je.R_PREEMPT),
                        ("lost", je.R_LOST), ("cached_tokens", je.R_CACHED), ("core", je.R_CORE)):
            getattr(s, name)[:] = plane[:, f]
    for i, c in enumerate(a.cores):
        c.kv.evictions = int(a.C[i, je.C_EVICT])
    arrival_eff[:] = a.Q[:, je.Q_ARR]
    ready[:] = a.Q[:, je.Q_READY]


def _rows_of(a: _Arrays, keep_steps: bool) -> CompiledRows:
    je = a.je
    nsteps = int(a.S[je.S_STEPN])
    steps = {name: a.LS[:nsteps, i] for i, name in enumerate(Rows.STEP_NAMES)}
    nrows = int(a.S[je.S_ROWN]) if keep_steps else 0
    return CompiledRows(keep_steps, steps, a.LR[:, :nrows], a.LT[:, :int(a.S[je.S_TOKN])])


def _hash_columns(hashes: pa.Array | pa.ChunkedArray | None, n: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values as int64 bits, each request's offset, its entries) of the prefix_hashes column."""
    if hashes is None:
        z = np.zeros(n, np.int64)
        return np.zeros(1, np.int64), z, z
    arr = hashes.combine_chunks() if isinstance(hashes, pa.ChunkedArray) else hashes
    lens = chain_lengths(arr)
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
    values = np.array(values, np.uint64).view(np.int64)  # (writable: one compiled signature)
    offsets = np.cumsum(lens) - lens
    return (values if values.size else np.zeros(1, np.int64)), offsets, lens


def _aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """Zeros (int64) whose first element sits on a 64-byte boundary."""
    size = int(np.prod(shape))
    buf = np.zeros(size + 8, np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip:skip + size].reshape(shape)


def _pow2(x: int) -> int:
    """The power of two at or above ``x`` (at least 2)."""
    return 1 << max(int(x) - 1, 1).bit_length()
