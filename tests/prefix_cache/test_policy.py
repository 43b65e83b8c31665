"""Cache-policy profiles: each rule switch changes exactly the decision it names (one hand
scenario per rule, the rule alone against swajax's profile), and the named profiles."""

import numpy as np
import pytest
from helpers.allocator_model import ModelAllocator

from swajax import sizing
from swajax.api import engine_for
from swajax.prefix_cache import RadixCache, check_invariants
from swajax.prefix_cache.policy import PROFILES, SWAJAX, CachePolicy, policy_of
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.serving.window import eviction_frontier

CFG = load_preset("tiny-hybrid")  # W = 7


def only(rule: str) -> CachePolicy:
    return CachePolicy(rule, **{rule: True})


def engine(policy, *, full=2048, ps=4, chunk=16):
    sizes = sizing.solve_pool_sizes(CFG, full, ratio=0.5, page_size=ps)
    options = EngineOptions(chunk_size=chunk, max_context=1024, cache_policy=policy)
    return engine_for(CFG, NullModel(), sizes, options)


def test_profiles():
    assert policy_of("swajax") == SWAJAX and not any(getattr(SWAJAX, r) for r in SWAJAX.RULES)
    assert all(getattr(PROFILES["sglang-0.5.23"], r) for r in SWAJAX.RULES)
    with pytest.raises(ValueError, match="cache policy must be one of"):
        EngineOptions(cache_policy="vllm")


def _prefill(policy, prompt_len=64):
    """One request through its chunked prefill; stop at its first decode step."""
    e = engine(policy)
    rid = e.add_request(
        list(range(1, prompt_len + 1)), SamplingParams(temperature=0.0, max_tokens=8)
    )
    _step_until_decoding(e, rid)
    return e, e.requests[rid]


def _step_until_decoding(e, rid, max_steps=200):
    """Step until the request decodes; a bounded loop, so a regression fails instead of hanging."""
    for _ in range(max_steps):
        if e.requests[rid].decoding:
            return
        assert e.step() is not None, "the engine went idle before the request decoded"
    raise AssertionError(f"request {rid} did not reach decoding in {max_steps} steps")


def test_eager_window_free_tombstones_the_chunk_before_inserting():
    e, _ = _prefill(SWAJAX)
    assert e.cache.swa_evictable + e.cache.swa_protected == 48  # chunks 1-3 inserted, all live
    e, req = _prefill(only("eager_window_free"))
    # each checkpoint first freed what the next query no longer reads, so each inserted chunk
    # of 16 is a tombstone of 8 and a live window of 8 (the tree owns the earlier ones)
    assert e.cache.swa_evictable + e.cache.swa_protected == 3 * 8
    assert e.cache.full_protected == 48 and req.swa_evicted_seqlen == 40
    check_invariants(e.cache)


def test_checkpoint_after_the_last_chunk():
    e, _ = _prefill(SWAJAX, prompt_len=60)
    assert e.cache.full_protected == 48  # checkpoints after chunks 1-3 only
    e, _ = _prefill(only("checkpoint_last_chunk"), prompt_len=60)
    assert e.cache.full_protected == 60  # and after the last (60 is page aligned)


@pytest.mark.parametrize(
    "ps, pre, expected", [(4, 19, (8, 12)), (4, 20, (12, 12)), (1, 19, (12, 12))]
)
def test_frontier_ceil_align(ps, pre, expected):
    """W = 7, page size 4: swajax keeps max(W, ps) = 7 tokens before the next query, 0.5.23
    ceil_align(7, 4) = 8; at page size 1 they agree."""
    kw = dict(window=7, page_size=ps, cache_protected_len=0, swa_evicted_seqlen=0)
    swajax_end = eviction_frontier(pre, **kw)[1]
    sglang_end = eviction_frontier(pre, ceil_align=True, **kw)[1]
    assert (sglang_end, swajax_end) == expected


