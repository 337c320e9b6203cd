"""The replay's scheduler compiled: vLLM v0.31.0's engine core over arrays (decision CE1).

The rules are :mod:`kernel.replay.engine`'s (docs/model.md §16), which stays the readable
statement and the engine where numba is missing or ``BLIS_JIT=0``; this module runs the same
schedule in machine code, one call per engine step (:func:`advance`), and returns to Python
only to price a step (the kernel's :func:`~kernel.replay.pricing.price_step`), to grow a log,
or for what only Python knows (a P/D handoff's links). Everything lives in arrays made by
:mod:`kernel.replay.jit_driver`:

* ``R[pool, request, field]``: per-request scheduler state (the ``R_*`` fields; one plane per
  pool, since a P/D request runs on both), ``Q[request, field]`` its arrival chain (``Q_*``);
* ``C[core, field]``: each engine core's limits, queues and KV pool counters (``C_*``);
  ``RUN``/``ZMB``: its running requests (in order) and those finished in the step in flight;
  ``G[group, field]``: the cores stepping together (``G_*``); ``H``: the event heap;
* the KV pool of each core as vLLM's ``BlockPool`` keeps it, in the units of
  :mod:`kernel.replay.kv_units` (the same states block for block): ``E[core, entry, field]``
  one *entry* per run of hashed blocks in one state (a hash-chain entry's leading blocks, a
  request's own blocks past its chain, or one block of a unit whose blocks took different
  states), ``MAP`` key → first copy (open addressing), ``XS`` the units kept per block and how
  many of their blocks are, ``TB[core, slot, i]`` the runs a running request holds, in block
  order, as (entry, blocks).

Blocks that carry no hash (a request's partly filled tail, and every block when prefix caching
is off) are only counted: vLLM's free queue is [unhashed blocks..., hashed blocks in LRU
order], so a core's ``C_FREE`` is its unhashed free blocks plus ``C_LRUN``, the hashed blocks
in the queue, which allocation evicts from the front once the unhashed ones are used up. A
block's key is a pair of words: (0, the chain key of
:func:`~kernel.replay.block_keys.block_keys`) for a block the request source's hash chain
names, (request + 1, block index) for one past it, which only its own request can hit. A unit
entry's key is its first block's; its block i has its key's word 1 plus i (mod 2**64), and no
other entry starts inside it until it is split (``_explode``), which it never is while a
block of it stands alone (``XS``).
"""

from __future__ import annotations

# (every compiled function of the engine is in this one file: numba's on-disk cache notices a
# change to a function's own file only, not to the files of the functions it calls: CE2)
import numba
import numpy as np

__all__ = ["advance", "init_arrivals", "push_ready", "push_timer"]

_jit = numba.njit(cache=True, nogil=True)

# -- per request, per pool: R[pool, request, field] ------------------------------------------
# (what a step reads and writes of each running request first: one 64-byte line of the row)
R_PROMPT, R_TARGET, R_KNOWN, R_COMPUTED, R_HELD, R_REG, R_FIN, R_SLOT = 0, 1, 2, 3, 4, 5, 6, 7
R_NSHARED, R_NPC, R_PREEMPT, R_LOST, R_REMOTE, R_CACHED, R_ADMITTED, R_CORE = (
    8, 9, 10, 11, 12, 13, 14, 15)
R_QNEXT, R_INBOX_T, R_HOFF = 16, 17, 18  # (R_NPC: the runs in its TB row)
NR = 24  # (three whole lines)
# -- per request: Q[request, field] ----------------------------------------------------------
Q_ARR, Q_READY, Q_FOLLOW, Q_THINK, Q_ADM, Q_REJ, Q_DONE_NS, Q_PIN = 0, 1, 2, 3, 4, 5, 6, 7
NQ = 8
# -- per core: C[core, field] ----------------------------------------------------------------
C_POOL, C_PCORE, C_GROUP, C_MAXSEQS, C_MNBT, C_THR, C_B, C_F = 0, 1, 2, 3, 4, 5, 6, 7
C_NB, C_CACHING, C_ASYNC, C_FREE, C_LRUN, C_LRUH, C_LRUT, C_EVICT = 8, 9, 10, 11, 12, 13, 14, 15
C_NRUN, C_NZOMB, C_WH, C_WT, C_WLEN, C_IH, C_IT, C_ILEN = 16, 17, 18, 19, 20, 21, 22, 23
C_ETOP, C_STOP, C_MASK, C_VER, C_BLK_R, C_BLK_NEED, C_BLK_VER, C_ROWA = (
    24, 25, 26, 27, 28, 29, 30, 31)
C_ROWN, C_HTOK = 32, 33
NC = 34
# -- per group: G[group, field] --------------------------------------------------------------
G_BUSY, G_START, G_C0, G_NC = 0, 1, 2, 3
NG = 4
# -- scalars: S[field] -----------------------------------------------------------------------
S_SEQ, S_BATCHES, S_GSTEPS, S_MAXSTEPS, S_HEAPN, S_ROWN, S_TOKN, S_STEPN = 0, 1, 2, 3, 4, 5, 6, 7
S_AWAIT, S_NOW, S_NPOOLS, S_CLIENT, S_KEEP, S_ROUTER, S_TIMER_T, S_TIMER_TOK = (
    8, 9, 10, 11, 12, 13, 14, 15)
