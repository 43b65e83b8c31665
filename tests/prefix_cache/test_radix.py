"""Prefix cache scenarios ported from SGLang's tests (spec §12.1-12.3, §12.5, §12.8).

Rule set: the legacy tree (leaves are never unlocked tombstones) with window-capped leaves
optional; where a scenario was written for the unified tree and our rules give other numbers,
the test's docstring says so.
"""

import numpy as np
import pytest

from swajax.memory.host_allocator import HostAllocator
from swajax.prefix_cache import ChunkCache, RadixCache, check_invariants


class Env:
    """A jitted allocator and a tree over it."""

    def __init__(self, full=128, swa=64, ps=1, window=4, cap=False, mode="hybrid"):
        self.alloc = HostAllocator(full, swa, ps, mode)
        self.tree = RadixCache(
            self.alloc, page_size=ps, window=window, pool_mode=mode, cap_leaf_to_window=cap
        )
        self.ps = ps

    def slots(self, n):
        status, slots = self.alloc.alloc_extend([0], [n], [-1])
        assert status == 0
        return slots

    def insert(self, tokens, prev=0, evicted=0):
        return self.tree.insert(tokens, self.slots(len(tokens)), prev, evicted)

    def leaf(self, tokens):
        return self.tree.match(tokens).node

    def avail(self):
        return self.alloc.available()

    def check(self):
        check_invariants(self.tree)


