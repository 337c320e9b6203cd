"""The replay's KV pool against a literal model of vLLM's block pool.

The reference below keeps real block ids in one free queue, as
``vllm/v1/core/kv_cache_utils.py: FreeKVCacheBlockQueue`` and ``block_pool.py: BlockPool``
do: new blocks from the front (evicting their hash), a freed request's blocks tail first,
unhashed ones to the front and hashed ones to the back, every full block hashed (a request's
blocks beyond its shared chain under keys only it has). :class:`KVBlocks` keeps counts, shared
keys and one segment per request instead; driven by the same random operations, both must
agree on every hit and every free count.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernel.replay.kv_cache import KVBlocks, own_key


class RefPool:
    def __init__(self, n: int):
        self.queue = list(range(n))
        self.hash: dict[int, object] = {}
        # every block of a key, in registration order (vLLM's BlockHashToBlockMap: no
        # de-duplication, a hit takes the first)
        self.by_key: dict[object, list[int]] = {}
        self.ref = [0] * n
        self.duplicates = 0  # full blocks whose key another block already has

    def free(self) -> int:
        return len(self.queue)

    def lookup(self, keys: list[object], max_blocks: int) -> list[int]:
        out = []
        for key in keys[:max_blocks]:
            blocks = self.by_key.get(key)
            if not blocks:
                break
            out.append(blocks[0])
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        got, self.queue = self.queue[:n], self.queue[n:]
        for b in got:
            key = self.hash.pop(b, None)
            if key is not None:  # evicted: it leaves its key's list
                self.by_key[key].remove(b)
                if not self.by_key[key]:
                    del self.by_key[key]
            self.ref[b] = 1
        return got

    def register(self, b: int, key: object) -> None:
        blocks = self.by_key.setdefault(key, [])
        if blocks:
            self.duplicates += 1
        blocks.append(b)
        self.hash[b] = key

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.hash:
                    self.queue.append(b)
                else:
                    self.queue.insert(0, b)


def assert_hashed_as_literal(cached: set[int], segment: dict[int, int], ref: RefPool,
                             n_shared: list[int], dup_of: dict[int, int]) -> None:
    """The pool's hashed blocks are the literal model's, block for block: how many blocks
    each shared key has (itself and its duplicates), and per request its own blocks (a
    segment's leading count, or explicit own keys and their duplicates)."""
    per_key = Counter(dup_of.get(k, k) for k in cached)
    assert {k: n for k, n in per_key.items() if k >= 0} == {
        k: len(v) for k, v in ref.by_key.items() if isinstance(k, int)}
    mine = Counter((r, i) for r, seg in segment.items() for i in range(seg))
    for k, n in per_key.items():
        if k < 0:
            r, i = (-k >> 32) - 1, -k & 0xFFFFFFFF
            assert own_key(r, i) == k
            mine[(r, i)] += n
    assert mine == Counter({(k[1], k[2] - n_shared[k[1]]): len(v)
                            for k, v in ref.by_key.items() if isinstance(k, tuple)})


@st.composite
def scripts(draw):
    n_req = draw(st.integers(1, 6))
    shapes = []
    for _r in range(n_req):
        group = draw(st.integers(0, 2))
        shared = draw(st.integers(0, 5))
        total = draw(st.integers(max(shared, 1), 9))
        shapes.append((group, shared, total))
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "grow", "release"]),
                                  st.integers(0, n_req - 1), st.integers(1, 9)), max_size=80))
    return draw(st.integers(4, 20)), shapes, ops


@settings(max_examples=400, deadline=None)
@given(scripts())
# a hit leaves its keys' entries stale in the LRU; eviction then reaches them (must skip
# them) before valid blocks behind them
@example((6, [(0, 2, 3), (0, 2, 3), (1, 2, 3), (2, 0, 3), (1, 2, 3)],
          [("admit", 0, 3), ("release", 0, 1), ("admit", 2, 3), ("release", 2, 1),
           ("admit", 1, 3), ("admit", 3, 3), ("release", 1, 1), ("admit", 4, 3)]))
# KB6's corner (decision KF1): request 1 registers key 0 as a copy (request 0 has it) and
# grows into its own blocks 1, 2; request 0 is preempted and request 2 evicts its key 0;
# request 1 is preempted: its own blocks are cached behind a broken chain and stay hashed in
# their place, not unhashed blocks at the queue's front. Request 4's copies of request 3's
# keys give unhashed blocks, so request 1, resumed, recomputes key 0 and its own blocks
# (copies of 1, 2, unhashed; a new 3) without evicting them; preempted again, request 5
# evicts the old block 2 first (older than the new 3): request 1 hits key 0 and block 1
@example((10, [(0, 1, 1), (0, 1, 6), (2, 0, 6), (1, 3, 3), (1, 3, 3), (2, 0, 4)],
          [("admit", 0, 1), ("admit", 1, 1), ("grow", 1, 1), ("grow", 1, 1), ("admit", 3, 3),
           ("admit", 4, 1), ("grow", 4, 1), ("grow", 4, 1), ("release", 0, 1),
           ("admit", 2, 1), ("release", 1, 1), ("release", 4, 1), ("admit", 1, 4),
           ("release", 1, 1), ("admit", 5, 3), ("admit", 1, 5), ("grow", 1, 1),
           ("release", 1, 1), ("release", 2, 1), ("release", 3, 1), ("admit", 2, 9)]))
