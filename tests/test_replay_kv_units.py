"""The unit KV pool (:class:`KVUnits`) against the literal model of vLLM's block pool.

Same reference as ``tests/test_replay_kv_cache.py`` (real block ids in one free queue, as
``vllm/v1/core/kv_cache_utils.py: FreeKVCacheBlockQueue`` and ``block_pool.py: BlockPool``),
with chains whose entries cover several engine blocks: a unit of up to four blocks, cut
short at a request's end (so requests of one prefix group hit parts of a unit), registered
whole, a block at a time or a few at once, partly evicted from its tail, hit while queued or
held, and registered by two requests at once (a block's first owner keeps it).

The per-block pool (:class:`KVBlocks`, the representation the units replace, itself checked
against the literal model there) is driven block by block alongside: the unit pool must
agree with it on every hit, evictable count, free count, cached block, segment and eviction
count, at every step, which is what keeps a replay's outputs byte for byte. Both must agree
with the literal model at every step too: hits, evictable counts, free counts and every
hashed block, shared or a request's own, including the corner where a preempted request's
chain lost a block from the middle (a block another request registered first, since
evicted), so that its segment cannot be reached and stays hashed in its place in the queue
(decision KF1; before it, the pools freed such a segment as unhashed blocks).
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.replay.block_keys import block_units
from kernel.replay.kv_cache import KVBlocks
from kernel.replay.kv_units import KVUnits
from tests.test_replay_kv_cache import RefPool, assert_hashed_as_literal, compact_after_every


def _cached_blocks(kv: KVUnits) -> set[int]:
    """Every shared block the unit pool has cached, one key per block."""
    return {k + j for k in kv.cached for j in range(kv.size.get(k, 1))}


@st.composite
def scripts(draw):
    groups = [draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)) for _ in range(3)]
    n_req = draw(st.integers(1, 6))
    shapes = []
    for _r in range(n_req):
        g = draw(st.integers(0, 2))
        shared = draw(st.integers(0, sum(groups[g])))
        total = draw(st.integers(max(shared, 1), shared + 4))
        shapes.append((g, shared, total))
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "grow", "release"]),
                                  st.integers(0, n_req - 1), st.integers(1, 9)), max_size=80))
    return draw(st.integers(4, 24)), groups, shapes, ops


@st.composite
def corner_scripts(draw):
    """Scripts that started in KB6's corner (decision KF1) while a copy was unhashed, then go
    on at random: request 1 registers its chain's first block as a copy (request 0
    registered it first), grows into its own blocks, requests 0 then 1 are preempted, and
    request 2 takes the free blocks up to request 0's first block, evicting it. With the
    copy cached as a duplicate (KD1), request 1's chain stays whole."""
    n_blocks, groups, shapes, ops = draw(scripts())
    shared = draw(st.integers(1, sum(groups[0])))  # request 1's shared blocks
    own = draw(st.integers(1, 3))  # its own blocks before the preemption
    total = shared + own + draw(st.integers(1, 3))
    held = shared + own
    n_blocks = max(n_blocks, held + 1)
    take = n_blocks - held + 1  # the unhashed blocks, then request 0's block
    shapes = [(0, 1, 1), (0, shared, total), (1, 0, take + draw(st.integers(0, 3))),
              *shapes[3:]]
    prelude = [("admit", 0, 1), ("admit", 1, 1), *[("grow", 1, 3)] * (held - 1),
               ("release", 0, 1), ("release", 1, 1), ("admit", 2, take), ("admit", 1, 9)]
    return n_blocks, groups, shapes, prelude + ops


def _chain(units: list[int], g: int, n_shared: int) -> tuple[list[int], list[int], list[int]]:
    """A request's chain: its group's units (key 1000 g + 10 i, i-th unit) cut at n_shared."""
    keys, sizes, left = [], [], n_shared
    for i, m in enumerate(units):
        if left <= 0:
            break
        keys.append(1000 * g + 10 * i)
        sizes.append(min(m, left))
        left -= sizes[-1]
    return keys, sizes, list(accumulate(sizes))