def test_swa_radix_cache_1():
    """§12.1 item 4: LRU eviction order, an internal tombstone, and the window rule on match."""
    env = Env(128, 64)
    for tokens in ([1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [10, 11, 12], [1, 2, 3, 4, 5, 60, 70]):
        env.insert(tokens)
    assert env.tree.evict(1, 0) == (3, 3)  # leaf C [10, 11, 12]
    assert env.tree.evict(0, 1) == (0, 3)  # tombstones A [1, 2, 3]
    assert env.tree.evict(1, 2) == (2, 2)  # leaf B2 [6, 7]
    assert len(env.tree.match([1, 2, 3, 4, 5])) == 0  # 2 live tokens after A < W
    result = env.tree.match([1, 2, 3, 4, 5, 60, 70])
    assert len(result) == 7 and result.node.key == (60, 70)
    env.check()


def test_evict_swa_then_full_deletes_childless_tombstones():
    """§12.1 items 1-2 (eviction part): SWA eviction tombstones the internal node; full
    eviction deletes the leaf and then its childless tombstone parent: all 6 tokens gone."""
    env = Env(128, 64)
    env.insert([1, 2, 3, 4])
    env.insert([1, 2, 3, 4, 5, 6])
    full0, swa0 = env.avail()
    assert env.tree.evict(0, 1) == (0, 4)
    assert env.avail() == (full0, swa0 + 4)
    assert env.tree.evict(1, 0) == (6, 2)
    assert env.avail() == (128, 64) and not env.tree.root.children
    env.check()


@pytest.mark.parametrize("cap", [False, True])
def test_split_leaf_flag_off_protects_full_leaf(cap):
    """§12.1 items 7 and 8 (W 4, ps 1, 12-token leaf): without the cap the lock protects the
    whole leaf; with it the leaf is cut to one window and only that is protected."""
    env = Env(128, 64, cap=cap)
    env.insert(list(range(1, 13)))
    leaf = env.leaf(list(range(1, 13)))
    env.tree.lock(leaf)
    assert len(leaf) == (4 if cap else 12) == env.tree.swa_protected
    env.check()


@pytest.mark.parametrize(
    "window, ps, leaf_len, tail",
    [
        (4, 1, 12, 4),
        (4, 1, 5, 4),
        (1, 1, 5, 1),
        (4, 2, 12, 4),
        (8, 2, 12, 8),
        (4, 4, 12, 4),
        (3, 2, 12, 4),
        (5, 4, 12, 8),
        (3, 4, 12, 4),
    ]  # split
    + [(4, 1, 4, 4), (4, 1, 3, 3), (4, 2, 4, 4), (3, 2, 4, 4), (8, 2, 4, 4), (4, 4, 4, 4)],  # none
)
def test_leaf_capped_to_window(window, ps, leaf_len, tail):
    """§12.1 items 8-9: the leaf holds ceil(W / ps) pages; locking protects exactly it."""
    env = Env(max(128, 32 * ps), max(64, 16 * ps), ps=ps, window=window, cap=True)
    tokens = list(range(1, leaf_len + 1))
    env.insert(tokens)
    leaf = env.leaf(tokens)
    env.tree.lock(leaf)
    assert len(leaf) == tail == env.tree.swa_protected
    env.check()


def test_match_returns_full_chain_after_split_and_unlock_balances():
    """§12.1 items 10-11."""
    env = Env(128, 64, cap=True)
    tokens = list(range(1, 13))
    env.insert(tokens)
    result = env.tree.match(tokens)
    assert len(result) == 12 and len(result.node) == 4
    handle = env.tree.lock(result.node)
    assert (env.tree.swa_protected, env.tree.full_protected) == (4, 12)
    env.tree.unlock(handle)
    assert (env.tree.swa_protected, env.tree.full_protected) == (0, 0)
    env.check()


# §12.3: lock release lifecycle (legacy), W 4, ps 1, pools 128 / 64.


def test_early_release_of_a_leaf_tombstones_and_frees():
    """§12.3 items 1 and 6. Unlike the legacy tree, releasing the last full lock of that
    tombstone leaf then deletes it (a leaf is never an unlocked tombstone), freeing its full KV;
    the SWA evictable size is unaffected."""
    env = Env()
    tokens = list(range(1, 9))
    env.insert(tokens)
    leaf = env.leaf(tokens)
    handle = env.tree.lock(leaf)
    assert leaf.swa_lock == leaf.full_lock == 1 and leaf in env.tree.swa_lru
    full0, swa0 = env.avail()
    env.tree.release_swa(handle)
    assert not leaf.swa_live and leaf not in env.tree.swa_lru and leaf.swa_lock == 0
    assert env.avail() == (full0, swa0 + 8) and leaf.full_lock == 1
    env.check()
    evictable = env.tree.swa_evictable
    env.tree.unlock(handle)
    assert env.tree.swa_evictable == evictable and env.avail() == (full0 + 8, swa0 + 8)
    env.check()


def test_early_release_internal_node_becomes_evictable():
    """§12.3 items 2-3: the window ends at the internal node; only the leaf is tombstoned."""
    env = Env()
    env.insert([1, 2, 3, 4, 5, 6, 7, 8])
    env.insert([1, 2, 3, 4, 5, 6, 7, 9])
    leaf_a = env.leaf([1, 2, 3, 4, 5, 6, 7, 8])
    internal = leaf_a.parent
    assert len(leaf_a) == 1 and len(internal) == 7
    handle = env.tree.lock(leaf_a)
    assert handle.id in internal.swa_tops
    protected, evictable = env.tree.swa_protected, env.tree.swa_evictable
    _, swa0 = env.avail()
    env.tree.release_swa(handle)
    assert internal.swa_live and internal in env.tree.swa_lru and internal.swa_lock == 0
    assert env.tree.swa_protected == protected - 8
    assert env.tree.swa_evictable == evictable + 7
    assert env.avail()[1] == swa0 + 1
    env.tree.unlock(handle)  # the full part only
    assert internal.full_lock == 0 and env.tree.swa_protected == protected - 8
    env.check()


def test_plain_lock_round_trip_changes_no_allocator_state():
    """§12.3 item 4."""
    env = Env()
    env.insert(list(range(1, 9)))
    before = env.avail()
    handle = env.tree.lock(env.leaf(list(range(1, 9))))
    env.tree.unlock(handle)
    assert env.tree.full_protected == env.tree.swa_protected == 0 and env.avail() == before
    env.check()


def test_evict_swa_of_full_locked_leaf_tombstones_in_place():
    """§12.3 item 5 and §12.8 'aux evict full-locked leaf': W 64, leaf [1..4] locked; its SWA
    lock released by hand (protected -> evictable, the unified early release); SWA eviction then
    tombstones the leaf in place and keeps its full KV."""
    env = Env(window=64)
    env.insert([1, 2, 3, 4])
    leaf = env.leaf([1, 2, 3, 4])
    handle = env.tree.lock(leaf)
    env.tree.locks._swa_unlock(handle, env.tree.locks._make_swa_evictable)
    assert leaf in env.tree.swa_lru and env.tree.swa_evictable == 4
    full0, swa0 = env.avail()
    assert env.tree.evict(0, 4) == (0, 4)
    assert not leaf.swa_live and leaf not in env.tree.swa_lru and leaf.full_lock == 1
    assert leaf.parent is env.tree.root and env.avail() == (full0, swa0 + 4)
    assert env.tree.swa_evictable == 0
    env.check()


@pytest.mark.parametrize("ps, window", [(2, 4), (8, 4), (4, 6)])
def test_early_release_leaf_page_sizes(ps, window):
    """§12.3 item 7."""
    env = Env(max(128, 32 * ps), max(64, 16 * ps), ps=ps, window=window)
    n = -(-max(window, 2 * ps) // ps) * ps
    tokens = list(range(1, n + 1))
    env.insert(tokens)
    leaf = env.leaf(tokens)
    handle = env.tree.lock(leaf)
    assert handle.id in leaf.swa_tops
    full0, swa0 = env.avail()
    env.tree.release_swa(handle)
    assert env.avail() == (full0, swa0 + len(leaf)) and not leaf.swa_live
    env.check()


def test_early_release_internal_page_size_2():
    """§12.3 item 8: ps 2, W 6."""
    env = Env(ps=2, window=6)
    env.insert([1, 2, 3, 4, 5, 6])
    env.insert([1, 2, 3, 4, 7, 8])
    leaf_a = env.leaf([1, 2, 3, 4, 5, 6])
    internal = leaf_a.parent
    handle = env.tree.lock(leaf_a)
    assert handle.id in internal.swa_tops
    protected, evictable = env.tree.swa_protected, env.tree.swa_evictable
    _, swa0 = env.avail()
    env.tree.release_swa(handle)
    assert env.avail()[1] == swa0 + 2 and not leaf_a.swa_live and internal.swa_live
    assert env.tree.swa_evictable == evictable + 4 and env.tree.swa_protected == protected - 6
    env.check()


# §12.5: the all-SWA chunk cache frees around what eviction already freed.


class Recorder:
    def __init__(self):
        self.freed = []

    def free(self, slots):
        self.freed.append(list(np.asarray(slots)))

    def free_swa(self, slots):
        raise AssertionError("the chunk cache never frees SWA alone")

    def move_swa(self, dst, src):
        raise AssertionError


@pytest.mark.parametrize("protected, expected", [(0, [0, 1, 2, 6, 7]), (2, [2, 6, 7])])
def test_pure_swa_chunk_cache_frees_around_evicted(protected, expected):
    rec = Recorder()
    cache = ChunkCache(rec, page_size=1, window=4, pool_mode="all_swa")
    cache.cache_finished(
        list(range(8)),
        np.arange(10),
        cache_protected_len=protected,
        swa_evicted_seqlen=6,
        swa_evict_floor=3,
    )
    assert rec.freed == [expected]


def test_all_swa_tombstones_hold_no_slot_numbers():
    """All-SWA: a tombstone's KV went back to the one pool, which hands the pages out again;
    its node keeps the dummy slot, never a number another request now owns."""
    from helpers.allocator_model import ModelAllocator

    alloc = ModelAllocator(64, 64, 1, "all_swa")
    cache = RadixCache(alloc, page_size=1, window=4, pool_mode="all_swa", cap_leaf_to_window=True)
    _, slots, _ = alloc.alloc_extend([0], [16], [-1])
    alloc.free_swa(slots[:8])  # evicted before the insert: [0, 8) go in as a tombstone
    cache.insert(list(range(16)), np.asarray(slots, np.int32), swa_evicted_seqlen=8)
    cache.evict(0, 4)  # tombstones the least recent live node, [8, 12)
    dead = [n for n in cache.nodes() if not n.swa_live]
    assert sorted(len(n) for n in dead) == [4, 8]
    assert all((n.value == 0).all() for n in dead)
    _, fresh, _ = alloc.alloc_extend([0], [12], [-1])  # the pool reuses the freed pages
    live = {int(s) for n in cache.nodes() if n.swa_live for s in n.value}
    assert not live & set(fresh)