# two duplicates of key 0 queued around key 200 (decision KD1): once key 0's first block is
# evicted a hit takes the older duplicate, and the next allocation evicts key 200, not the
# other duplicate
@example((8, [(0, 1, 1), (0, 1, 1), (0, 1, 1), (1, 0, 5), (0, 1, 2), (2, 1, 1)],
          [("admit", 0, 1), ("admit", 1, 1), ("admit", 5, 1), ("admit", 2, 1),
           ("release", 0, 1), ("release", 1, 1), ("release", 5, 1), ("release", 2, 1),
           ("admit", 3, 5), ("admit", 4, 2)]))
# a duplicate of key 1 evicted from the front part of its release's run, after key 1's
# first block: key 1 is gone, so a lookup stops before it
@example((6, [(0, 2, 2), (0, 2, 2), (0, 0, 0), (1, 0, 5), (0, 2, 3)],
          [("admit", 0, 2), ("admit", 1, 2), ("release", 0, 1), ("release", 1, 1),
           ("admit", 3, 5), ("release", 3, 1), ("admit", 4, 3)]))
# the same with the duplicate alone in its run (evicted whole)
@example((6, [(0, 1, 1), (0, 1, 1), (0, 0, 1), (1, 0, 6), (0, 1, 2)],
          [("admit", 0, 1), ("admit", 1, 1), ("release", 0, 1), ("release", 1, 1),
           ("admit", 3, 6), ("release", 3, 1), ("admit", 4, 2)]))
def test_kv_blocks_agree_with_the_literal_block_pool(script):
    n_blocks, shapes, ops = script
    ref, kv = RefPool(n_blocks), KVBlocks(n_blocks, 16, True)
    ref_blocks: dict[int, list[int]] = {}
    mine: dict[int, tuple[int, list[int], int]] = {}  # r -> (held, refs, registered)
    grown = {r: 0 for r in range(len(shapes))}
    for op, r, size in ops:
        group, n_shared, total = shapes[r]
        shared = [100 * group + j for j in range(n_shared)]  # keys are non-negative ints
        keys_ref: list[object] = [*shared, *(("p", r, j) for j in range(n_shared, total))]
        running = r in ref_blocks
        if op == "admit" and not running:
            # A resumed request knows at least one token past its full blocks (the engine
            # preempts only between a token's sampling and its computation), so its blocks
            # can all be hit under the num_tokens - 1 limit.
            if grown[r] >= total:
                continue
            cur = min(total, max(size, grown[r] + 1))
            hit_ref = ref.lookup(keys_ref, cur - 1)
            sh, pv = kv.longest_hit(shared, cur - 1, r)
            assert sh + pv == len(hit_ref)
            evictable = sum(1 for b in hit_ref if ref.ref[b] == 0)
            assert kv.evictable_among(shared[:sh], r, pv) == evictable
            if cur - len(hit_ref) + evictable > ref.free():
                continue
            ref.touch(hit_ref)
            new = ref.allocate(cur - len(hit_ref))
            blocks = hit_ref + new
            for j in range(len(hit_ref), cur):
                ref.register(blocks[j], keys_ref[j])
            ref_blocks[r] = blocks
            hit = sh + pv
            refs = kv.touch(shared[:sh], r, pv)
            kv.allocate(cur - hit)
            refs.extend(kv.register(shared[hit:min(cur, n_shared)]))
            kv.register_private(r, cur - max(hit, n_shared))
            mine[r] = (cur, refs, cur)
        elif op == "grow" and running:
            held, refs, reg = mine[r]
            if held >= total or ref.free() == 0:
                continue
            b = ref.allocate(1)[0]
            ref.register(b, keys_ref[held])
            ref_blocks[r].append(b)
            kv.allocate(1)
            if held < n_shared:
                refs.extend(kv.register(shared[held:held + 1]))
            else:
                kv.register_private(r, 1)
            mine[r] = (held + 1, refs, held + 1)
        elif op == "release" and running:
            ref.release(ref_blocks.pop(r))
            held, refs, _reg = mine.pop(r)
            kv.release(held, refs, r)
            grown[r] = max(grown[r], held)  # a resumed request is at least this long
        assert kv.free == ref.free(), (op, r)
        assert kv.duplicates == ref.duplicates, (op, r)
        assert_hashed_as_literal(set(kv.cached), kv.segment, ref, [s[1] for s in shapes],
                                 kv.dup_of)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=12), st.sampled_from([1, 8, 16, 24, 512]),
       st.sampled_from([16, 32, 256]), st.integers(0, 300))
