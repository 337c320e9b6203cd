"""The KV pool with one entry per *unit*: the engine blocks of one hash-chain entry together.

A request's prefix chain names its blocks in units (:func:`~kernel.replay.block_keys.block_units`):
with 512-token hash blocks and 16-token engine blocks, the 32 engine blocks of one chain
entry are one unit under one key with a count, instead of 32 keys. The pool's semantics stay
those of :class:`~kernel.replay.kv_cache.KVBlocks`, block by block (vLLM v1's free queue,
``vllm/v1/core/kv_cache_utils.py`` and ``block_pool.py``); a unit entry stands for blocks
that are in the same state:

* a unit entry ``u`` present with count ``c`` is its leading ``c`` blocks, all held by the
  same requests (one reference count) or all queued next to each other in one LRU run, in
  block order (so the queue's front, the run's end, is the unit's tail block);
* eviction takes blocks from the queue's front one at a time, so it trims a unit from its
  tail: the count drops and the entry stays (its leading blocks, still in the same place);
* anything that would split a unit's state (a hit on part of it, a block registered past a
  hole or by another request than its one holder) first *explodes* the unit: its blocks
  become the per-block keys ``u + j`` (mod 2**64), which are exactly the keys
  :func:`~kernel.replay.block_keys.block_keys` gives those blocks, each in the unit's former
  state and place. An exploded unit stays per block.

A request's references are two lists, keys and counts: ``(u, c)`` holds the unit's ``c``
blocks (after an explosion, the per-block keys ``u .. u + c - 1``), ``(key, 1)`` one block.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from .kv_cache import KVBlocks

__all__ = ["Chain", "KVUnits", "Refs"]

_MASK = (1 << 64) - 1

# (unit keys, their sizes in blocks, cumulative block ends) of a request's chain
Chain = tuple[list[int], list[int], list[int]]
# (keys, block counts) a request holds, block order
Refs = tuple[list[int], list[int]]


def _blocks(u: int, lo: int, hi: int) -> list[int]:
    """Per-block keys of blocks ``[lo, hi)`` of unit ``u``."""
    return [(u + j) & _MASK for j in range(lo, hi)]


def _per_block(rk: list[int], rc: list[int], exploded: set[int]) -> Refs:
    """References with each exploded unit's ``(u, c)`` written as its blocks' ``(u + j, 1)``."""
    keys: list[int] = []
    counts: list[int] = []
    for k, n in zip(rk, rc, strict=True):
        if n > 1 and k in exploded:
            keys += _blocks(k, 0, n)
            counts += [1] * n
        else:
            keys.append(k)
            counts.append(n)
    return keys, counts


def _leading(chain: Chain, shared: int) -> Iterator[tuple[int, int]]:
    """(unit, blocks taken from it) over a chain's leading ``shared`` blocks."""
    left = shared
    for k, m in zip(chain[0], chain[1], strict=True):
        if left <= 0:
            return
        take = m if m <= left else left
        left -= take
        yield k, take


