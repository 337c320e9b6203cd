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
  reference count (how many running requests hold it), or, at 0, to minus the stamp of the
  LRU entry it sits in.

The LRU holds one entry per release, not per block: a request's freed shared keys are one
*run* (a list in block order, so the queue's front is its end), evicted by slicing and deleted
from ``cached`` in one C-level pass. A hit takes blocks from the middle of the queue; their
entries are left in place, recognised as stale (the key's value is no longer minus the run's
stamp) and dropped when eviction reaches them or, past a bound, by a compaction.

Blocks beyond a request's known hashes (the rest of its prompt, its outputs) are hashed in
vLLM too, but only that request can ever hit them (after a preemption). They are kept as one
*segment* per request, ``segment[r]`` leading blocks after its shared ones, which sits in the
LRU as one entry (key ``-(r + 1)``) and loses blocks from its tail when evicted, as vLLM's
tail-first order does: the same queue, without a Python operation per block.

A segment stays reachable only through the request's whole shared chain. When a lookup finds
that chain broken (a shared block another request registered first, since evicted: vLLM's
``get_computed_blocks`` stops at the first miss), the segment's blocks keep their hashes and
their place in the queue, as vLLM's do until ``_maybe_evict_cached_block`` takes them; a later
recomputation of those blocks by the request caches its new copies as duplicates of the old
ones. That state is not a count any more, so the request's own
blocks become *explicit* from then on: per-block keys :func:`own_key` (negative, apart from
the shared keys) in ``cached`` like shared ones, the segment's LRU entry turned into a run of
them where it stands (decision KF1).

A full block registered under a key that already has a cached block is cached too, as vLLM
keeps every block of a hash (``block_pool.py: BlockHashToBlockMap``; decision KD1): under a
*duplicate* key of its own (at or past 2**64), listed in ``dups[key]`` in registration order,
freed hashed like any block and removed from the list when evicted. A lookup finds a key
while any of its blocks is cached and a hit takes its first (the key itself, else its oldest
duplicate), as ``get_one_block`` does. Since a request's chain blocks are all hashed and freed
after its segment, no chain can now break before a cached segment (KF1's corner came from
unhashed copies); KF1's handling stays for safety.

The engine uses the subclass :class:`~kernel.replay.kv_units.KVUnits`, whose shared keys may
stand for several blocks (one per hash-chain entry); this class is its per-block reference.
"""

from __future__ import annotations

from collections import deque
from itertools import islice, takewhile

__all__ = ["KVBlocks"]

_SINK: deque[None] = deque(maxlen=0)
_drain = _SINK.extend  # runs an iterator to its end in C, keeping nothing


_DUP_BASE = 1 << 64  # duplicate keys: at or past 2**64, apart from shared and own keys


def own_key(r: int, i: int) -> int:
    """The key of request ``r``'s ``i``-th block past its shared chain, once its own blocks
    are explicit: negative, so apart from every shared key (those are in [0, 2**64))."""
    return -(((r + 1) << 32) + i)


class KVBlocks:
    """The block pool of one engine core (``num_blocks`` usable blocks of ``block_size``)."""

    __slots__ = ("_dup_next", "_lru_count", "_next", "_orphans", "_own", "_stale", "_stale_in",
                 "_stamp", "block_size", "cached", "caching", "dup_of", "dups", "duplicates",
                 "evictions", "explicit", "free", "lru", "num_blocks", "seg_at", "segment")

    def __init__(self, num_blocks: int, block_size: int, caching: bool):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a KV pool needs > 0 blocks of > 0 tokens, got {num_blocks} "
                             f"blocks of {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.free = num_blocks
        self.cached: dict[int, int] = {}  # key -> holders, or -(its LRU run's stamp) if 0
        self.segment: dict[int, int] = {}  # request -> its cached private blocks
        self.seg_at: dict[int, int] = {}  # request -> stamp of its segment's LRU entry
        # the LRU, front first: (stamp, keys in block order, so the front is the list's
        # end) for a released run of shared keys, (stamp, request) for a segment
        self.lru: deque[tuple[int, list[int] | int]] = deque()
        self._stamp = 0
        self._stale_in: dict[int, int] = {}  # run stamp -> its keys touched since
        self._stale = 0  # LRU entries touched since (left in place until reached)
        self._lru_count = 0  # blocks in the LRU: a shared key counts 1, a segment its size
        self.evictions = 0
        # A full block registered under a key already cached is cached too, as vLLM does
        # (decision KD1), under a key of its own: dup_of maps it to the block's key, dups
        # lists a key's duplicates in registration order (a hit takes the key's first block:
        # the key itself if cached, else its oldest duplicate)
        self.duplicates = 0  # such registrations, counted
        self.dup_of: dict[int, int] = {}
        self.dups: dict[int, list[int]] = {}
        self._dup_next = _DUP_BASE
        self.explicit: set[int] = set()  # requests whose own blocks are own_key keys
        self._orphans: dict[int, list[int]] = {}  # segment entry stamp -> its keys now
        self._own: dict[int, list[int]] = {}  # explicit running request -> own keys it holds
        self._next: dict[int, int] = {}  # explicit running request -> its next own block

    def used(self) -> int:
        return self.num_blocks - self.free

    def longest_hit(self, keys: list[int], max_blocks: int, r: int) -> tuple[int, int]:
        """(shared, private) leading blocks found cached (vLLM ``find_longest_cache_hit``):
        the request's shared keys, then, when all of them hit, its own segment."""
        if not self.caching:
            return 0, 0
        head = islice(keys, max_blocks) if max_blocks >= 0 else keys[:max_blocks]
        n = len(list(takewhile(self._known if self.dups else self.cached.__contains__, head)))
        return n, self._private_hit(r, n == len(keys), max_blocks - n)

    def _private_hit(self, r: int, whole: bool, room: int) -> int:
        """The request's own blocks found cached after its shared ones (at most ``room``):
        reachable only when its whole shared chain hit (``whole``)."""
        seg = self.segment.get(r, 0)
        if not seg:
            if self.explicit and whole and r in self.explicit:
                return self._own_hit(r, room)
            return 0
        if not whole:  # the chain is broken before the segment: it stays as it is in
            self._make_explicit(r)  # the queue, block by block (KF1)
            return 0
        return min(seg, room)

    def _own_hit(self, r: int, room: int) -> int:
        """Leading own blocks of an explicit request found cached (at most ``room``)."""
        known, i = self._known, 0
        while i < room and known(own_key(r, i)):
            i += 1
        return i

    def _known(self, key: int) -> bool:
        """Some block is cached under ``key`` (itself or a duplicate)."""
        return key in self.cached or key in self.dups

    def _first(self, key: int) -> int:
        """The key of ``key``'s first cached block (vLLM ``get_one_block``)."""
        return key if key in self.cached else self.dups[key][0]

    def _register_key(self, key: int) -> int:
        """A full block under ``key`` joins the cache, held once; returns its key: ``key``,
        or a duplicate key when a block is already cached under it (decision KD1)."""
        if key in self.cached or key in self.dups:
            return self._new_dup(key)
        self.cached[key] = 1
        return key

    def _new_dup(self, key: int) -> int:
        """A block registered under ``key`` while another is cached: its own key, held once."""
        d = self._dup_next
        self._dup_next = d + 1
        self.dup_of[d] = key
        self.dups.setdefault(key, []).append(d)
        self.cached[d] = 1
        self.duplicates += 1
        return d

    def _forget_dups(self, gone: list[int]) -> None:
        """Evicted keys that were duplicates leave their key's list."""
        dup_of, dups = self.dup_of, self.dups
        for d in gone:
            key = dup_of.pop(d, None)
            if key is not None:
                left = dups[key]
                left.remove(d)
                if not left:
                    del dups[key]

    def _make_explicit(self, r: int) -> None:
        """A waiting request's segment (in the LRU) becomes its per-block own keys, hashed
        and queued where the segment is; the request's own blocks stay explicit."""
        seg = self.segment.pop(r)
        stamp = self.seg_at.pop(r, None)
        if stamp is None:
            raise AssertionError(f"request {r} looked up while holding its segment")
        keys = [own_key(r, i) for i in range(seg)]
        self.cached.update(dict.fromkeys(keys, -stamp))
        self._orphans[stamp] = keys  # the entry (stamp, r) is read as this run
        self.explicit.add(r)

    def _touch_own(self, r: int, private: int) -> None:
        """An explicit request holds its leading ``private`` own blocks again (all queued:
        only it can hold them)."""
        cached, stale_in = self.cached, self._stale_in
        own = [own_key(r, i) for i in range(private)]
        if self.dups:
            own = list(map(self._first, own))
        for key in own:
            stamp = -cached[key]
            stale_in[stamp] = stale_in.get(stamp, 0) + 1
            cached[key] = 1
        self._stale += private
        self.free -= private
        self._lru_count -= private
        self._own[r] = own
        self._next[r] = private

    def evictable_among(self, keys: list[int], r: int, private: int) -> int:
        """Blocks of a hit nobody holds (a hit on them consumes a free block)."""
        cached = self.cached
        if self.dups:
            keys = list(map(self._first, keys))
        # the keys at minus a stamp (in the queue): counted in C, no generator
        return sum(map((0).__gt__, map(cached.__getitem__, keys))) + private

    def touch(self, keys: list[int], r: int, private: int) -> list[int]:
        """A request now holds these cached blocks (vLLM ``BlockPool.touch``); returns the
        keys it holds (a key's first block: the key, or its oldest duplicate). Their LRU
        entries stay where they are, marked stale by the key's new count."""
        cached, stale_in = self.cached, self._stale_in
        if self.dups:
            keys = list(map(self._first, keys))
        for key in keys:
            ref = cached[key]
            if ref < 0:
                stale_in[-ref] = stale_in.get(-ref, 0) + 1
                self._stale += 1
                self.free -= 1
                self._lru_count -= 1
                cached[key] = 1
            else:
                cached[key] = ref + 1
        if private:
            self._touch_private(r, private)
        if self._stale > 2 * self.num_blocks + 64:  # bound the memory of stale entries
            self._compact()
        return keys

    def _live(self, stamp: int, run: list[int]) -> None:
        """Drop the keys of a run that were touched since it joined the LRU."""
        run[:] = [key for key in run if self.cached.get(key) == -stamp]
        self._stale -= self._stale_in.pop(stamp)

    def _compact(self) -> None:
        seg_at, stale_in = self.seg_at, self._stale_in
        kept: deque[tuple[int, list[int] | int]] = deque()
        for entry in self.lru:
            stamp, item = entry
            if isinstance(item, int):
                if seg_at.get(item) == stamp:
                    kept.append(entry)
                    continue
                orphan = self._orphans.pop(stamp, None)
                if orphan is None:
                    self._stale -= 1
                    continue
                entry = (stamp, orphan)  # a segment made explicit: a run from now on
                item = orphan
            if stamp in stale_in:
                self._live(stamp, item)
            if item:
                kept.append(entry)
        self.lru = kept

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue, evicting cached ones as needed."""
        if n > self.free:
            raise AssertionError(f"allocate({n}) with {self.free} free blocks")
        self.free -= n
        evict = self._lru_count - self.free  # the unhashed blocks ran out: evict the rest
        if evict > 0:
            self._evict(evict)

    def _evict(self, n: int) -> None:
        """Take ``n`` cached blocks from the queue's front, entry by entry."""
        self.evictions += n
        self._lru_count -= n
        lru = self.lru
        while n > 0:
            stamp, item = lru[0]
            if isinstance(item, int):
                n = self._evict_segment(stamp, item, n)
            else:
                n = self._evict_run(stamp, item, n)

    def _evict_segment(self, stamp: int, r: int, n: int) -> int:
        """Evict up to ``n`` blocks of the front entry, request ``r``'s segment (its tail
        first); returns how many are still to evict."""
        segment, seg_at = self.segment, self.seg_at
        if seg_at.get(r) != stamp:  # touched since: not in the queue any more
            orphan = self._orphans.pop(stamp, None)
            if orphan is not None:  # or made explicit: a run in its place
                self.lru[0] = (stamp, orphan)
                return n
            self.lru.popleft()
            self._stale -= 1
            return n
        seg = segment[r]
        if seg > n:  # the tail alone: the head stays at the front
            segment[r] = seg - n
            return 0
        del segment[r], seg_at[r]
        self.lru.popleft()
        return n - seg

    def _evict_run(self, stamp: int, item: list[int], n: int) -> int:
        """Evict up to ``n`` blocks of the front entry, a run of keys (its end is the queue's
        front); returns how many are still to evict."""
        if stamp in self._stale_in:
            self._live(stamp, item)
        cached = self.cached
        m = len(item)
        if m > n:  # the run's front part (its tail blocks) goes
            gone = item[m - n:]
            del item[m - n:]
            _drain(map(cached.__delitem__, gone))
            if self.dup_of and not self.dup_of.keys().isdisjoint(gone):
                self._forget_dups(gone)
            return 0
        _drain(map(cached.__delitem__, item))
        if self.dup_of and not self.dup_of.keys().isdisjoint(item):
            self._forget_dups(item)
        self.lru.popleft()
        return n - m

    def register(self, keys: list[int]) -> list[int]:
        """A request's just-filled shared blocks under ``keys``; returns the keys now cached
        for it. A key that already has a block gets a duplicate key for this one: vLLM
        caches every full block (``vllm/v1/core/block_pool.py: BlockHashToBlockMap``,
        NOTE #1: no de-duplication; a hit takes the hash's first block), so the copy is
        freed hashed, to the queue's back, like any other (decision KD1)."""
        if not self.caching:
            return []
        cached = self.cached
        if cached.keys().isdisjoint(keys) and (not self.dups or self.dups.keys().isdisjoint(keys)):
            new = dict.fromkeys(keys, 1)
            if len(new) == len(keys):  # no key twice (chained hashes): the usual case
                cached.update(new)
                return keys
        return list(map(self._register_key, keys))

    def register_private(self, r: int, n: int) -> None:
        """``n`` more of the request's own blocks are full and hashed (an explicit request's
        under their own keys, except those whose key is still cached from before)."""
        if not self.caching or n <= 0:
            return
        if r not in self.explicit:
            self.segment[r] = self.segment.get(r, 0) + n
            return
        i = self._next.get(r, 0)
        self._next[r] = i + n
        # (a recomputed copy of a block still cached (KF1) is a duplicate)
        own = self._own.setdefault(r, [])
        own += [self._register_key(own_key(r, j)) for j in range(i, i + n)]

    def _take_own(self, r: int) -> list[int]:
        """An explicit request's held own keys, forgotten as it stops running."""
        self._next.pop(r, None)
        return self._own.pop(r, [])

    def _touch_private(self, r: int, private: int) -> None:
        """Request ``r`` holds ``private`` of its own cached blocks again: its segment leaves
        the queue (its LRU entry goes stale), or an explicit request's own keys are held."""
        if r in self.explicit:
            self._touch_own(r, private)
            return
        seg = self.segment[r]
        del self.seg_at[r]
        self._stale += 1
        self._lru_count -= seg
        self.free -= private
        if private < seg:  # never from the engine (a resumed request knows a token
            # past its full blocks, so its whole segment is within the hit limit); if it
            # happened, the blocks not hit would lose their hashes here
            self.segment[r] = private

    def _queue_segment(self, r: int) -> None:
        """Request ``r``'s segment, if it has one, joins the queue's back as one entry (its
        blocks are already counted free)."""
        seg = self.segment.get(r, 0)
        if seg:
            self._stamp += 1
            self.seg_at[r] = self._stamp
            self.lru.append((self._stamp, r))
            self._lru_count += seg

    def release(self, held: int, refs: list[int], r: int) -> None:
        """A finished or preempted request gives back ``held`` blocks: its unhashed ones to
        the front of the free queue, its segment then its shared ``refs`` (block order) to
        the back, tail first."""
        if self._own and r in self._own:  # an explicit request: its own keys are the tail
            refs = refs + self._take_own(r)
        self.free += held - len(refs)
        self._queue_segment(r)
        if not refs:
            return
        cached = self.cached
        self._stamp += 1
        stamp = self._stamp
        holders = list(map(cached.__getitem__, refs))
        ones = holders.count(1)
        if ones == len(holders):  # the usual case: nobody else holds them
            run = list(refs)
            cached.update(dict.fromkeys(run, -stamp))
        else:
            # Keys others hold too are usually a leading part (a shared prefix): when the
            # keys only this request holds are exactly the tail, that tail joins the queue
            # whole and the per-key loop runs over the leading part alone. A key held once
            # appears once in refs, so the tail's keys all reach 0 here.
            cut = len(refs) - ones
            tail = refs[cut:] if ones and holders[cut:].count(1) == ones else []
            if not tail:
                cut = len(refs)
            last: list[int] = []
            for key in reversed(refs[:cut]):
                ref = cached[key] - 1
                if ref:
                    cached[key] = ref
                else:
                    cached[key] = -stamp
                    last.append(key)
            if tail:
                cached.update(dict.fromkeys(tail, -stamp))
                last.reverse()
                run = last + tail
            elif not last:
                return
            else:
                run = last[::-1]
        self.lru.append((stamp, run))
        self.free += len(run)
        self._lru_count += len(run)