def _drive(script) -> tuple[int, bool]:  # type: ignore[no-untyped-def]
    """Run a script on the three pools, asserting agreement at every step; (the steps run,
    whether some request's own blocks became explicit)."""
    n_blocks, groups, shapes, ops = script
    ref, kv, old = RefPool(n_blocks), KVUnits(n_blocks, 16, True), KVBlocks(n_blocks, 16, True)
    old_refs: dict[int, list[int]] = {}
    steps = 0
    ref_blocks: dict[int, list[int]] = {}  # the literal model's blocks per request
    mine: dict[int, tuple[int, tuple[list[int], list[int]]]] = {}  # r -> (held, refs)
    grown = {r: 0 for r in range(len(shapes))}
    for op, r, size in ops:
        g, n_shared, total = shapes[r]
        chain = _chain(groups[g], g, n_shared)
        shared = [k + j for k, m in zip(chain[0], chain[1], strict=True) for j in range(m)]
        keys_ref: list[object] = [*shared, *(("p", r, j) for j in range(n_shared, total))]
        if op == "admit" and r not in mine:
            if grown[r] >= total:
                continue
            cur = min(total, max(size, grown[r] + 1))
            sh, pv = kv.hit_units(chain, cur - 1, r)
            assert old.longest_hit(shared, cur - 1, r) == (sh, pv)
            evictable = kv.evictable_units(chain, sh, pv)
            assert evictable == old.evictable_among(shared[:sh], r, pv)
            hit_ref = ref.lookup(keys_ref, cur - 1)
            assert sh + pv == len(hit_ref)
            assert evictable == sum(1 for b in hit_ref if ref.ref[b] == 0)
            if cur - (sh + pv) + evictable > kv.free:  # the engine's admission test
                continue
            ref.touch(hit_ref)
            blocks = hit_ref + ref.allocate(cur - len(hit_ref))
            for j in range(len(hit_ref), cur):
                ref.register(blocks[j], keys_ref[j])
            ref_blocks[r] = blocks
            hit = sh + pv
            refs = kv.touch_units(chain, sh, r, pv) if hit else ([], [])
            kv.allocate(cur - hit)
            kv.register_units(chain, hit, min(cur, n_shared), refs)
            kv.register_private(r, cur - max(hit, n_shared))
            mine[r] = (cur, refs)
            old_refs[r] = old.touch(shared[:sh], r, pv) if hit else []
            old.allocate(cur - hit)
            old_refs[r] += old.register(shared[hit:min(cur, n_shared)])
            old.register_private(r, cur - max(hit, n_shared))
        elif op == "grow" and r in mine:
            held, refs = mine[r]
            k = min(size % 3 + 1, total - held, kv.free)
            if k <= 0:
                continue
            for b in ref.allocate(k):
                ref.register(b, keys_ref[len(ref_blocks[r])])
                ref_blocks[r].append(b)
            kv.allocate(k)
            kv.register_units(chain, held, min(held + k, n_shared), refs)
            kv.register_private(r, held + k - max(held, n_shared))
            mine[r] = (held + k, refs)
            old.allocate(k)
            old_refs[r] += old.register(shared[held:min(held + k, n_shared)])
            old.register_private(r, held + k - max(held, n_shared))
        elif op == "release" and r in mine:
            ref.release(ref_blocks.pop(r))
            held, refs = mine.pop(r)
            kv.release_units(held, refs, r)
            old.release(held, old_refs.pop(r), r)
            grown[r] = max(grown[r], held)
        else:
            continue
        # the unit pool is the per-block pool, block for block
        assert _cached_blocks(kv) == set(old.cached), (op, r)
        assert kv.evictions == old.evictions and kv.free == old.free, (op, r)
        assert kv.segment == old.segment and kv._lru_count == old._lru_count, (op, r)
        assert kv.explicit == old.explicit, (op, r)
        assert kv.duplicates == old.duplicates == ref.duplicates, (op, r)
        assert kv.dup_of == old.dup_of and kv.dups == old.dups, (op, r)
        # and both are the literal model, block for block
        assert old.free == ref.free(), (op, r)
        assert_hashed_as_literal(set(old.cached), old.segment, ref, [s[1] for s in shapes],
                                 old.dup_of)
        steps += 1
    return steps, bool(old.explicit)


