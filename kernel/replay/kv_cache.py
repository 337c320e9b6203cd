"""One engine core's KV block pool with prefix caching, as vLLM v1's BlockPool keeps it.

Only counts and hashes matter to timing, so blocks have no identity here:

* ``free`` counts blocks no running request holds: never-hashed blocks plus cached blocks
  whose reference count fell to 0 (vLLM's free queue holds both);
* vLLM's free queue (``vllm/v1/core/kv_cache_utils.py: FreeKVCacheBlockQueue``) takes new
  blocks from its front; freed blocks without a hash go to the front and hashed ones to the
  back, tail block first (``block_pool.py: BlockPool.free_blocks``,
  ``single_type_kv_cache_manager.py: SingleTypeKVCacheManager.free``). So the queue is always
  [unhashed blocks..., hashed blocks in LRU order] and allocation evicts cached blocks only
  once the unhashed ones are used up: ``lru`` is that hashed suffix, front first;
* ``cached`` maps a shared block key (a request's chained prefix hash for that block) to its
  reference count (how many running requests hold it).

Blocks beyond a request's known hashes (the rest of its prompt, its outputs) are hashed in
vLLM too, but only that request can ever hit them (after a preemption). They are kept as one
*segment* per request, ``segment[r]`` leading blocks after its shared ones, which sits in the
LRU as one entry (key ``-(r + 1)``) and loses blocks from its tail when evicted, as vLLM's
tail-first order does: the same queue, without a Python operation per block.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KVBlocks"]


class KVBlocks:
    """The block pool of one engine core (``num_blocks`` usable blocks of ``block_size``)."""

    __slots__ = ("_lru_count", "block_size", "cached", "caching", "evictions", "free", "lru",
                 "num_blocks", "segment")

    def __init__(self, num_blocks: int, block_size: int, caching: bool):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a KV pool needs > 0 blocks of > 0 tokens, got {num_blocks} "
                             f"blocks of {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.free = num_blocks
        self.cached: dict[int, int] = {}
        self.segment: dict[int, int] = {}  # request -> its cached private blocks
        self.lru: OrderedDict[int, None] = OrderedDict()
        self._lru_count = 0  # blocks in the LRU: a shared key counts 1, a segment its size
        self.evictions = 0

    def used(self) -> int:
        return self.num_blocks - self.free

    def longest_hit(self, keys: list[int], max_blocks: int, r: int) -> tuple[int, int]:
        """(shared, private) leading blocks found cached (vLLM ``find_longest_cache_hit``):
        the request's shared keys, then, when all of them hit, its own segment."""
        if not self.caching:
            return 0, 0
        cached = self.cached
        n = 0
        for key in keys[:max_blocks]:
            if key not in cached:
                break
            n += 1
        seg = self.segment.get(r, 0)
        if not seg:
            return n, 0
        if n < len(keys):  # the segment is unreachable (never the case with tail-first
            self._drop_segment(r)  # eviction, kept for safety): forget its hashes
            return n, 0
        return n, min(seg, max_blocks - n)

    def _drop_segment(self, r: int) -> None:
        """A waiting request's segment (in the LRU) loses its hashes: anonymous free blocks."""
        seg = self.segment.pop(r, 0)
        if self.lru.pop(-(r + 1), 0) is None:
            self._lru_count -= seg

    def evictable_among(self, keys: list[int], r: int, private: int) -> int:
        """Blocks of a hit nobody holds (a hit on them consumes a free block)."""
        cached = self.cached
        return sum(1 for key in keys if cached[key] == 0) + private

    def touch(self, keys: list[int], r: int, private: int) -> None:
        """A request now holds these cached blocks (vLLM ``BlockPool.touch``)."""
        cached, lru = self.cached, self.lru
        for key in keys:
            ref = cached[key]
            if ref == 0:
                del lru[key]
                self.free -= 1
                self._lru_count -= 1
            cached[key] = ref + 1
        if private:
            seg = self.segment[r]
            del lru[-(r + 1)]
            self._lru_count -= seg
            self.free -= private
            if private < seg:  # never from the engine (a resumed request knows a token
                # past its full blocks, so its whole segment is within the hit limit); if it
                # happened, the blocks not hit would lose their hashes here
                self.segment[r] = private

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue, evicting cached ones as needed."""
        if n > self.free:
            raise AssertionError(f"allocate({n}) with {self.free} free blocks")
        self.free -= n
        evict = self._lru_count - self.free  # the unhashed blocks ran out: evict the rest
        if evict > 0:
            self._evict(evict)

    def _evict(self, n: int) -> None:
        cached, segment, lru = self.cached, self.segment, self.lru
        pop = lru.popitem
        self.evictions += n
        self._lru_count -= n
        key = next(iter(lru))
        if key < 0 and segment[-key - 1] > n:  # the LRU segment's tail alone: it stays first
            segment[-key - 1] -= n
            return
        while n > 0:
            key = pop(False)[0]
            if key >= 0:
                del cached[key]
                n -= 1
                continue
            r = -key - 1
            seg = segment[r]
            take = min(seg, n)
            n -= take
            if take == seg:
                del segment[r]
            else:  # the segment's tail went; its head stays at the front
                segment[r] = seg - take
                lru[key] = None
                lru.move_to_end(key, last=False)

    def register(self, keys: list[int]) -> list[int]:
        """A request's just-filled shared blocks under ``keys``; returns the keys now cached
        for it (a key already cached stays with its first owner: the request's copy is
        private and is freed unhashed, as vLLM keeps one block per hash)."""
        if not self.caching:
            return []
        cached = self.cached
        new = [key for key in keys if key not in cached]
        if len(new) != len(set(new)):  # a key twice in one request: keep the first
            new = list(dict.fromkeys(new))
        cached.update(dict.fromkeys(new, 1))
        return new

    def register_private(self, r: int, n: int) -> None:
        """``n`` more of the request's own blocks are full and hashed."""
        if self.caching and n > 0:
            self.segment[r] = self.segment.get(r, 0) + n

    def release(self, held: int, refs: list[int], r: int) -> None:
        """A finished or preempted request gives back ``held`` blocks: its unhashed ones to
        the front of the free queue, its segment then its shared ``refs`` (block order) to
        the back, tail first."""
        seg = self.segment.get(r, 0)
        self.free += held - len(refs) - seg
        if seg:
            self.lru[-(r + 1)] = None
            self.free += seg
            self._lru_count += seg
        if not refs:
            return
        cached = self.cached
        last: list[int] = []
        add = last.append
        for key in reversed(refs):
            ref = cached[key] - 1
            cached[key] = ref
            if not ref:
                add(key)
        if last:
            self.lru.update(dict.fromkeys(last))
            self.free += len(last)
            self._lru_count += len(last)