def _tree(policy, ps=1, window=4, cap=True):
    alloc = ModelAllocator(256, 256, ps)
    return alloc, RadixCache(
        alloc, page_size=ps, window=window, policy=policy, cap_leaf_to_window=cap
    )


def _insert(alloc, cache, tokens, evicted=0):
    _, slots, _ = alloc.alloc_extend([0], [len(tokens)], [-1])
    alloc.free_swa(slots[:evicted])
    cache.insert(tokens, np.asarray(slots, np.int32), swa_evicted_seqlen=evicted)


def test_keep_childless_tombstones():
    """[0, 8) tombstoned, [8, 16) live: evicting the leaf deletes the tombstone above it too,
    unless the rule keeps it (as a full-KV leaf)."""
    for policy, freed, left in ((SWAJAX, 16, 0), (only("keep_childless_tombstones"), 8, 1)):
        alloc, cache = _tree(policy, cap=False)
        _insert(alloc, cache, list(range(16)), evicted=8)
        assert cache.evict(1, 0) == (freed, 8)
        assert len(list(cache.nodes())) == left
        check_invariants(cache)
        assert cache.evict(10**6, 0)[0] == 16 - freed and not cache.root.children


def test_window_recency():
    """A path H1 (8) -> H2 (8) -> T (4) and a branch off H1; a match of the whole path renews
    the SWA recency of every node on it, or under the rule of the last W + page-size tokens
    only (T and H2): then H1 is the least recent and the first SWA eviction tombstones it."""
    head_live = {}
    for policy in (SWAJAX, only("window_recency")):
        alloc, cache = _tree(policy)
        path = list(range(100, 120))
        _insert(alloc, cache, path)  # H (16) + T (4), the leaf capped to one window
        _insert(alloc, cache, path[:8] + [7] * 6)  # splits H into H1 + H2, adds a branch
        _insert(alloc, cache, [2] * 6)  # X
        cache.match(path + [0])
        cache.evict(0, 1)  # one SWA eviction: the least recent unlocked SWA node
        h1 = cache.walk(tuple(path))[0]
        head_live[policy.name] = (len(h1), h1.swa_live)
        check_invariants(cache)
    assert head_live == {"swajax": (8, True), "window_recency": (8, False)}


def test_window_recency_split_keeps_the_lower_part_in_place():
    from swajax.prefix_cache.node import LRUList, Node

    lru, nodes = LRUList(), [Node((i,)) for i in range(3)]
    for n in nodes:
        lru.add(n)
    upper = Node((9,))
    lru.add_before(upper, nodes[1])
    assert list(lru) == [nodes[0], upper, nodes[1], nodes[2]]


def test_branch_insert_stops_checkpoints_at_the_full_match():
    """B shares A's first 80 tokens, whose SWA KV was evicted: B's hit is cut by the window
    rule, its full-KV match reaches 80; with the rule the checkpoint that reaches 80 stops
    there, and the request drops the point (the branch is in the tree). (Both fall back at the
    cut: the rule is about the fallback, a tail rebuild has no branch.)"""
    protected, points = {}, {}
    fallback = CachePolicy("swajax", fallback_only=True)
    for policy in (fallback, CachePolicy("branch_insert", branch_insert=True, fallback_only=True)):
        e = engine(policy, chunk=24)
        a = list(range(1, 97))
        e.add_request(a, SamplingParams(temperature=0.0, max_tokens=1))
        e.run()
        e.cache.evict(0, 80)  # tombstone the path up to 80 (its least recent nodes)
        b = a[:80] + list(range(500, 560))
        rid = e.add_request(b, SamplingParams(temperature=0.0, max_tokens=1))
        req = e.requests[rid]
        e.step()  # admitted: the first chunk
        points[policy.name] = req.swa_branching_seqlen
        seen = [req.cache_protected_len]
        while not req.decoding:
            assert e.step() is not None and len(seen) < 200
            seen.append(req.cache_protected_len)
        protected[policy.name] = (seen, req.swa_branching_seqlen)
    full = points["branch_insert"]
    assert full is not None and 0 < full <= 80 and points["swajax"] is None
    cut, rest = protected["branch_insert"], protected["swajax"]
    assert next(n for n in cut[0] if n >= full) == full  # the checkpoint stopped at the point
    assert next(n for n in rest[0] if n >= full) > full  # without the rule it goes on
    assert cut[1] is None and cut[0][-1] == rest[0][-1]  # dropped; later chunks go in whole