_EXAMPLES = [
    # two requests of one group: the second hits part of the first's 4-block unit (explodes)
    (12, [[4, 2], [1], [1]], [(0, 6, 7), (0, 3, 5)],
     [("admit", 0, 7), ("release", 0, 1), ("admit", 1, 5)]),
    # a 4-block unit queued, then partly evicted from its tail, then hit for what is left
    (8, [[4], [1], [1]], [(0, 4, 5), (1, 0, 6), (0, 4, 5)],
     [("admit", 0, 5), ("release", 0, 1), ("admit", 1, 6), ("release", 1, 1),
      ("admit", 2, 5)]),
    # registered a block at a time by its one holder (the unit grows), then by a second
    # request hitting it (the holder's next block explodes it)
    (16, [[4], [1], [1]], [(0, 4, 5), (0, 4, 5)],
     [("admit", 0, 1), ("grow", 0, 1), ("admit", 1, 3), ("grow", 0, 2)]),
    # two duplicates of one block queued around another key (decision KD1): a hit takes the
    # older once the first is evicted (the two examples of tests/test_replay_kv_cache.py)
    (8, [[1], [1], [1]], [(0, 1, 1), (0, 1, 1), (0, 1, 1), (1, 0, 5), (0, 1, 2), (2, 1, 1)],
     [("admit", 0, 1), ("admit", 1, 1), ("admit", 5, 1), ("admit", 2, 1), ("release", 0, 1),
      ("release", 1, 1), ("release", 5, 1), ("release", 2, 1), ("admit", 3, 5),
      ("admit", 4, 2)]),
    # a duplicate evicted from the front part of its run after its key's first block
    (6, [[1, 1], [1], [1]], [(0, 2, 2), (0, 2, 2), (0, 0, 1), (1, 0, 5), (0, 2, 3)],
     [("admit", 0, 2), ("admit", 1, 2), ("release", 0, 1), ("release", 1, 1),
      ("admit", 3, 5), ("release", 3, 1), ("admit", 4, 3)]),
    # the same with the duplicate alone in its run (evicted whole)
    (6, [[1], [1], [1]], [(0, 1, 1), (0, 1, 1), (0, 0, 1), (1, 0, 6), (0, 1, 2)],
     [("admit", 0, 1), ("admit", 1, 1), ("release", 0, 1), ("release", 1, 1),
      ("admit", 3, 6), ("release", 3, 1), ("admit", 4, 2)]),
    # a 4-block unit whose last block another request fills too: the unit goes per block
    # and the copy is a duplicate, hit after the unit's blocks are evicted
    (10, [[4], [1], [1]], [(0, 4, 4), (0, 4, 4), (1, 0, 6), (0, 4, 5)],
     [("admit", 0, 4), ("admit", 1, 4), ("release", 0, 1), ("release", 1, 1),
      ("admit", 2, 6), ("release", 2, 1), ("admit", 3, 5)]),
]


@settings(max_examples=500, deadline=None)
@given(scripts())
def test_kv_units_agree_with_the_per_block_pool_and_the_literal_model(script):
    _drive(script)


@settings(max_examples=300, deadline=None)
@given(corner_scripts())
def test_kv_units_agree_with_the_literal_model_past_a_broken_chain(script):
    # With duplicates cached (decision KD1) request 1's copy of the chain's first block is
    # hashed and freed after its own blocks, so the chain cannot break before them: the
    # scripts that reached KB6's corner (KF1) agree with the literal model without it.
    assert not _drive(script)[1]


@pytest.mark.parametrize("script", _EXAMPLES)
def test_kv_units_agree_with_the_literal_model_on_worked_examples(script):
    assert _drive(script) == (len(script[3]), False)