S_ERR, S_PD, S_NHQ, S_ROWBOUND, S_PA, S_PM, S_PPOOL = 16, 17, 18, 19, 20, 21, 22
S_TURN = 24  # + pool: the pool's router turn; then S_PC0 + pool, S_PN + pool
S_PC0, S_PN = 28, 32
S_DTURN = 36  # the P/D decode router's turn
NS = 40
# -- a run of hashed blocks: E[core, entry, field] ------------------------------------------
# key (first block's), blocks, holders, LRU neighbours, the key's next copy (a block alone),
# whether it is a unit's leading run (else one block of a split unit: E_U1 its unit's key
# word 1, E_BNEXT the unit's next block, for holders of the unit from before the split)
E_K0, E_K1, E_CNT, E_REF, E_PREV, E_NEXT, E_DNEXT, E_UNIT, E_U1, E_BNEXT = range(10)
NE = 10
# -- logs: LR[field, row] (the steps table's per-row columns), LT[field, token], LS[step, f] --
LR_REQ, LR_SC, LR_CP, LR_PL, LR_CH, LR_EM = 0, 1, 2, 3, 4, 5
NLR = 6
NLS = 14  # the engine-step record: kernel.replay.engine.Rows.STEP_NAMES

# event kinds, in their order at one instant (engine.READY ... engine.STEP_END)
READY, TIMER, KICK, STEP_END = 0, 1, 2, 3
# advance's answers
DONE, PRICE, GROW_ROWS, GROW_STEPS, WAKE, HANDOFF, PRICE_GROUP = 0, 1, 2, 3, 5, 6, 7
ERR_MAX_STEPS, ERR_IDLE = -1, -2
ROUND_ROBIN, LEAST_LOADED = 0, 1

_MIX = np.uint64(0x9E3779B97F4A7C15)


# == the event heap: H[i] = (time, kind, seq, payload), ordered as the tuples are ==============
@_jit
def _before(H: np.ndarray, i: int, j: int) -> bool:
    if H[i, 0] != H[j, 0]:
        return H[i, 0] < H[j, 0]
    if H[i, 1] != H[j, 1]:
        return H[i, 1] < H[j, 1]
    return H[i, 2] < H[j, 2]


@_jit
def _swap(H: np.ndarray, i: int, j: int) -> None:
    for f in range(4):
        t = H[i, f]
        H[i, f] = H[j, f]
        H[j, f] = t


@_jit
def _push(H: np.ndarray, S: np.ndarray, t: int, kind: int, x: int) -> None:
    S[S_SEQ] += 1
    i = S[S_HEAPN]
    S[S_HEAPN] = i + 1
    H[i, 0] = t
    H[i, 1] = kind
    H[i, 2] = S[S_SEQ]
    H[i, 3] = x
    while i > 0:
        up = (i - 1) >> 1
        if not _before(H, i, up):
            break
        _swap(H, i, up)
        i = up


@_jit
def _pop(H: np.ndarray, S: np.ndarray) -> None:
    """Drop the top (read it from H[0] first)."""
    n = S[S_HEAPN] - 1
    S[S_HEAPN] = n
    if n == 0:
        return
    for f in range(4):
        H[0, f] = H[n, f]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            break
        b = a + 1
        m = b if b < n and _before(H, b, a) else a
        if not _before(H, m, i):
            break
        _swap(H, i, m)
        i = m


@_jit
def push_ready(H: np.ndarray, S: np.ndarray, t: int, r: int, pool: int) -> None:
    """Request ``r`` joins pool ``pool`` at ``t`` (``Simulation.push_ready``)."""
    _push(H, S, t, READY, r * S[S_NPOOLS] + pool)


@_jit
def push_timer(H: np.ndarray, S: np.ndarray, t: int, token: int) -> None:
    _push(H, S, t, TIMER, token)


# == queues: singly linked through R[pool, request, R_QNEXT] =================================
@_jit
def _q_append(R: np.ndarray, C: np.ndarray, p: int, c: int, h: int, r: int) -> None:
    """Append ``r`` to the core's queue whose (head, tail, length) fields start at ``h``."""
    R[p, r, R_QNEXT] = -1
    if C[c, h + 2] == 0:
        C[c, h] = r
    else:
        R[p, C[c, h + 1], R_QNEXT] = r
    C[c, h + 1] = r
    C[c, h + 2] += 1


@_jit
def _q_appendleft(R: np.ndarray, C: np.ndarray, p: int, c: int, h: int, r: int) -> None:
    if C[c, h + 2] == 0:
        R[p, r, R_QNEXT] = -1
        C[c, h + 1] = r
    else:
        R[p, r, R_QNEXT] = C[c, h]
    C[c, h] = r
    C[c, h + 2] += 1


@_jit
def _q_popleft(R: np.ndarray, C: np.ndarray, p: int, c: int, h: int) -> int:
    r = C[c, h]
    C[c, h] = R[p, r, R_QNEXT]
    C[c, h + 2] -= 1
    return r


# == the prefix-cache table: MAP[core, slot] = (key word 0, key word 1, first entry or -1) ====
@_jit
def _home(k0: int, k1: int, mask: int) -> np.int64:
    x = np.uint64(k0) * _MIX ^ np.uint64(k1)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return np.int64(x & np.uint64(mask))


@_jit
def _find(MAP: np.ndarray, c: int, mask: int, k0: int, k1: int) -> int:
    """The slot holding key (k0, k1), or -1."""
    i: int = _home(k0, k1, mask)  # type: ignore[assignment]  # (an int64 in numba)
    while MAP[c, i, 2] >= 0:
        if MAP[c, i, 0] == k0 and MAP[c, i, 1] == k1:
            return i
        i = (i + 1) & mask
    return -1


@_jit
def _insert(MAP: np.ndarray, c: int, mask: int, k0: int, k1: int, e: int) -> None:
    """Key (k0, k1), absent, now maps to entry ``e``."""
    i = _home(k0, k1, mask)
    while MAP[c, i, 2] >= 0:
        i = (i + 1) & mask
    MAP[c, i, 0] = k0
    MAP[c, i, 1] = k1
    MAP[c, i, 2] = e