def test_node_window_lock_pins_whole_nodes_and_counts_tombstones():
    """W = 4. A match ending at a live 12-token node: swajax splits it and pins its last 4;
    the rule pins all 12. A 2-token live leaf under a 14-token tombstone: swajax pins the 2
    and passes the tombstone; the rule counts the tombstone toward W and takes a lock count
    on it (SGLang 0.5.23's acquire_component_lock). Releases restore every count."""
    for policy, pinned in ((SWAJAX, 4), (only("node_window_lock"), 12)):
        alloc, cache = _tree(policy)
        _insert(alloc, cache, list(range(16)))  # the leaf capped: 12 + 4
        handle = cache.lock(cache.match(list(range(12)) + [99]).node)
        assert cache.swa_protected == pinned
        check_invariants(cache)
        cache.unlock(handle)
        assert cache.swa_protected == 0 and cache.swa_evictable == 16
    for policy, tombstone_locks in ((SWAJAX, 0), (only("node_window_lock"), 1)):
        alloc, cache = _tree(policy, cap=False)
        _insert(alloc, cache, list(range(16)), evicted=14)
        handle = cache.lock(cache.walk(tuple(range(16)))[-1])
        tombstone = cache.walk(tuple(range(14)))[-1]
        assert not tombstone.swa_live and tombstone.swa_lock == tombstone_locks
        assert cache.swa_protected == 2
        check_invariants(cache)
        cache.unlock(handle)
        assert tombstone.swa_lock == 0 and cache.swa_protected == 0


def test_lazy_window_release():
    """A request moved past its window releases it early: swajax tombstones the leaf the
    request still holds at once (its SWA slots go back); the rule leaves it SWA-evictable."""
    for policy, live, freed in ((SWAJAX, False, 4), (only("lazy_window_release"), True, 0)):
        alloc, cache = _tree(policy)
        _insert(alloc, cache, list(range(8)))  # capped: 4 + 4
        swa_free = alloc.available()[1]
        handle = cache.lock(cache.match(list(range(8)) + [0]).node)
        cache.release_swa(handle)
        leaf = cache.walk(tuple(range(8)))[-1]
        assert leaf.swa_live is live and alloc.available()[1] - swa_free == freed
        assert cache.swa_protected == 0 and cache.swa_evictable == 8 - freed
        check_invariants(cache)
        cache.unlock(handle)


def test_relock_checkpoint():
    """A chunk checkpoint that inserts nothing new: swajax keeps the request's lock (and its
    released window stays released); the rule takes a new lock, pinning the window again."""
    keep = CachePolicy("lazy", lazy_window_release=True)
    relock = CachePolicy("relock", lazy_window_release=True, relock_checkpoint=True)
    for policy, same, pinned in ((keep, True, 0), (relock, False, 4)):
        alloc, cache = _tree(policy)
        tokens = list(range(8))
        _insert(alloc, cache, tokens)
        match = cache.match(tokens + [0])
        handle = cache.lock(match.node)
        cache.release_swa(handle)
        prefix, new = cache.cache_unfinished(
            tokens, match.slots, cache_protected_len=8, swa_evicted_seqlen=0, handle=handle
        )
        assert (new is handle) is same and list(prefix) == list(match.slots)
        assert cache.swa_protected == pinned and cache.full_protected == 8
        check_invariants(cache)