def test_kv_units_agree_when_stale_entries_are_compacted_at_every_touch(monkeypatch):
    compactions = compact_after_every(monkeypatch, KVUnits, "touch_units")
    # the worked examples first: five of them leave stale entries, so compaction surely runs
    # (the random scripts alone once reached none in a CI run)
    for script in _EXAMPLES:
        assert _drive(script) == (len(script[3]), False)
    assert any(compactions)
    test_kv_units_agree_with_the_per_block_pool_and_the_literal_model()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=12), st.sampled_from([1, 8, 16, 24, 512]),
       st.sampled_from([16, 32, 256]), st.integers(0, 300))
def test_block_units_are_the_block_keys_in_runs(hashes, hash_tokens, block_size, n_blocks):
    # Unit i's blocks are the consecutive blocks taking one chain entry; block j of a unit
    # has key unit + j (mod 2^64), which must be the block's own key from block_keys.
    from kernel.replay.block_keys import block_keys

    keys, sizes, ends = block_units(hashes, hash_tokens, block_size, n_blocks)
    flat = [(k + j) % 2**64 for k, m in zip(keys, sizes, strict=True) for j in range(m)]
    assert flat == block_keys(hashes, hash_tokens, block_size, n_blocks)
    assert ends == list(accumulate(sizes)) and all(m > 0 for m in sizes)
    if block_size % hash_tokens:  # one unit per chain entry the blocks take
        firsts = [-(-(j + 1) * block_size // hash_tokens) - 1 for j in range(len(flat))]
        assert len(keys) == len(set(firsts))
    else:
        assert sizes == [1] * len(keys)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=17, max_size=90),
       st.sampled_from([16, 32, 128]), st.integers(1, 3000))
def test_long_chains_take_the_same_unit_keys(hashes, block_size, n_blocks):
    # A chain of more than 16 entries, each a whole number of blocks, has its unit keys
    # computed in uint64 arithmetic (block_keys._entry_keys): they must still expand to the
    # blocks' own keys, the last unit cut at the request's blocks.
    from kernel.replay.block_keys import block_keys

    keys, sizes, ends = block_units(hashes, 512, block_size, n_blocks)
    flat = [(k + j) % 2**64 for k, m in zip(keys, sizes, strict=True) for j in range(m)]
    assert flat == block_keys(hashes, 512, block_size, n_blocks)
    assert ends == list(accumulate(sizes)) and all(m > 0 for m in sizes)