class KVUnits(KVBlocks):
    """:class:`KVBlocks` whose shared keys may stand for several blocks (see the module)."""

    __slots__ = ("exploded", "size", "unit_runs")

    def __init__(self, num_blocks: int, block_size: int, caching: bool):
        super().__init__(num_blocks, block_size, caching)
        self.size: dict[int, int] = {}  # unit key -> blocks present (absent: 1)
        self.exploded: set[int] = set()  # units kept per block from now on
        self.unit_runs: set[int] = set()  # stamps of LRU runs holding a unit of > 1 block

    # -- lookups ---------------------------------------------------------------------------
    def hit_units(self, chain: Chain, max_blocks: int, r: int) -> tuple[int, int]:
        """(shared, private) leading blocks found cached (:meth:`KVBlocks.longest_hit`)."""
        if not self.caching:
            return 0, 0
        keys, sizes, ends = chain
        total = ends[-1] if ends else 0
        limit = max_blocks if max_blocks >= 0 else max(total + max_blocks, 0)
        cached, size, exploded = self.cached, self.size, self.exploded
        n = 0
        for k, m in zip(keys, sizes, strict=True):
            if n >= limit:
                break
            want = m if m <= limit - n else limit - n
            if k in exploded:
                got = 0
                dups = self.dups
                for key in _blocks(k, 0, want):
                    if key not in cached and key not in dups:
                        break
                    got += 1
            elif k in cached:
                c = size.get(k, 1)
                got = c if c < want else want
            else:
                break
            n += got
            if got < m:
                break
        if r in self.segment or self.explicit:  # (else no own block is cached: no call)
            return n, self._private_hit(r, n == total, max_blocks - n)
        return n, 0

    def evictable_units(self, chain: Chain, shared: int, private: int) -> int:
        """Blocks of a hit (the chain's leading ``shared`` blocks, then ``private``) that
        nobody holds."""
        cached, exploded = self.cached, self.exploded
        out = private
        for k, take in _leading(chain, shared):
            if k in exploded:
                keys = _blocks(k, 0, take)
                if self.dups:
                    keys = list(map(self._first, keys))
                out += sum(1 for key in keys if cached[key] < 0)
            elif cached[k] < 0:
                out += take
        return out

    # -- state changes ---------------------------------------------------------------------
    def _explode(self, u: int) -> None:
        """Unit ``u`` becomes per-block keys ``u + j``, each in the unit's state and place."""
        self.exploded.add(u)
        c = self.size.pop(u, 1)
        state = self.cached.get(u)
        if state is None or c == 1:
            return
        blocks = _blocks(u, 0, c)
        self.cached.update(dict.fromkeys(blocks, state))
        if state < 0:  # queued: the run lists the blocks in block order where u was
            stamp = -state
            for s, item in self.lru:
                if s == stamp and not isinstance(item, int):
                    at = item.index(u)
                    item[at:at + 1] = blocks
                    break
            else:
                raise AssertionError(f"queued unit {u} has no LRU run {stamp}")

    def touch_units(self, chain: Chain, shared: int, r: int, private: int) -> Refs:
        """The request now holds the chain's leading ``shared`` blocks and ``private``
        segment blocks (vLLM ``BlockPool.touch``); returns its references."""
        cached, size, exploded, stale_in = self.cached, self.size, self.exploded, self._stale_in
        rk: list[int] = []
        rc: list[int] = []
        for k, take in _leading(chain, shared):
            if k not in exploded and take < size.get(k, 1):
                self._explode(k)
            per_block = False
            if k in exploded:
                keys = _blocks(k, 0, take)
                if self.dups:  # a block whose key lost its first copy: the oldest duplicate
                    first = list(map(self._first, keys))
                    per_block = first != keys
                    keys = first
            else:
                keys = [k]
            for key in keys:
                ref = cached[key]
                if ref < 0:
                    c = size.get(key, 1) if key == k else 1
                    stale_in[-ref] = stale_in.get(-ref, 0) + 1
                    self._stale += 1
                    self.free -= c
                    self._lru_count -= c
                    cached[key] = 1
                else:
                    cached[key] = ref + 1
            if per_block:
                rk.extend(keys)
                rc.extend([1] * len(keys))
            else:
                rk.append(k)
                rc.append(take)
        if private:
            self._touch_private(r, private)
        if self._stale > 2 * self.num_blocks + 64:
            self._compact()
        return rk, rc

    def register_units(self, chain: Chain, lo: int, hi: int, refs: Refs) -> None:
        """The chain's blocks ``[lo, hi)`` are full: the ones not cached yet join the cache
        held by this request (appended to ``refs``); a block whose key is already cached is
        cached too, under a duplicate key (:meth:`KVBlocks.register`, decision KD1): its
        unit is made per block first."""
        if not self.caching or hi <= lo:
            return
        keys, _sizes, ends = chain
        cached, size, exploded = self.cached, self.size, self.exploded
        rk, rc = refs
        i = bisect_right(ends, lo)
        start = ends[i - 1] if i else 0
        while i < len(keys) and start < hi:
            k, end = keys[i], ends[i]
            a = lo - start if lo > start else 0
            b = (hi if hi < end else end) - start
            i += 1
            start = end
            if k not in exploded:
                state = cached.get(k)
                if state is None:
                    if a == 0:  # a new unit, this request its one holder
                        cached[k] = 1
                        if b != 1:
                            size[k] = b
                        rk.append(k)
                        rc.append(b)
                        continue
                else:
                    c = size.get(k, 1)
                    if a == c and state == 1 and rk and rk[-1] == k:  # its own unit grows
                        size[k] = b
                        rc[-1] = b
                        continue
                self._explode(k)
            rk += map(self._register_key, _blocks(k, a, b))
            rc += [1] * (b - a)

    def release_units(self, held: int, refs: Refs, r: int) -> None:
        """A finished or preempted request gives back ``held`` blocks (:meth:`KVBlocks.release`
        with unit references)."""
        rk, rc = refs
        if self._own and r in self._own:  # an explicit request: its own keys are the tail
            own = self._take_own(r)
            rk, rc = rk + own, rc + [1] * len(own)
        self.free += held - sum(rc)
        self._queue_segment(r)
        if not rk:
            return
        cached, exploded = self.cached, self.exploded
        self._stamp += 1
        stamp = self._stamp
        if not exploded.isdisjoint(rk):  # exploded units count per block from now on
            rk, rc = _per_block(rk, rc, exploded)
        queued: list[int] = []  # keys reaching 0, tail first
        blocks = 0
        for i in range(len(rk) - 1, -1, -1):
            k = rk[i]
            ref = cached[k] - 1
            if ref:
                cached[k] = ref
            else:
                cached[k] = -stamp
                queued.append(k)
                blocks += rc[i]
        if not queued:
            return
        queued.reverse()
        self.lru.append((stamp, queued))
        if blocks > len(queued):  # a queued key stands for several blocks: a unit
            self.unit_runs.add(stamp)
        self.free += blocks
        self._lru_count += blocks

    def allocate(self, n: int) -> None:
        """:meth:`KVBlocks.allocate`; when the queue's front unit alone covers the eviction
        (a decode step's few blocks from a full pool, the usual case), it is trimmed here."""
        if n > self.free:
            raise AssertionError(f"allocate({n}) with {self.free} free blocks")
        self.free -= n
        evict = self._lru_count - self.free
        if evict <= 0:
            return
        stamp, item = self.lru[0]
        if stamp in self.unit_runs and stamp not in self._stale_in and item:
            k = item[-1]  # type: ignore[index]  # a unit run is a list
            c = self.size.get(k, 1)
            if c > evict:  # the unit's tail blocks go, as _evict would take them
                self.size[k] = c - evict
                self.evictions += evict
                self._lru_count -= evict
                return
        self._evict(evict)

    def _evict_run(self, stamp: int, item: list[int], n: int) -> int:
        """:meth:`KVBlocks._evict_run`, a run holding units trimmed unit by unit."""
        if stamp not in self.unit_runs:  # single blocks: sliced off in C
            return super()._evict_run(stamp, item, n)
        if stamp in self._stale_in:
            self._live(stamp, item)
        cached, size = self.cached, self.size
        while item and n > 0:
            k = item[-1]
            c = size.get(k, 1)
            if c > n:  # the unit's tail blocks go; its head stays at the front
                size[k] = c - n
                return 0
            item.pop()
            del cached[k]
            size.pop(k, None)
            if k in self.dup_of:
                self._forget_dups([k])
            n -= c
        if not item:
            self.lru.popleft()
            self.unit_runs.discard(stamp)
        return n

    def _compact(self) -> None:
        super()._compact()
        self.unit_runs &= {stamp for stamp, _ in self.lru}
