"""The compiled engine's Python side (decision CE1): its arrays, the step loop that prices each
step, and what :func:`kernel.replay.results.build_result` reads of a run.

:func:`run` takes the cores, groups and per-request state :func:`kernel.replay.api.replay`
built for :class:`kernel.replay.engine.Simulation`, lays them out as the arrays of
:mod:`kernel.replay.jit_engine`, and calls :func:`~kernel.replay.jit_engine.advance` until the
clock runs out: each call returns with the next step's rows, which Python prices through the
replay's pricing seam (the same ``price_ns`` the Python engine calls, so the step clock and a
re-priced ``steps.parquet`` agree bit for bit), or asks for a bigger log, or hands Python a
P/D handoff or a link timer. Afterwards the per-request arrays are copied back into the
:class:`~kernel.replay.engine.RunState` planes and the logs exposed as :class:`CompiledRows`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..model import jit
from .engine import Core, Group, Rows, RunState

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


def _hash_columns(hashes: pa.Array | pa.ChunkedArray | None, n: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values as int64 bits, each request's offset, its entries) of the prefix_hashes column."""
    if hashes is None:
        z = np.zeros(n, np.int64)
        return np.zeros(1, np.int64), z, z
    arr = hashes.combine_chunks() if isinstance(hashes, pa.ChunkedArray) else hashes
    lens = np.asarray(pa.compute.fill_null(pa.compute.list_value_length(arr), 0)
                      .to_numpy(zero_copy_only=False), np.int64)
    values = pa.compute.list_flatten(arr).to_numpy(zero_copy_only=False)
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
    return 1 << max(int(x) - 1, 1).bit_length()


