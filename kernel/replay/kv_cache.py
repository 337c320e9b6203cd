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
* ``cached`` maps a block key to its reference count (how many running requests hold it).

A block key is the request's chained hash for that block (equal keys mean equal token prefixes
up to the block's end) or, for blocks without a known hash, a key private to the request (so
a preempted request can still hit its own blocks when it resumes).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KVBlocks"]


class KVBlocks:
    """The block pool of one engine core (``num_blocks`` usable blocks of ``block_size``)."""

    __slots__ = ("block_size", "cached", "caching", "evictions", "free", "lru", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int, caching: bool):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a KV pool needs > 0 blocks of > 0 tokens, got {num_blocks} "
                             f"blocks of {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.free = num_blocks
        self.cached: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def used(self) -> int:
        return self.num_blocks - self.free

    def longest_hit(self, keys: list[int], max_blocks: int) -> int:
        """Leading blocks of ``keys`` found cached (vLLM ``find_longest_cache_hit``)."""
        if not self.caching:
            return 0
        cached = self.cached
        n = 0
        for key in keys[:max_blocks]:
            if key not in cached:
                break
            n += 1
        return n

    def evictable_among(self, keys: list[int]) -> int:
        """How many of these cached keys nobody holds (a hit on them consumes a free block)."""
        cached = self.cached
        return sum(1 for key in keys if cached[key] == 0)

    def touch(self, keys: list[int]) -> None:
        """A request now holds these cached blocks (vLLM ``BlockPool.touch``)."""
        cached, lru = self.cached, self.lru
        for key in keys:
            ref = cached[key]
            if ref == 0:
                del lru[key]
                self.free -= 1
            cached[key] = ref + 1

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue, evicting cached ones as needed."""
        if n > self.free:
            raise AssertionError(f"allocate({n}) with {self.free} free blocks")
        self.free -= n
        evict = len(self.lru) - self.free
        if evict > 0:
            cached, pop = self.cached, self.lru.popitem
            for _ in range(evict):
                del cached[pop(False)[0]]
            self.evictions += evict

    def register(self, keys: list[int]) -> list[int]:
        """A request's just-filled blocks under ``keys``; returns the keys now cached for it
        (a key already cached stays with its first owner: the request's copy is private and
        is freed unhashed, as vLLM keeps one block per hash)."""
        if not self.caching:
            return []
        cached = self.cached
        new = [key for key in keys if key not in cached]
        if len(new) != len(set(new)):  # a key twice in one request: keep the first
            new = list(dict.fromkeys(new))
        cached.update(dict.fromkeys(new, 1))
        return new

    def release(self, held: int, refs: list[int]) -> None:
        """A finished or preempted request gives back ``held`` blocks, ``refs`` of them
        cached (in block order): private blocks to the front, cached ones to the back of the
        LRU, tail block first."""
        self.free += held - len(refs)
        if not refs:
            return
        cached = self.cached
        last: list[int] = []
        for key in reversed(refs):
            ref = cached[key] - 1
            cached[key] = ref
            if ref == 0:
                last.append(key)
        if last:
            self.lru.update(dict.fromkeys(last))
            self.free += len(last)