@_jit
def _delete(MAP: np.ndarray, c: int, mask: int, i: int) -> None:
    """Empty slot ``i``, shifting back the keys of its probe run (no tombstones)."""
    j = i
    while True:
        j = (j + 1) & mask
        if MAP[c, j, 2] < 0:
            break
        k = _home(MAP[c, j, 0], MAP[c, j, 1], mask)
        # the key at j stays if its home lies cyclically in (i, j]
        if (i < k <= j) if i <= j else (i < k or k <= j):
            continue
        MAP[c, i, 0] = MAP[c, j, 0]
        MAP[c, i, 1] = MAP[c, j, 1]
        MAP[c, i, 2] = MAP[c, j, 2]
        i = j
    MAP[c, i, 2] = -1


# == the free queue's hashed part (LRU, front first), linked through E_PREV / E_NEXT ==========
# (C_LRUN, the blocks in it, is kept by the callers: an entry stands for E_CNT blocks)
@_jit
def _lru_append(C: np.ndarray, E: np.ndarray, c: int, e: int) -> None:
    t = C[c, C_LRUT]
    E[c, e, E_PREV] = t
    E[c, e, E_NEXT] = -1
    if t < 0:
        C[c, C_LRUH] = e
    else:
        E[c, t, E_NEXT] = e
    C[c, C_LRUT] = e


@_jit
def _lru_before(C: np.ndarray, E: np.ndarray, c: int, e: int, at: int) -> None:
    """Queue ``e`` just in front of ``at`` (a split unit's blocks take its place)."""
    a = E[c, at, E_PREV]
    E[c, e, E_PREV] = a
    E[c, e, E_NEXT] = at
    E[c, at, E_PREV] = e
    if a < 0:
        C[c, C_LRUH] = e
    else:
        E[c, a, E_NEXT] = e


@_jit
def _lru_unlink(C: np.ndarray, E: np.ndarray, c: int, e: int) -> None:
    a, b = E[c, e, E_PREV], E[c, e, E_NEXT]
    if a < 0:
        C[c, C_LRUH] = b
    else:
        E[c, a, E_NEXT] = b
    if b < 0:
        C[c, C_LRUT] = a
    else:
        E[c, b, E_PREV] = a


# == split units: XS[core, slot] = (key word 0, unit key word 1, its blocks standing alone) ===
@_jit
def _split_blocks(XS: np.ndarray, c: int, mask: int, k0: int, u: int) -> int:
    i = _find(XS, c, mask, k0, u)
    return XS[c, i, 2] if i >= 0 else 0


@_jit
def _split_add(XS: np.ndarray, c: int, mask: int, k0: int, u: int, d: int) -> None:
    i = _find(XS, c, mask, k0, u)
    if i < 0:
        _insert(XS, c, mask, k0, u, d)
    elif XS[c, i, 2] + d == 0:
        _delete(XS, c, mask, i)
    else:
        XS[c, i, 2] += d


# == the block pool ==========================================================================
@_jit
def _new_entry(E: np.ndarray, ESTK: np.ndarray, C: np.ndarray, c: int, k0: int, k1: int,
               cnt: int, ref: int, unit: int, u: int) -> int:
    C[c, C_ETOP] -= 1
    e = ESTK[c, C[c, C_ETOP]]
    E[c, e, E_K0] = k0
    E[c, e, E_K1] = k1
    E[c, e, E_CNT] = cnt
    E[c, e, E_REF] = ref
    E[c, e, E_DNEXT] = -1
    E[c, e, E_UNIT] = unit
    E[c, e, E_U1] = u
    E[c, e, E_BNEXT] = -1
    return e


@_jit
def _explode(C, E, ESTK, MAP, XS, c, e):
    """Unit entry ``e`` becomes one entry per block, each in the unit's state and place (its
    holders keep (e, blocks), read through E_BNEXT), when its blocks are about to take
    different states (``KVUnits._explode``)."""
    k0, u, cnt, ref = E[c, e, E_K0], E[c, e, E_K1], E[c, e, E_CNT], E[c, e, E_REF]
    mask = C[c, C_MASK]
    E[c, e, E_UNIT] = 0
    E[c, e, E_CNT] = 1
    E[c, e, E_U1] = u
    _split_add(XS, c, mask, k0, u, cnt)
    prev = e
    for j in range(1, cnt):
        k1 = np.int64(np.uint64(u) + np.uint64(j))
        f = _new_entry(E, ESTK, C, c, k0, k1, 1, ref, 0, u)
        _insert(MAP, c, mask, k0, k1, f)
        E[c, prev, E_BNEXT] = f
        if ref == 0:  # queued: front first, the unit's tail block nearest the front
            _lru_before(C, E, c, f, prev)
        prev = f


@_jit
def _drop_entry(C, E, ESTK, MAP, XS, c, e):
    """A queued entry's blocks lose their hashes (``_maybe_evict_cached_block``): it leaves its
    key's copies (the key goes with its last copy; a next copy held lowers a blocked head's
    need: C_VER)."""
    mask = C[c, C_MASK]
    k0 = E[c, e, E_K0]
    i = _find(MAP, c, mask, k0, E[c, e, E_K1])
    head = MAP[c, i, 2]
    if head == e:
        nxt = E[c, e, E_DNEXT]
        if nxt < 0:
            _delete(MAP, c, mask, i)
        else:
            MAP[c, i, 2] = nxt
            C[c, C_VER] += 1
    else:
        q = head
        while E[c, q, E_DNEXT] != e:
            q = E[c, q, E_DNEXT]
        E[c, q, E_DNEXT] = E[c, e, E_DNEXT]
    if not E[c, e, E_UNIT]:
        _split_add(XS, c, mask, k0, E[c, e, E_U1], -1)
    ESTK[c, C[c, C_ETOP]] = e
    C[c, C_ETOP] += 1