def run(groups: list[Group], states: list[RunState], price_ns: Callable[..., int], *,
        router: str, max_steps: int | None, keep_steps: bool, pd: bool,
        hashes: pa.Array | pa.ChunkedArray | None, hash_tokens: int | None,
        arrival: np.ndarray, think: np.ndarray, follower: dict[int, int],
        rejected: np.ndarray, admission_ns: np.ndarray, done_ns: np.ndarray,
        first_rows: Sequence[int], arrival_eff: np.ndarray, ready: np.ndarray,
        handoffs: Any = None) -> CompiledRun:
    """Replay on the compiled engine. ``admission_ns``: each request's admission overhead;
    ``done_ns``: from its last token's step end to its session's next turn (output-token
    overheads and completion); ``handoffs`` (P/D): ``bind(push_ready, push_timer)``, then
    ``start(request, end, src, dst)`` as a prefilled request's KV leaves prefill core ``src``
    for decode core ``dst`` and ``wake(token, t)`` at the links' timers (``api._Handoffs``).
    Fills ``arrival_eff`` and ``ready``, and the states' arrays."""
    from . import jit_engine as je  # (imports numba: only when the engine runs)

    cores = [c for g in groups for c in g.cores]
    npools = len(states)
    n = states[0].prompt.size
    # -- per request
    hv, hoff, hlen = _hash_columns(hashes, n)
    R = _aligned_zeros((npools, n, je.NR))  # (a row's first field on a cache line)
    tcap = 1
    for p, s in enumerate(states):
        lim = next(c.limits for c in cores if c.pool_index == p)
        B = lim.block_size
        plane = R[p]
        plane[:, je.R_PROMPT] = s.prompt
        plane[:, je.R_TARGET] = s.target
        plane[:, je.R_KNOWN] = s.known
        plane[:, je.R_REMOTE] = s.remote
        plane[:, je.R_ADMITTED] = -1
        plane[:, je.R_CORE] = -1
        plane[:, je.R_SLOT] = -1
        plane[:, je.R_HOFF] = hoff
        blocks = -(-s.target // B)
        if hash_tokens:
            plane[:, je.R_NSHARED] = np.minimum(hlen * hash_tokens // B, blocks)
        runs = ~rejected
        if runs.any():
            tcap = max(tcap, int(blocks[runs].max()))
    Q = np.zeros((n, je.NQ), np.int64)
    Q[:, je.Q_ARR] = arrival
    Q[:, je.Q_READY] = -1
    Q[:, je.Q_FOLLOW] = -1
    if follower:
        Q[np.fromiter(follower.keys(), np.int64), je.Q_FOLLOW] = np.fromiter(
            follower.values(), np.int64)
    Q[:, je.Q_THINK] = think
    Q[:, je.Q_ADM] = admission_ns
    Q[:, je.Q_REJ] = rejected
    Q[:, je.Q_DONE_NS] = done_ns
    Q[:, je.Q_PIN] = -1
    # -- per core and group
    nc = len(cores)
    seqs = max(c.limits.max_num_seqs for c in cores)
    nb = max(c.limits.num_blocks for c in cores)
    mapcap = _pow2(2 * nb)
    C = np.zeros((nc, je.NC), np.int64)
    G = np.zeros((len(groups), je.NG), np.int64)
    k = 0
    for gi, g in enumerate(groups):
        G[gi, je.G_C0], G[gi, je.G_NC] = k, len(g.cores)
        for c in g.cores:
            if c is not cores[k]:
                raise AssertionError("a group's cores are not consecutive")
            L = c.limits
            C[k, [je.C_POOL, je.C_PCORE, je.C_GROUP, je.C_MAXSEQS, je.C_MNBT, je.C_THR,
                  je.C_B, je.C_F, je.C_NB, je.C_CACHING, je.C_ASYNC, je.C_FREE, je.C_HTOK]] = (
                c.pool_index, c.index, gi, L.max_num_seqs, L.max_num_batched_tokens,
                L.long_prefill_token_threshold, L.block_size, L.fixed_blocks, L.num_blocks,
                L.prefix_caching, L.async_scheduling, L.num_blocks, hash_tokens or 0)
            C[k, [je.C_LRUH, je.C_LRUT, je.C_BLK_R]] = -1
            C[k, je.C_ETOP] = L.num_blocks
            C[k, je.C_STOP] = L.max_num_seqs
            C[k, je.C_MASK] = mapcap - 1
            k += 1
    RUN = np.zeros((nc, seqs), np.int64)
    ZMB = np.zeros((nc, seqs), np.int64)
    E = np.zeros((nc, nb, je.NE), np.int64)
    ESTK = np.tile(np.arange(nb - 1, -1, -1, dtype=np.int64), (nc, 1))
    MAP = np.full((nc, mapcap, 3), -1, np.int64)
    XS = np.full((nc, mapcap, 3), -1, np.int64)
    caching = any(c.limits.prefix_caching for c in cores)
    # each running request's runs of hashed blocks, and a scratch row (a lookup's hit)
    TB = np.zeros((nc, seqs + 1, tcap if caching else 1, 2), np.int64)
    SSTK = np.tile(np.arange(seqs - 1, -1, -1, dtype=np.int64), (nc, 1))
    # -- logs and the clock
    rowbound = sum(c.limits.max_num_seqs for c in cores)
    client = npools - 1
    runs = ~rejected
    # one row per request per step it is in: its decodes, and a prefill in a chunk or a few
    # (grown if preemptions or chunking need more); only a step's rows without the table
    out_tokens = int(states[client].target[runs].sum() - states[client].prompt[runs].sum())
    rows = out_tokens + 2 * int(runs.sum()) * npools if keep_steps else 0
    LR = np.zeros((je.NLR, max(rows, 4 * rowbound, 1 << 12)), np.int64)
    LT = np.zeros((3, out_tokens + 1), np.int64)
    LS = np.zeros((1 << 14, je.NLS), np.int64)
    H = np.zeros((n * npools + 2 * len(groups) + 16, 4), np.int64)
    HQ = np.zeros((rowbound + 1, 4), np.int64)
    S = np.zeros(je.NS, np.int64)
    S[je.S_MAXSTEPS] = -1 if max_steps is None else max_steps
    S[je.S_AWAIT] = -1
    S[je.S_ERR] = -1
    S[je.S_NPOOLS] = npools
    S[je.S_CLIENT] = client
    S[je.S_KEEP] = keep_steps
    S[je.S_ROUTER] = je.ROUND_ROBIN if router == "round_robin" else je.LEAST_LOADED
    S[je.S_PD] = pd
    S[je.S_ROWBOUND] = rowbound
    for p in range(npools):
        members = [i for i, c in enumerate(cores) if c.pool_index == p]
        S[je.S_PC0 + p], S[je.S_PN + p] = members[0], len(members)
    prices = np.zeros(max(len(g.cores) for g in groups), np.int64)

    def _room() -> None:
        nonlocal H
        if S[je.S_HEAPN] + 1 > H.shape[0]:
            H = np.concatenate((H, np.zeros_like(H)))

    def push_ready(t: int, r: int) -> None:  # the clock's entries for the P/D links
        _room()
        je.push_ready(H, S, t, r, 1)

    def push_timer(t: int, token: int) -> None:
        _room()
        je.push_timer(H, S, t, token)

    if handoffs is not None:
        handoffs.bind(push_ready, push_timer)

    je.init_arrivals(Q, H, S, np.asarray(first_rows, np.int64))
    advance, item = je.advance, S.item
    PRICE, S_PA, S_PM, S_PPOOL = je.PRICE, je.S_PA, je.S_PM, je.S_PPOOL
    pool_core = [next(c for c in cores if c.pool_index == p) for p in range(npools)]
    sc, cp, pl = LR[1], LR[2], LR[3]
    while True:
        st = advance(R, Q, C, G, RUN, ZMB, E, ESTK, MAP, XS, TB, SSTK, hv, LR, LT, LS, H, HQ,
                     S, prices)
        if st == PRICE:  # (the common answer: a group of one core)
            a = item(S_PA)
            b = a + item(S_PM)
            prices[0] = price_ns(pool_core[item(S_PPOOL)], sc[a:b], cp[a:b], pl[a:b])
        elif st == je.PRICE_GROUP:
            g = S[je.S_AWAIT]
            c0 = G[g, je.G_C0]
            for j in range(G[g, je.G_NC]):
                m = C[c0 + j, je.C_ROWN]
                if m:
                    a = C[c0 + j, je.C_ROWA]
                    prices[j] = price_ns(pool_core[C[c0 + j, je.C_POOL]], sc[a:a + m],
                                         cp[a:a + m], pl[a:a + m])
        elif st == je.DONE:
            break
        elif st == je.GROW_ROWS:
            LR = np.concatenate((LR, np.zeros_like(LR)), axis=1)
            sc, cp, pl = LR[1], LR[2], LR[3]
        elif st == je.GROW_STEPS:
            LS = np.concatenate((LS, np.zeros_like(LS)))
        elif st == je.WAKE:
            handoffs.wake(int(S[je.S_TIMER_TOK]), int(S[je.S_TIMER_T]))
        elif st == je.HANDOFF:
            for h in range(S[je.S_NHQ]):
                r, end, src, dst = (int(x) for x in HQ[h])
                handoffs.start(r, end, src, dst)
            S[je.S_NHQ] = 0
        elif st == je.ERR_MAX_STEPS:
            raise RuntimeError(f"the replay exceeded max_steps={max_steps} engine steps "
                               f"(raise ReplayOptions.max_steps or check the load)")
        elif st == je.ERR_IDLE:
            raise AssertionError("an idle engine core with waiting requests")
        else:
            raise AssertionError(f"the compiled engine answered {st}")
    # -- back into the states and the cores
    for p, s in enumerate(states):
        plane = R[p]
        for name, f in (("known", je.R_KNOWN), ("computed", je.R_COMPUTED),
                        ("admitted", je.R_ADMITTED), ("preemptions", je.R_PREEMPT),
                        ("lost", je.R_LOST), ("cached_tokens", je.R_CACHED), ("core", je.R_CORE),
                        ("remote", je.R_REMOTE)):
            getattr(s, name)[:] = plane[:, f]
        s.finished[:] = plane[:, je.R_FIN] != 0
    for i, c in enumerate(cores):
        c.kv.evictions = int(C[i, je.C_EVICT])
        c.kv.free = int(C[i, je.C_FREE])
    arrival_eff[:] = Q[:, je.Q_ARR]
    ready[:] = Q[:, je.Q_READY]
    nsteps = int(S[je.S_STEPN])
    steps = {name: LS[:nsteps, i] for i, name in enumerate(Rows.STEP_NAMES)}
    nrows = int(S[je.S_ROWN]) if keep_steps else 0
    return CompiledRun(CompiledRows(keep_steps, steps, LR[:, :nrows],
                                    LT[:, :int(S[je.S_TOKN])]), cores)