def _shared_prefix_rows(seed: int, n: int) -> tuple[list[dict], list[dict]]:
    """``n`` open-loop requests whose prompts share prefixes named by a chain of 64-token
    entries (4 engine blocks each), and the same requests with the chain expanded to one
    entry per 16-token block, each the key ``block_keys`` gives that block."""
    from kernel.replay.block_keys import block_keys

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(3_000_000, n).astype(np.int64))
    units, blocks = [], []
    for i in range(n):
        p = int(rng.integers(16, 1200))
        if i % 3 == 0:  # the chain covers the whole prompt: its hit stops inside a unit
            p = max(64, p // 64 * 64)
        g = int(rng.integers(0, 3))
        entries = p // 64
        shared = int(rng.integers(0, entries + 1))
        hashes = ([1000 * g + j for j in range(shared)]
                  + [10**6 + 1000 * i + j for j in range(entries - shared)])
        row = {"request_id": f"q{i}", "arrival_ns": int(arrivals[i]), "prompt_tokens": p,
               "output_tokens": int(rng.integers(1, 60)), "prefix_hashes": hashes}
        units.append(row)
        blocks.append({**row, "prefix_hashes": block_keys(hashes, 64, 16, 4 * entries)})
    return units, blocks


@pytest.mark.parametrize("options", [
    {},  # a roomy pool: hits on whole and partial units, no eviction pressure
    {"num_blocks": 140, "max_num_seqs": 24},  # a full pool: eviction of units, preemption
    {"num_blocks": 200, "max_num_batched_tokens": 512, "long_prefill_token_threshold": 72},
])  # chunks ending inside units: a unit registered in parts (grown by its holder)
def test_a_replay_in_units_equals_the_same_replay_block_by_block(options):
    # End to end, through the engine: the same requests replayed with 4-block units and
    # with 1-block units (the per-block pool's behaviour, pinned by tests/test_replay_pin.py)
    # give the same requests, steps, engine steps, rejects and summary.
    from kernel.replay import ReplayOptions, replay
    from tests.replay_pin import digest
    from tests.replay_support import kernel_for, request_set

    k = kernel_for("llama-3.1-8b-h100-tp1")
    units, blocks = _shared_prefix_rows(5, 240)
    a = replay(k, request_set(units, hash_block_tokens=64), ReplayOptions(**options))
    b = replay(k, request_set(blocks, hash_block_tokens=16), ReplayOptions(**options))
    assert a.summary["prefix_hit_rate"] > 0  # the prefixes are hit
    assert digest(a) == digest(b)


def _corner_rows(seed: int, n: int) -> tuple[list[dict], list[dict]]:
    """``n`` requests arriving four at a time, two prefix groups of 64-token entries (4
    engine blocks each), short and long outputs: requests of one group compute a shared block
    in the same step (the second copy a duplicate, KD1), and a small pool preempts them: with
    unhashed copies some request's own blocks ended up cached behind a chain broken by the
    eviction of another request's block (KB6's corner). The same requests with the chain per 16-token block too."""
    from kernel.replay.block_keys import block_keys

    rng = np.random.default_rng(seed)
    units, blocks = [], []
    for i in range(n):
        entries = int(rng.integers(1, 6))
        prompt = 64 * entries + int(rng.integers(0, 64))
        shared = int(rng.integers(1, entries + 1))
        g = int(rng.integers(0, 2))
        out = int(rng.integers(1, 8)) if rng.random() < 0.5 else int(rng.integers(40, 200))
        hashes = ([1000 * g + j for j in range(shared)]
                  + [10**6 + 1000 * i + j for j in range(entries - shared)])
        row = {"request_id": f"q{i}", "arrival_ns": i // 4 * 2_000_000,
               "prompt_tokens": prompt, "output_tokens": out, "prefix_hashes": hashes}
        units.append(row)
        blocks.append({**row, "prefix_hashes": block_keys(hashes, 64, 16, 4 * entries)})
    return units, blocks


@pytest.mark.parametrize("num_blocks", [32, 48, 64])
def test_a_replay_past_a_broken_chain_in_units_equals_it_block_by_block(num_blocks, monkeypatch):
    # KF1 through the engine: a lookup finds a preempted request's chain broken before its
    # own blocks, which become explicit (their later blocks registered one by one, not as a
    # segment count); in units and block by block the replay stays the same.
    from kernel.replay import ReplayOptions, replay
    from tests.replay_pin import digest
    from tests.replay_support import kernel_for, request_set

    made: list[int] = []
    make = KVBlocks._make_explicit

    def counted(self, r):  # type: ignore[no-untyped-def]
        made.append(r)
        make(self, r)

    monkeypatch.setattr(KVBlocks, "_make_explicit", counted)
    k = kernel_for("llama-3.1-8b-h100-tp1")
    units, blocks = _corner_rows(13, 40)
    options = ReplayOptions(num_blocks=num_blocks, max_num_seqs=8)
    a = replay(k, request_set(units, hash_block_tokens=64), options)
    reached = len(made)
    b = replay(k, request_set(blocks, hash_block_tokens=16), options)
    # With duplicates cached (KD1) no chain breaks before a request's own blocks: a
    # request's chain blocks are freed with it, after its segment, and only its own copy
    # of a key can be the last one cached, so the corner KF1 handles is not reached
    assert not reached and not made
    assert a.summary["preemptions"] > 0 and a.summary["prefix_hit_rate"] > 0
    assert digest(a) == digest(b)