def test_block_keys_follow_the_chain(hashes, hash_tokens, block_size, n_blocks):
    # Engine block j (tokens [0, (j+1)B)) takes the first chain entry covering it: the entry
    # itself when B is a multiple of H (the chain is exact), else that entry mixed with j
    # (mod 2^64); only blocks the chain covers get a key.
    from kernel.replay.block_keys import block_keys

    mix, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
    upto = min(len(hashes) * hash_tokens // block_size, n_blocks)
    want = []
    for j in range(upto):
        entry = hashes[-(-(j + 1) * block_size // hash_tokens) - 1]
        want.append(entry if block_size % hash_tokens == 0 else (entry * mix + j) & mask)
    assert block_keys(hashes, hash_tokens, block_size, n_blocks) == want


def compact_after_every(monkeypatch, cls: type, touch_name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Make ``cls``'s touch method compact the LRU after every call (checking that nothing
    stale is left); returns the stale entry counts each compaction found, filled as it runs."""
    touch = getattr(cls, touch_name)
    compactions: list[int] = []

    def touch_then_compact(self, *args):  # type: ignore[no-untyped-def]
        out = touch(self, *args)
        compactions.append(self._stale)
        self._compact()
        assert self._stale == 0 and not self._stale_in
        return out

    monkeypatch.setattr(cls, touch_name, touch_then_compact)
    return compactions


def test_kv_blocks_agree_when_stale_entries_are_compacted_at_every_touch(monkeypatch):
    # Touched blocks leave stale entries in the LRU, dropped when eviction reaches them or,
    # past a bound, by a compaction; compacting after every touch must change nothing.
    compactions = compact_after_every(monkeypatch, KVBlocks, "touch")
    test_kv_blocks_agree_with_the_literal_block_pool()
    assert any(compactions)  # some touch did leave stale entries to compact


def _eviction_order(kv: KVBlocks) -> list[int]:
    """Use up the unhashed free blocks, then allocate one block at a time: the shared keys
    in the order the pool evicts them."""
    kv.allocate(kv.free - kv._lru_count)
    order = []
    while kv.free:
        before = set(kv.cached)
        kv.allocate(1)
        order.extend(before - set(kv.cached))
    return order


@pytest.mark.parametrize(("other", "expected"), [
    # the other request holds a leading part: a's own keys (the tail) are queued first,
    # tail block first, then b's when it finishes (vLLM frees a request's blocks tail first)
    ([1, 2], [4, 3, 2, 1]),
    # it holds keys around one only a holds: a's key 2 is queued alone, then b's 4, 3, 1
    ([1, 3, 4], [2, 4, 3, 1]),
    # nobody else: the whole run at once
    ([], [4, 3, 2, 1]),
])
def test_release_queues_the_keys_whose_last_holder_leaves_tail_first(other, expected):
    kv = KVBlocks(16, 16, True)
    kv.allocate(4)
    refs_a = kv.register([1, 2, 3, 4])
    kv.touch(other, 99, 0)  # request 99 holds these blocks too
    kv.release(4, refs_a, 0)
    assert {k for k, v in kv.cached.items() if v > 0} == set(other)
    kv.release(len(other), list(other), 99)
    assert kv.free == 16
    assert _eviction_order(kv) == expected


def test_a_second_block_of_a_key_is_cached_too_and_hit_once_the_first_is_evicted():
    # Two requests fill the same two shared blocks in one step (neither could hit the
    # other's). As in vLLM (BlockHashToBlockMap keeps both), the second's copies are cached
    # under duplicate keys, freed hashed to the queue's back in release order, evicted in
    # LRU order, and a hit takes a key's first block still cached.
    kv, ref = KVBlocks(6, 16, True), RefPool(6)
    first, second = ref.allocate(2), ref.allocate(2)
    for blocks in (first, second):
        for b, key in zip(blocks, [1, 2], strict=True):
            ref.register(b, key)
    kv.allocate(4)
    assert kv.register([1, 2]) == [1, 2]
    copies = kv.register([1, 2])
    assert [kv.dup_of[d] for d in copies] == [1, 2] and kv.duplicates == ref.duplicates == 2
    assert kv.longest_hit([1, 2], 2, 7) == (2, 0) and kv.touch([1, 2], 7, 0) == [1, 2]
    kv.release(2, [1, 2], 7)
    ref.release(first)  # the first holder and the hit's holder let go of the keys' blocks
    ref.release(first)
    kv.release(2, [1, 2], 0)
    ref.release(second)
    kv.release(2, copies, 1)
    # the literal queue: never-used blocks, then each release's blocks tail first
    assert ref.queue == [4, 5, first[1], first[0], second[1], second[0]]
    assert kv.free == ref.free() == 6
    kv.allocate(4)
    ref.allocate(4)  # evicts the first blocks of keys 2 and 1
    assert ref.lookup([1, 2], 2) == second and kv.longest_hit([1, 2], 2, 8) == (2, 0)
    assert kv.evictable_among([1, 2], 8, 0) == 2
    assert kv.touch([1, 2], 8, 0) == copies
    assert kv.free == 0 and set(kv.cached) == set(copies)
    assert kv.dups == {1: [copies[0]], 2: [copies[1]]}
