"""Prefix cache with requests: eviction boundaries (§12.2), unified-tree SWA cases (§12.8)."""

import numpy as np
import pytest
from helpers.cache_sim import evict_window, finish, start, unfinished

from swajax.memory.host_allocator import HostAllocator
from swajax.prefix_cache import RadixCache, check_invariants
from swajax.serving.window import eviction_frontier


def setup(full=1024, swa=512, ps=1, window=4, cap=False):
    alloc = HostAllocator(full, swa, ps)
    return alloc, RadixCache(alloc, page_size=ps, window=window, cap_leaf_to_window=cap)


def tokens(n, base=1):
    return list(range(base, base + n))


@pytest.mark.parametrize(
    "ps, window",
    [(ps, w) for ps in (4, 8, 16, 32, 64, 128, 256) for w in (1, 2, 4, 8) if ps > w],
)
def test_frontier_stays_below_insert_boundary_when_page_exceeds_window(ps, window):
    """§12.2 item 1 (and §13 item 10): the radix frontier never reaches floor(seq / ps) * ps."""
    for seq in range(ps + 1, 5 * ps, max(1, ps // 4)):
        _, end = eviction_frontier(
            seq - 1, window=window, page_size=ps, cache_protected_len=0, swa_evicted_seqlen=0
        )
        assert end < seq // ps * ps and end % ps == 0
        assert end == max(0, (seq - 1 - max(window, ps)) // ps * ps)


@pytest.mark.parametrize(
    "ps, window, seqs", [(4, 8, (13, 17, 25, 33)), (1, 4, range(6, 30)), (1, 4, (10, 20, 30))]
)
def test_evict_then_finish_keeps_the_last_leaf_live(ps, window, seqs):
    """§12.2 items 2, 3 and 9: evicted below the insert length; finishing inserts cleanly."""
    for seq in seqs:
        alloc, cache = setup(4096, 2048, ps, window)
        req = start(cache, alloc, tokens(seq))
        evict_window(alloc, req, window=window, page_size=ps)
        insert_len = seq // ps * ps
        assert req.evicted < insert_len
        if ps == 1:
            assert req.evicted == max(0, seq - 1 - max(window, ps))
        finish(cache, req)
        check_invariants(cache)
        assert len(cache.match(tokens(seq))) == insert_len


def test_short_sequence_evicts_nothing():
    """§12.2 item 4: ps 8, W 4, seq 10 -> 9 - 8 = 1 -> page floor 0."""
    alloc, cache = setup(ps=8)
    req = start(cache, alloc, tokens(10))
    evict_window(alloc, req, window=4, page_size=8)
    assert req.evicted == 0


def test_insert_case1_evicted_within_matched():
    """§12.2 item 5: ps 8, W 2; the second request's new tokens [16, 24) go in live."""
    alloc, cache = setup(ps=8, window=2)
    finish(cache, start(cache, alloc, tokens(16)))
    req = start(cache, alloc, tokens(24))
    assert req.protected == 16
    evict_window(alloc, req, window=2, page_size=8)
    assert req.evicted <= 16
    before = cache.swa_evictable + cache.swa_protected  # the request locks [0, 16) meanwhile
    finish(cache, req)
    assert cache.swa_evictable == before + 8 and cache.swa_protected == 0
    check_invariants(cache)


def test_insert_case2_partial_tombstone():
    """§12.2 item 6: ps 8, W 2, seq 25: evicted 16; the insert makes [0, 16) a tombstone."""
    alloc, cache = setup(ps=8, window=2)
    req = start(cache, alloc, tokens(25))
    evict_window(alloc, req, window=2, page_size=8)
    assert req.evicted == 16
    finish(cache, req)
    assert cache.swa_evictable == 24 - 16 and cache.full_evictable == 24
    check_invariants(cache)


def test_insert_case3_all_evicted_creates_nothing():
    """§12.2 item 7: with the old formula the whole insert span is evicted: no live node."""
    alloc, cache = setup(ps=8, window=2)
    req = start(cache, alloc, tokens(11))
    alloc.free_swa(req.slots[:8])
    req.evicted = 8
    finish(cache, req)
    assert cache.swa_evictable == 0 and not cache.root.children
    assert alloc.available() == (1024, 512)
    check_invariants(cache)


def test_multiple_turns():
    """§12.2 item 8: four turns of one conversation, evict then finish each."""
    alloc, cache = setup(ps=8, window=2)
    for turn in range(4):
        seq = 8 * (turn + 2) + 1
        req = start(cache, alloc, tokens(seq))
        evict_window(alloc, req, window=2, page_size=8)
        assert req.evicted < seq // 8 * 8
        finish(cache, req)
        check_invariants(cache)


# §12.8, the SWA cases. Configs (ps, W, kv): window below / equal / above the page.
CONFIGS = [(1, 4, 256), (4, 4, 256), (4, 2, 256), (16, 16, 512), (64, 64, 4096), (128, 4, 8192)]


@pytest.mark.parametrize("ps, window, kv", CONFIGS)
def test_insert_match_split_and_prev_prefix(ps, window, kv):
    alloc, cache = setup(kv, kv, ps, window, cap=True)
    a, b = tokens(2 * ps), tokens(ps, base=1000)
    assert cache.insert(a, alloc.alloc_extend([0], [2 * ps], [-1])[1]) == 0
    assert cache.insert(a + b, alloc.alloc_extend([0], [3 * ps], [-1])[1]) == 2 * ps
    assert len(cache.match(a + b)) == 3 * ps
    assert len(cache.match(a + tokens(ps, base=5000))) == 2 * ps
    assert len(cache.match(tokens(ps, base=9000))) == 0
    used = kv - alloc.available()[0]
    assert used == 3 * ps  # the duplicate 2 pages of the second insert were freed
    # prev_prefix_len: a request whose first 2 pages came from the tree frees nothing of them.
    c = tokens(ps, base=7000)
    slots = np.concatenate([cache.match(a).slots, alloc.alloc_extend([0], [ps], [-1])[1]])
    cache.insert(a + c, slots, prev_prefix_len=2 * ps)
    assert kv - alloc.available()[0] == 4 * ps
    check_invariants(cache)


@pytest.mark.parametrize("ps, window, kv", CONFIGS)
def test_evict_respects_locks_and_cleans_up(ps, window, kv):
    alloc, cache = setup(kv, kv, ps, window, cap=True)
    assert cache.evict(kv, kv) == (0, 0)  # empty tree
    a, b = tokens(2 * ps), tokens(3 * ps, base=500)
    for t in (a, b):
        cache.insert(t, alloc.alloc_extend([0], [len(t)], [-1])[1])
    handle = cache.lock(cache.match(a).node)
    full_before = alloc.available()[0]
    freed, _ = cache.evict(kv, kv)
    assert freed >= len(b) and alloc.available()[0] - full_before == freed
    assert len(cache.match(a)) == 2 * ps
    cache.unlock(handle)
    cache.evict(kv, kv)
    assert not cache.root.children and alloc.available() == (kv, kv)
    check_invariants(cache)


def test_evict_lru_order():
    alloc, cache = setup(cap=True)
    a, b = tokens(8), tokens(8, base=100)
    for t in (a, b):
        cache.insert(t, alloc.alloc_extend([0], [8], [-1])[1])
    cache.match(a)  # a is now the most recent
    cache.evict(1, 0)
    assert len(cache.match(a)) == 8 and len(cache.match(b)) < 8
    check_invariants(cache)


def test_unfinished_preserves_existing_eviction_boundary():
    """§12.8: 8 tokens with swa_evicted_seqlen 4: [0, 4) tombstone, [4, 8) live, all match."""
    alloc, cache = setup(cap=True)
    req = start(cache, alloc, tokens(8))
    alloc.free_swa(req.slots[:4])
    req.evicted = 4
    unfinished(cache, req)
    top = cache.root.children[(1,)]
    assert not top.swa_live and len(top) == 4 and next(iter(top.children.values())).swa_live
    assert len(cache.match(tokens(8))) == 8 and req.protected == 8
    check_invariants(cache)


def test_unfinished_revival_keeps_locked_full_value():
    """§12.8: a locked tombstone T is revived by a new request's SWA KV: T keeps its full
    slots, takes the request's SWA slots, and the request's full slots are freed."""
    alloc, cache = setup(cap=True)
    t = tokens(4)
    for seq in (t, t + [100]):
        cache.insert(seq, alloc.alloc_extend([0], [len(seq)], [-1])[1])
    node = cache.root.children[(1,)]
    old_value = node.value.copy()
    cache.evict(0, 1)
    assert not node.swa_live
    held = cache.lock(node)
    fresh = alloc.alloc_extend([0], [4], [-1])[1]
    fresh_swa = alloc.translate(fresh)
    full_before = alloc.available()[0]
    prefix, handle = cache.cache_unfinished(
        t, fresh, cache_protected_len=0, swa_evicted_seqlen=0, handle=None
    )
    assert alloc.available()[0] == full_before + 4
    np.testing.assert_array_equal(node.value, old_value)
    np.testing.assert_array_equal(prefix, old_value)
    np.testing.assert_array_equal(alloc.translate(old_value), fresh_swa)
    cache.unlock(held)
    cache.unlock(handle)
    check_invariants(cache)


@pytest.mark.parametrize("ps, window, kv", CONFIGS)
def test_insert_wholly_outside_window_keeps_nothing(ps, window, kv):
    """§12.8 'keeps full leaf when the span is outside the window' — our rules differ: a leaf
    is never a tombstone, so the span cannot be matched and its slots are freed at once
    (the unified tree keeps a full-only leaf)."""
    alloc, cache = setup(kv, kv, ps, window, cap=True)
    slots = alloc.alloc_extend([0], [2 * ps], [-1])[1]
    alloc.free_swa(slots)
    cache.insert(tokens(2 * ps), slots, swa_evicted_seqlen=2 * ps)
    assert alloc.available() == (kv, kv) and not cache.root.children
    check_invariants(cache)


@pytest.mark.parametrize("ps, window, kv", CONFIGS)
def test_leaf_capped_long_and_short(ps, window, kv):
    """§12.8: a long leaf is cut to ceil(W / ps) pages under its parent; a short one is not."""
    tail_pages = -(-window // ps)
    for pages, split in ((tail_pages + 2, True), (tail_pages, False)):
        alloc, cache = setup(kv, kv, ps, window, cap=True)
        seq = tokens(pages * ps)
        cache.insert(seq, alloc.alloc_extend([0], [len(seq)], [-1])[1])
        leaf = cache.match(seq).node
        assert len(leaf) == (tail_pages * ps if split else len(seq))
        assert (leaf.parent is not cache.root) == split
        cache.lock(leaf)
        assert cache.swa_protected == len(leaf) and cache.full_protected == len(seq)
        check_invariants(cache)


def test_swa_evict_internal_then_leaf_drains_swa():
    """§12.8 'evict internal tombstone': base + leaf, SWA eviction of everything."""
    alloc, cache = setup(256, 256, 4, 4, cap=False)
    base, leaf = tokens(12), tokens(12) + tokens(12, base=50)
    for seq in (base, leaf):
        cache.insert(seq, alloc.alloc_extend([0], [len(seq)], [-1])[1])
    cache.evict(0, 2 * cache.swa_evictable)
    assert cache.swa_evictable == 0
    check_invariants(cache)


def test_match_refreshes_the_whole_accepted_path():
    """§12.8's LRU window tests are written for the unified tree, which refreshes only the last
    W + ps tokens of a match. We refresh the whole accepted path (the legacy rule): after a deep
    match, SWA eviction under pressure takes the untouched side branch, not the old ancestors."""
    alloc, cache = setup(1024, 1024, 1, 4, cap=True)
    a, b, c, side = tokens(8), tokens(8, 100), tokens(8, 200), tokens(5, 300)
    for seq in (a, a + b, a + b + c, side):
        cache.insert(seq, alloc.alloc_extend([0], [len(seq)], [-1])[1])
    deep = cache.match(a + b + c).node
    cache.evict(0, 1)
    assert all(node.swa_live for node in deep.path_to_root())
    (tombstone,) = [n for n in cache.nodes() if not n.swa_live]
    assert tombstone.key == (300,)  # the side branch's oldest part
    assert len(cache.match(side)) == 5  # its last W tokens are live: still a hit
    check_invariants(cache)