@_jit
def _allocate(C, E, ESTK, MAP, XS, c, n):
    """Take ``n`` blocks from the free queue's front (``BlockPool.get_new_blocks``): unhashed
    ones first, then cached ones, evicted from the front, a unit from its tail."""
    free = C[c, C_FREE] - n
    C[c, C_FREE] = free
    evict = C[c, C_LRUN] - free
    if evict <= 0:
        return
    C[c, C_LRUN] -= evict
    C[c, C_EVICT] += evict
    while evict > 0:
        e = C[c, C_LRUH]
        cnt = E[c, e, E_CNT]
        if cnt > evict:  # (a unit's tail blocks: its head stays at the front)
            E[c, e, E_CNT] = cnt - evict
            return
        _lru_unlink(C, E, c, e)
        _drop_entry(C, E, ESTK, MAP, XS, c, e)
        evict -= cnt


@_jit
def _register_block(C, E, ESTK, MAP, c, k0, k1, u):
    """One full block of split unit ``u`` hashed under (k0, k1), held once; a key already
    cached keeps its first copy and gets this one after its others (vLLM caches every full
    block, ``BlockHashToBlockMap``: decision KD1)."""
    e = _new_entry(E, ESTK, C, c, k0, k1, 1, 1, 0, u)
    mask = C[c, C_MASK]
    i = _find(MAP, c, mask, k0, k1)
    if i < 0:
        _insert(MAP, c, mask, k0, k1, e)
    else:
        q = MAP[c, i, 2]
        while E[c, q, E_DNEXT] >= 0:
            q = E[c, q, E_DNEXT]
        E[c, q, E_DNEXT] = e
    return e


@_jit
def _add_run(R: np.ndarray, TB: np.ndarray, p: int, c: int, r: int, slot: int, e: int,
             cnt: int) -> None:
    k = R[p, r, R_NPC]
    TB[c, slot, k, 0] = e
    TB[c, slot, k, 1] = cnt
    R[p, r, R_NPC] = k + 1


@_jit
def _register_unit(R, C, E, ESTK, MAP, XS, TB, p, c, r, slot, k0, u, a, b):
    """Blocks [a, b) of the unit keyed (k0, u) are full, held by request ``r``
    (``KVUnits.register_units``): a new unit, its one holder's unit growing, else one
    entry a block."""
    mask = C[c, C_MASK]
    if _split_blocks(XS, c, mask, k0, u) == 0:
        i = _find(MAP, c, mask, k0, u)
        if i < 0:
            if a == 0:  # a new unit, this request its one holder
                e = _new_entry(E, ESTK, C, c, k0, u, b, 1, 1, 0)
                _insert(MAP, c, mask, k0, u, e)
                _add_run(R, TB, p, c, r, slot, e, b)
                return
        else:
            e = MAP[c, i, 2]
            k = R[p, r, R_NPC] - 1
            if (a == E[c, e, E_CNT] and E[c, e, E_REF] == 1 and k >= 0
                    and TB[c, slot, k, 0] == e):  # its own unit grows
                E[c, e, E_CNT] = b
                TB[c, slot, k, 1] = b
                return
            _explode(C, E, ESTK, MAP, XS, c, e)
    _split_add(XS, c, mask, k0, u, b - a)
    for j in range(a, b):
        k1 = np.int64(np.uint64(u) + np.uint64(j))
        _add_run(R, TB, p, c, r, slot, _register_block(C, E, ESTK, MAP, c, k0, k1, u), 1)


@_jit
def _release(R, C, E, TB, SSTK, p, c, r):
    """A finished or preempted request gives its blocks back (``BlockPool.free_blocks``): the
    unhashed ones to the queue's front, the hashed ones nobody else holds to its back, tail
    block first."""
    C[c, C_FREE] += R[p, r, R_HELD] - R[p, r, R_REG]
    slot = R[p, r, R_SLOT]
    scratch = TB.shape[1] - 1
    for k in range(R[p, r, R_NPC] - 1, -1, -1):
        e, cnt = TB[c, slot, k, 0], TB[c, slot, k, 1]
        if E[c, e, E_UNIT] or cnt == 1:
            _unhold(C, E, c, e)
            continue
        # a unit held whole before it was split: its blocks, tail first
        f = e
        for j in range(cnt):
            TB[c, scratch, j, 0] = f
            f = E[c, f, E_BNEXT]
        for j in range(cnt - 1, -1, -1):
            _unhold(C, E, c, TB[c, scratch, j, 0])
    R[p, r, R_HELD] = 0
    R[p, r, R_REG] = 0
    R[p, r, R_NPC] = 0
    R[p, r, R_SLOT] = -1
    SSTK[c, C[c, C_STOP]] = slot
    C[c, C_STOP] += 1


@_jit
def _unhold(C: np.ndarray, E: np.ndarray, c: int, e: int) -> None:
    ref = E[c, e, E_REF] - 1
    E[c, e, E_REF] = ref
    if ref == 0:
        _lru_append(C, E, c, e)
        cnt = E[c, e, E_CNT]
        C[c, C_LRUN] += cnt
        C[c, C_FREE] += cnt