def test_a_tombstone_leaf_outlives_its_lock_when_childless_tombstones_stay():
    """A chunk checkpoint whose SWA KV is all out of the window inserts a locked tombstone
    leaf; on unlock swajax deletes it (and frees its full KV), the rule keeps it."""
    for policy, kept in ((SWAJAX, False), (only("keep_childless_tombstones"), True)):
        alloc, cache = _tree(policy)
        tokens = list(range(8))
        _, slots, _ = alloc.alloc_extend([0], [8], [-1])
        alloc.free_swa(slots)
        full_free = alloc.available()[0]
        _, handle = cache.cache_unfinished(
            tokens,
            np.asarray(slots, np.int32),
            cache_protected_len=0,
            swa_evicted_seqlen=8,
            handle=None,
        )
        cache.unlock(handle)
        assert bool(cache.root.children) is kept
        assert alloc.available()[0] - full_free == (0 if kept else 8)
        check_invariants(cache)


def _all_swa_engine(policy):
    cfg = load_preset("tiny-all-swa")  # W = 8, every layer slides
    sizes = sizing.solve_pool_sizes(cfg, 2048, ratio=1.0, page_size=1)
    options = EngineOptions(chunk_size=16, max_context=1024, cache_policy=policy)
    return engine_for(cfg, NullModel(), sizes, options)


def test_prefill_floor_caches_the_prompt_whole_and_frees_decode_outside_the_window():
    """All-SWA pools: swajax's rules cache a finished request as tombstones plus a live window;
    the prefill-floor rule frees nothing below the prompt's end (decode positions that leave
    the window go back as it runs) and caches exactly the prompt, all live, in a tree without a
    window rule, so a second request hits all of it."""
    prompt, new = list(range(1, 41)), 200
    for policy in (SWAJAX, only("prefill_floor")):
        e = _all_swa_engine(policy)
        free_before = e.ledger.available()[1]
        rid = e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=new))
        lowest_kept = evicted = 0
        while (req := e.requests[rid]).status.name != "FINISHED":
            assert e.step() is not None
            evicted = max(evicted, req.swa_evicted_seqlen)
            lowest_kept = req.swa_evict_floor
        cache = e.cache
        check_invariants(cache)
        match = cache.match(prompt + [0])
        if policy is SWAJAX:
            assert cache.swa and cache.tombstones > 0 and len(match.slots) < 40
        else:
            assert not cache.swa and cache.tombstones == 0 and lowest_kept == 40
            assert evicted > 40 + 64  # decode positions went back while it ran
            assert cache.full_evictable == cache.swa_evictable == 40  # the prompt, no more
            assert e.ledger.available()[1] == free_before - 40
            assert len(match.slots) == 40


def test_prefill_floor_leaves_hybrid_pools_alone():
    e, _ = _prefill(only("prefill_floor"))
    assert e.cache.swa and e.cache.swa_evictable + e.cache.swa_protected == 48


def test_prefill_floor_checkpoint_frees_a_duplicate_below_the_floor():
    """Found by the property test: two requests with the same one-token prompt (window 1, page
    1); the first is cached and leaves; the second's window frontier reaches its floor, which
    moves `swa_evicted_seqlen` up to the floor without freeing anything; its checkpoint then
    finds its slot a duplicate of the tree's and must give it back (it once counted it as freed
    by the window, and the slot leaked)."""
    from helpers.cache_sim import evict_window, finish, start, unfinished

    alloc = ModelAllocator(40, 40, 1, "all_swa")
    cache = RadixCache(
        alloc, page_size=1, window=1, pool_mode="all_swa", policy=PROFILES["sglang-0.5.23"]
    )
    first, second = start(cache, alloc, [1]), start(cache, alloc, [1])
    unfinished(cache, first)
    finish(cache, first, insert=False)
    evict_window(alloc, second, window=1, page_size=1)
    assert second.evicted == 1 and alloc.available()[1] == 38  # nothing freed
    unfinished(cache, second)
    assert alloc.available()[1] == 39  # the duplicate went back
    finish(cache, second)
    cache.evict(10**6, 10**6)
    check_invariants(cache)
    assert alloc.available()[:2] == (40, 40)