@_jit
def _block_key(R: np.ndarray, HV: np.ndarray, p: int, r: int, j: int, B: int, H: int
               ) -> np.int64:
    """Word 1 of the key of chain block ``j`` (:func:`kernel.replay.block_keys.block_keys`):
    the chain entry itself when B is a multiple of H, else the first entry covering the block
    mixed with j (mod 2**64)."""
    off = R[p, r, R_HOFF]
    if B % H == 0:
        return HV[off + (j + 1) * (B // H) - 1]
    first = ((j + 1) * B - 1) // H
    return np.int64(np.uint64(HV[off + first]) * _MIX + np.uint64(j))


@_jit
def _unit_start(j: int, B: int, H: int) -> int:
    """The first block of the unit holding chain block ``j`` (the blocks taking one chain
    entry, :func:`kernel.replay.block_keys.block_units`)."""
    if B % H == 0:
        return j
    return (((j + 1) * B - 1) // H) * H // B


@_jit
def _unit_end(j: int, B: int, H: int, upto: int) -> int:
    if B % H == 0:
        return j + 1
    end = ((((j + 1) * B - 1) // H) + 1) * H // B
    return end if end < upto else upto


@_jit
def _hit_unit(C, E, MAP, XS, TB, c, scratch, k, k0, u, want):
    """The leading blocks of the unit keyed (k0, u) found cached, at most ``want``, as runs
    of their first copies at ``TB[c, scratch, k...]``: (blocks, runs after)."""
    mask = C[c, C_MASK]
    got = 0
    if _split_blocks(XS, c, mask, k0, u):
        while got < want:
            i = _find(MAP, c, mask, k0, np.int64(np.uint64(u) + np.uint64(got)))
            if i < 0:
                break
            TB[c, scratch, k, 0] = MAP[c, i, 2]
            TB[c, scratch, k, 1] = 1
            k += 1
            got += 1
    else:
        i = _find(MAP, c, mask, k0, u)
        if i >= 0:
            e = MAP[c, i, 2]
            got = min(E[c, e, E_CNT], want)
            TB[c, scratch, k, 0] = e
            TB[c, scratch, k, 1] = got
            k += 1
    return got, k


@_jit
def _lookup(R, C, E, MAP, XS, TB, HV, p, c, r, limit):
    """The longest run of cached leading blocks, at most ``limit`` (vLLM
    ``find_longest_cache_hit``; ``KVUnits.hit_units``): the request's chain, then, when all
    of it hit, its own blocks; as runs of first copies in TB's scratch row. Returns (blocks,
    runs)."""
    B, H = C[c, C_B], C[c, C_HTOK]
    scratch = TB.shape[1] - 1
    shared = R[p, r, R_NSHARED]
    n = k = j = 0
    while j < shared and n < limit:
        end = _unit_end(j, B, H, shared)
        got, k = _hit_unit(C, E, MAP, XS, TB, c, scratch, k, 0, _block_key(R, HV, p, r, j, B, H),
                           min(end - j, limit - n))
        n += got
        if got < end - j:
            return n, k
        j = end
    if n == shared and n < limit:  # own blocks: reachable through the whole chain only
        got, k = _hit_unit(C, E, MAP, XS, TB, c, scratch, k, r + 1, shared, limit - n)
        n += got
    return n, k


@_jit
def _touch(R, C, E, ESTK, MAP, XS, TB, p, c, r, slot, runs):
    """The request holds the hit's runs (TB's scratch row) again (vLLM ``BlockPool.touch``):
    queued ones leave the queue; a unit hit only in part is split first."""
    scratch = TB.shape[1] - 1
    for k in range(runs):
        e, take = TB[c, scratch, k, 0], TB[c, scratch, k, 1]
        if E[c, e, E_UNIT] and take < E[c, e, E_CNT]:
            _explode(C, E, ESTK, MAP, XS, c, e)
        if E[c, e, E_UNIT]:
            _hold(C, E, c, e)
            _add_run(R, TB, p, c, r, slot, e, take)
            continue
        for _ in range(take):  # (a split unit's blocks: one run each)
            _hold(C, E, c, e)
            _add_run(R, TB, p, c, r, slot, e, 1)
            e = E[c, e, E_BNEXT]
    C[c, C_VER] += 1


@_jit
def _hold(C: np.ndarray, E: np.ndarray, c: int, e: int) -> None:
    if E[c, e, E_REF] == 0:
        _lru_unlink(C, E, c, e)
        cnt = E[c, e, E_CNT]
        C[c, C_LRUN] -= cnt
        C[c, C_FREE] -= cnt
    E[c, e, E_REF] += 1


@_jit
def _register(R, C, E, ESTK, MAP, XS, TB, HV, p, c, r, lo, hi):
    """The request's blocks [lo, hi) are full: each joins the prefix cache, held by it, unit
    by unit (its chain's, then its own run past the chain)."""
    slot = R[p, r, R_SLOT]
    shared = R[p, r, R_NSHARED]
    B, H = C[c, C_B], C[c, C_HTOK]
    j = lo
    while j < hi and j < shared:
        s = _unit_start(j, B, H)
        end = _unit_end(j, B, H, shared)
        b = (hi if hi < end else end) - s
        _register_unit(R, C, E, ESTK, MAP, XS, TB, p, c, r, slot, 0,
                       _block_key(R, HV, p, r, s, B, H), j - s, b)
        j = s + b
    if lo < shared:  # a new chain block may lengthen a blocked head's hit
        C[c, C_VER] += 1
    if hi > shared:
        _register_unit(R, C, E, ESTK, MAP, XS, TB, p, c, r, slot, r + 1, shared,
                       (lo if lo > shared else shared) - shared, hi - shared)
    R[p, r, R_REG] = hi


# == the scheduler ===========================================================================
@_jit
def _run_remove(RUN: np.ndarray, C: np.ndarray, c: int, r: int) -> None:
    n = C[c, C_NRUN]
    i = 0
    while RUN[c, i] != r:
        i += 1
    for j in range(i, n - 1):
        RUN[c, j] = RUN[c, j + 1]
    C[c, C_NRUN] = n - 1


@_jit
def _preempt(R: np.ndarray, C: np.ndarray, RUN: np.ndarray, E: np.ndarray, TB: np.ndarray,
             SSTK: np.ndarray, p: int, c: int, r: int) -> None:
    """``Scheduler._preempt_request``: recompute from scratch, front of waiting."""
    _run_remove(RUN, C, c, r)
    _release(R, C, E, TB, SSTK, p, c, r)
    R[p, r, R_LOST] += R[p, r, R_COMPUTED]
    R[p, r, R_COMPUTED] = 0
    R[p, r, R_PREEMPT] += 1
    _q_appendleft(R, C, p, c, C_WH, r)
    C[c, C_BLK_R] = -1


@_jit
def _add_row(LR: np.ndarray, S: np.ndarray, r: int, n: int, hit_tokens: int) -> None:
    k = S[S_ROWN]
    LR[LR_REQ, k] = r
    LR[LR_SC, k] = n
    LR[LR_CH, k] = hit_tokens
    S[S_ROWN] = k + 1


@_jit
def _schedule(R, C, RUN, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, c, sched_time, start):
    """One engine core's schedule (``Simulation._schedule``), made at ``sched_time`` for a step
    starting at ``start``: its rows appended to the row log (request, scheduled tokens, hit
    tokens now; computed before, prompt length and emitted after Phase B), the schedule
    applied (computed tokens, blocks, the prefix cache's new full blocks). Returns the rows."""
    p = C[c, C_POOL]
    B, F, thr = C[c, C_B], C[c, C_F], C[c, C_THR]
    # arrivals ready by the schedule's time
    while C[c, C_ILEN] and R[p, C[c, C_IH], R_INBOX_T] <= sched_time:
        _q_append(R, C, p, c, C_WH, _q_popleft(R, C, p, c, C_IH))
    budget = C[c, C_MNBT]
    a = S[S_ROWN]
    preempted = False
    # Phase A: running requests in order, each the rest of what it knows (capped by the
    # threshold and the budget left); the newest preempted while one's blocks do not fit
    i = 0
    while i < C[c, C_NRUN] and budget > 0:
        r = RUN[c, i]
        i += 1
        if R[p, r, R_FIN]:  # finished in the step in flight (async): leaves after this
            continue
        cr = R[p, r, R_COMPUTED]
        n = R[p, r, R_KNOWN] - cr
        if thr and n > thr:
            n = thr
        if n > budget:
            n = budget
        if n <= 0:
            continue
        need = (cr + n + B - 1) // B + F - R[p, r, R_HELD]
        if need < 0:
            need = 0
        stop = False
        while need > C[c, C_FREE]:
            k = C[c, C_NRUN] - 1
            while R[p, RUN[c, k], R_FIN]:
                k -= 1
            victim = RUN[c, k]
            _preempt(R, C, RUN, E, TB, SSTK, p, c, victim)
            preempted = True
            if victim == r:
                stop = True
                break
        if stop:
            break
        if need:
            _allocate(C, E, ESTK, MAP, XS, c, need)
            R[p, r, R_HELD] += need
        _add_row(LR, S, r, n, 0)
        budget -= n
    # Phase B: waiting requests, FCFS, only if nothing was preempted; the head must fit whole
    if (C[c, C_WLEN] and budget > 0 and C[c, C_NRUN] < C[c, C_MAXSEQS] and not preempted
            and not _head_blocked(C, c)):
        _phase_b(R, C, RUN, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, p, c, budget, start)
    # vLLM _update_after_schedule: computed tokens grow now; full blocks join the cache
    caching = C[c, C_CACHING]
    for k in range(a, S[S_ROWN]):
        r = LR[LR_REQ, k]
        cp = R[p, r, R_COMPUTED]
        kn = R[p, r, R_KNOWN]
        after = cp + LR[LR_SC, k]
        R[p, r, R_COMPUTED] = after
        LR[LR_CP, k] = cp
        LR[LR_PL, k] = R[p, r, R_PROMPT]
        LR[LR_EM, k] = 1 if after == kn else 0
        if caching:
            full = after // B
            reg = R[p, r, R_REG]
            if full > reg:
                _register(R, C, E, ESTK, MAP, XS, TB, HV, p, c, r, reg, full)
    return S[S_ROWN] - a


@_jit
def _head_blocked(C: np.ndarray, c: int) -> bool:
    """The waiting head is known to be still blocked without a lookup: found blocked needing
    ``C_BLK_NEED`` free blocks (its blocks less its hits others hold) and since then no touch,
    no new chain block and no held copy become a key's first (``C_VER``): releases and
    evictions only raise that need, so it does not fit while free blocks stay below it."""
    return (C[c, C_BLK_R] == C[c, C_WH] and C[c, C_BLK_VER] == C[c, C_VER]
            and C[c, C_BLK_NEED] > C[c, C_FREE])


@_jit
def _phase_b(R, C, RUN, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, p, c, budget, start):
    """Admit waiting requests in FCFS order while the budget lasts, ``running`` stays under
    max_num_seqs and the head's whole current sequence fits (``Simulation._phase_b``)."""
    B, F, thr = C[c, C_B], C[c, C_F], C[c, C_THR]
    caching = C[c, C_CACHING]
    C[c, C_BLK_R] = -1
    while C[c, C_WLEN] and budget > 0 and C[c, C_NRUN] < C[c, C_MAXSEQS]:
        r = C[c, C_WH]
        num_tokens = R[p, r, R_KNOWN]
        full = (num_tokens + B - 1) // B + F
        hit = runs = 0
        if caching:
            hit, runs = _lookup(R, C, E, MAP, XS, TB, HV, p, c, r, (num_tokens - 1) // B)
        if full > C[c, C_FREE]:
            # a hit on a block nobody holds takes a free block: the need is the blocks less
            # the hits others hold
            need = full
            scratch = TB.shape[1] - 1
            for k in range(runs):
                if E[c, TB[c, scratch, k, 0], E_REF] > 0:
                    need -= TB[c, scratch, k, 1]
            if need > C[c, C_FREE]:
                C[c, C_BLK_R] = r
                C[c, C_BLK_NEED] = need
                C[c, C_BLK_VER] = C[c, C_VER]
                break  # head-of-line blocking
        _q_popleft(R, C, p, c, C_WH)
        C[c, C_STOP] -= 1
        slot = SSTK[c, C[c, C_STOP]]
        R[p, r, R_SLOT] = slot
        R[p, r, R_NPC] = 0
        cr = hit * B
        remote = R[p, r, R_REMOTE]
        if remote > cr:  # KV loaded from the prefill pool: computed, not scheduled
            cr = remote
            R[p, r, R_REMOTE] = 0
        n = num_tokens - cr
        if thr and n > thr:
            n = thr
        if n > budget:
            n = budget
        if hit:  # vLLM BlockPool.touch: hit blocks held again (out of the queue if unheld)
            _touch(R, C, E, ESTK, MAP, XS, TB, p, c, r, slot, runs)
        R[p, r, R_REG] = hit
        need = (cr + n + B - 1) // B + F - hit
        _allocate(C, E, ESTK, MAP, XS, c, need)
        R[p, r, R_HELD] = hit + need
        R[p, r, R_COMPUTED] = cr
        R[p, r, R_CACHED] = hit * B
        if R[p, r, R_ADMITTED] < 0:
            R[p, r, R_ADMITTED] = start
        RUN[c, C[c, C_NRUN]] = r
        C[c, C_NRUN] += 1
        _add_row(LR, S, r, n, hit * B)
        budget -= n


@_jit
def _drop_zombies(R, C, RUN, ZMB, E, TB, SSTK, c):
    """Requests that finished in the step before leave after this schedule (async)."""
    p = C[c, C_POOL]
    for k in range(C[c, C_NZOMB]):
        r = ZMB[c, k]
        _run_remove(RUN, C, c, r)
        _release(R, C, E, TB, SSTK, p, c, r)
    C[c, C_NZOMB] = 0


# == a group's step ==========================================================================
@_jit
def _step(R, C, G, RUN, ZMB, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, g, now, sched_time):
    """Schedule the group's next step at ``now`` (``Simulation._step``): True when it has rows
    to price (its cores' rows at C_ROWA, C_ROWN), False when the group went idle."""
    c0, nc = G[g, G_C0], G[g, G_NC]
    rows = 0
    for c in range(c0, c0 + nc):
        C[c, C_ROWA] = S[S_ROWN]
        C[c, C_ROWN] = _schedule(R, C, RUN, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, c,
                                 sched_time, now)
        rows += C[c, C_ROWN]
    if rows == 0:
        # nothing to run with what the early schedule saw: the engine polls again after the
        # step in flight, with the finished requests gone (and once more if the only request
        # preempted itself)
        for c in range(c0, c0 + nc):
            _drop_zombies(R, C, RUN, ZMB, E, TB, SSTK, c)
        for _ in range(2):
            for c in range(c0, c0 + nc):
                C[c, C_ROWA] = S[S_ROWN]
                C[c, C_ROWN] = _schedule(R, C, RUN, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, c,
                                         now, now)
                rows += C[c, C_ROWN]
            if rows:
                break
    for c in range(c0, c0 + nc):
        _drop_zombies(R, C, RUN, ZMB, E, TB, SSTK, c)
    if rows == 0:
        G[g, G_BUSY] = 0
        for c in range(c0, c0 + nc):
            if C[c, C_WLEN]:
                S[S_ERR] = c
                return False
        return False
    S[S_NOW] = now
    return True


@_jit
def _arrive(Q, H, S, i, t):
    """Request ``i`` arrives at ``t`` (``replay``'s ``arrive``): ready after its admission
    overhead; a rejected one ends its session turn at once, and the next turn follows."""
    while True:
        Q[i, Q_ARR] = t
        if not Q[i, Q_REJ]:
            Q[i, Q_READY] = t + Q[i, Q_ADM]
            push_ready(H, S, Q[i, Q_READY], i, 0)
            return
        nxt = Q[i, Q_FOLLOW]
        if nxt < 0:
            return
        t = t + Q[nxt, Q_THINK]
        i = nxt


@_jit
def init_arrivals(Q, H, S, rows):
    """The requests arriving on their own, in row order."""
    for i in rows:
        _arrive(Q, H, S, i, Q[i, Q_ARR])


@_jit
def _route(C, S, pool, turn):
    """The core a request ready for ``pool`` joins (:func:`kernel.replay.router.make_router`;
    ``S[turn]`` the router's rotating index)."""
    c0, n = S[S_PC0 + pool], S[S_PN + pool]
    if S[S_ROUTER] == ROUND_ROBIN:
        c = c0 + S[turn] % n
        S[turn] += 1
        return c
    if n == 1:
        return c0
    start = S[turn] % n
    S[turn] += 1
    best, best_score = -1, 0.0
    for j in range(n):
        c = c0 + (start + j) % n
        waiting = C[c, C_ILEN] + C[c, C_WLEN]
        usage = (C[c, C_NB] - C[c, C_FREE]) / C[c, C_NB]
        score = (waiting + C[c, C_NRUN] - C[c, C_NZOMB]) + waiting * 6 * max(0.0, usage - 0.5)
        if best < 0 or score < best_score:
            best, best_score = c, score
    return best


@_jit
def _launch(R, Q, C, G, RUN, ZMB, E, TB, SSTK, LR, LT, LS, H, HQ, S, prices, g):
    """The group's step runs from S_NOW for its slowest core's price (``Simulation._launch``):
    each core's engine-step record, the tokens sampled at its end, finished requests out (async:
    after the next schedule) and on to what follows them, the step's end on the clock. False
    past max_steps."""
    now = S[S_NOW]
    c0, nc = G[g, G_C0], G[g, G_NC]
    step = 0
    for j in range(nc):
        if C[c0 + j, C_ROWN] and prices[j] > step:
            step = prices[j]
    end = now + step
    S[S_GSTEPS] += 1
    if 0 <= S[S_MAXSTEPS] < S[S_GSTEPS]:
        return False
    client = S[S_CLIENT]
    for j in range(nc):
        c = c0 + j
        n = C[c, C_ROWN]
        if not n:
            continue
        p = C[c, C_POOL]
        a = C[c, C_ROWA]
        b = S[S_BATCHES]
        S[S_BATCHES] = b + 1
        tokens = 0
        for k in range(a, a + n):
            tokens += LR[LR_SC, k]
        s = S[S_STEPN]
        S[S_STEPN] = s + 1
        LS[s, 0] = b
        LS[s, 1] = p
        LS[s, 2] = C[c, C_PCORE]
        LS[s, 3] = S[S_GSTEPS]
        LS[s, 4] = now
        LS[s, 5] = end
        LS[s, 6] = prices[j]
        LS[s, 7] = step
        LS[s, 8] = n
        LS[s, 9] = tokens
        LS[s, 10] = C[c, C_NRUN]
        LS[s, 11] = C[c, C_WLEN] + C[c, C_ILEN]
        LS[s, 12] = C[c, C_NB] - C[c, C_FREE]
        LS[s, 13] = C[c, C_NB]
        # a request whose scheduled tokens reached all it knew samples a token; those reaching
        # their target are listed in ZMB (empty: the schedule let the last ones go)
        fin = 0
        for k in range(a, a + n):
            if LR[LR_EM, k]:
                r = LR[LR_REQ, k]
                kn = R[p, r, R_KNOWN]
                if p == client:
                    t = S[S_TOKN]
                    LT[0, t] = r
                    LT[1, t] = kn
                    LT[2, t] = b
                    S[S_TOKN] = t + 1
                R[p, r, R_KNOWN] = kn + 1
                if kn + 1 == R[p, r, R_TARGET]:
                    R[p, r, R_FIN] = 1
                    ZMB[c, fin] = r
                    fin += 1
        if not fin:
            continue
        # they leave: async, as zombies after the next schedule; sync, now
        if C[c, C_ASYNC]:
            C[c, C_NZOMB] = fin
        else:
            for k in range(fin):
                _run_remove(RUN, C, c, ZMB[c, k])
                _release(R, C, E, TB, SSTK, p, c, ZMB[c, k])
        for k in range(fin):
            r = ZMB[c, k]
            if S[S_PD] and p == 0:  # prefill done: its KV goes to a decode core
                h = S[S_NHQ]
                HQ[h, 0] = r
                HQ[h, 1] = end
                HQ[h, 2] = C[c, C_PCORE]
                dst = _route(C, S, 1, S_DTURN)
                HQ[h, 3] = C[dst, C_PCORE]
                Q[r, Q_PIN] = dst
                S[S_NHQ] = h + 1
            else:  # the user has its last token: the session's next turn follows
                nxt = Q[r, Q_FOLLOW]
                if nxt >= 0:
                    _arrive(Q, H, S, nxt, end + Q[r, Q_DONE_NS] + Q[nxt, Q_THINK])
    G[g, G_START] = now
    _push(H, S, end, STEP_END, g)
    return True


@_jit
def advance(R, Q, C, G, RUN, ZMB, E, ESTK, MAP, XS, TB, SSTK, HV, LR, LT, LS, H, HQ, S,
            prices):
    """Run the clock to the next step that needs a price (``Simulation.run``): launch the
    step awaiting ``prices`` (per core of its group) if any, then take events until a group's
    schedule has rows. Returns PRICE (a group of one core: its rows at S_PA, S_PM of LR, its
    pool S_PPOOL), PRICE_GROUP (the group in S_AWAIT, its cores' rows at C_ROWA and C_ROWN),
    DONE, WAKE (a timer for Python: S_TIMER_T, S_TIMER_TOK), HANDOFF (prefilled
    requests in HQ for Python's links), a GROW_* (a log needs room: nothing taken yet), or an
    ERR_*."""
    g = S[S_AWAIT]
    if g >= 0:
        S[S_AWAIT] = -1
        if not _launch(R, Q, C, G, RUN, ZMB, E, TB, SSTK, LR, LT, LS, H, HQ, S, prices, g):
            return ERR_MAX_STEPS
        if not S[S_KEEP]:
            S[S_ROWN] = 0  # (the rows were only for the price)
        if S[S_NHQ]:
            return HANDOFF
    ncores = C.shape[0]
    npools = S[S_NPOOLS]
    while S[S_HEAPN]:
        if S[S_ROWN] + S[S_ROWBOUND] > LR.shape[1]:
            return GROW_ROWS
        if S[S_STEPN] + ncores > LS.shape[0]:
            return GROW_STEPS
        t, kind, x = H[0, 0], H[0, 1], H[0, 3]
        _pop(H, S)
        if kind == READY:
            r, pool = x // npools, x % npools
            c = Q[r, Q_PIN] if S[S_PD] and pool == 1 else _route(C, S, pool, S_TURN + pool)
            R[pool, r, R_CORE] = C[c, C_PCORE]
            R[pool, r, R_INBOX_T] = t
            _q_append(R, C, pool, c, C_IH, r)
            gg = C[c, C_GROUP]
            if not G[gg, G_BUSY]:  # an idle group steps once everything at this instant is in
                G[gg, G_BUSY] = 1
                _push(H, S, t, KICK, gg)
            continue
        if kind == TIMER:
            S[S_TIMER_T] = t
            S[S_TIMER_TOK] = x
            return WAKE
        sched = t
        if kind == STEP_END and C[G[x, G_C0], C_ASYNC]:
            sched = G[x, G_START]  # async: scheduled while the step before ran
        if _step(R, C, G, RUN, ZMB, E, ESTK, MAP, XS, TB, SSTK, HV, LR, S, x, t, sched):
            S[S_AWAIT] = x
            c0 = G[x, G_C0]
            if G[x, G_NC] > 1:
                return PRICE_GROUP
            S[S_PA] = C[c0, C_ROWA]
            S[S_PM] = C[c0, C_ROWN]
            S[S_PPOOL] = C[c0, C_POOL]
            return PRICE
        if S[S_ERR] >= 0:
            return ERR_IDLE
    return DONE
