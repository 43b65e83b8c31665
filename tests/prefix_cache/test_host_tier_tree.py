"""The radix cache with a host tier (host_tier.py): a state machine over the tree, the allocator
model and a content model of every slot and host page, so each hit (from the device or brought
back from the host) is checked to read exactly the KV a cold run wrote; plus hand scenarios."""

import hypothesis.strategies as st
import numpy as np
import pytest
from helpers.cache_sim import evict_window, finish, grow, start, start_rebuild, unfinished
from helpers.host_model import HostModelAllocator
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swajax.prefix_cache import RadixCache, check_invariants
from swajax.prefix_cache.policy import PROFILES

ALPHABET = st.sampled_from([1, 2, 3])
POLICIES = sorted(set(PROFILES) - {"sglang-0.5.23"})  # SGLang has no host tier


def check_kv(alloc, cache, tokens, slots) -> None:
    """A hit's slots hold the KV of exactly its tokens: full KV everywhere, SWA KV over the
    last W positions (what a query at its end reads)."""
    n = len(slots)
    for i, slot in enumerate(slots):
        key = tuple(tokens[: i + 1])
        assert alloc.full_kv.get(int(slot)) == key, f"full KV of position {i} is wrong"
        if i >= n - cache.window:
            swa = alloc.translate(int(slot))
            assert swa > 0 and alloc.swa_kv.get(swa) == key, f"SWA KV of position {i} is wrong"


def drain(cache) -> None:
    """Evict everything from both tiers."""
    cache.evict(10**6, 10**6)
    tier = cache.tier
    tier.make_room(tier.full, tier.full.total)
    tier.make_room(tier.swa, tier.swa.total)
    cache.evict(10**6, 10**6)


class HostTierMachine(RuleBasedStateMachine):
    @initialize(
        ps=st.sampled_from([1, 2, 4]),
        window=st.sampled_from([1, 3, 4, 8]),
        cap=st.booleans(),
        policy=st.sampled_from(POLICIES),
        host=st.sampled_from([(8, 4), (24, 8), (64, 32)]),  # host (full, SWA) pages
    )
    def setup(self, ps, window, cap, policy, host):
        self.ps, self.window = ps, window
        self.full, self.swa = 40 * ps, 24 * ps
        self.alloc = HostModelAllocator(self.full, self.swa, ps)
        self.cache = RadixCache(
            self.alloc,
            page_size=ps,
            window=window,
            cap_leaf_to_window=cap,
            policy=PROFILES[policy],
            host_tier=(host[0] * ps, host[1] * ps),
        )
        self.reqs = []

    def _pick(self, data):
        return self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]

    def _started(self, req, computed_from: int):
        check_kv(self.alloc, self.cache, req.tokens, req.slots[:computed_from])
        self.alloc.write(req.slots[computed_from:], req.tokens, computed_from)
        self.reqs.append(req)

    @rule(data=st.data())
    def start_request(self, data):
        tokens = data.draw(st.lists(ALPHABET, min_size=1, max_size=6 * self.ps))
        req = start(self.cache, self.alloc, tokens)
        if req is None:
            self.cache.evict(len(tokens), len(tokens))
            req = start(self.cache, self.alloc, tokens)
        if req is not None:
            self._started(req, req.protected)

    @rule(data=st.data(), reach=st.integers(0, 4))
    def start_tail_rebuild(self, data, reach):
        first = data.draw(st.lists(ALPHABET, min_size=8 * self.ps, max_size=16 * self.ps))
        req = start(self.cache, self.alloc, first)
        if req is None:
            return
        self.alloc.write(req.slots[req.protected :], req.tokens, req.protected)
        finish(self.cache, req)
        self.cache.evict(0, data.draw(st.integers(1, 12 * self.ps)))
        cut = data.draw(st.integers(1, len(first)))
        tokens = first[:cut] + data.draw(st.lists(ALPHABET, min_size=1, max_size=8))
        req = start_rebuild(self.cache, self.alloc, tokens, reach=reach, window=self.window)
        if req is not None:  # recomputed from s0 (the full layers copy, the rest recompute)
            self.alloc.write(req.slots[req.protected :], req.tokens, req.protected)
            self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def grow_request(self, data):
        req = self._pick(data)
        n = len(req.tokens)
        if grow(self.alloc, req, data.draw(st.lists(ALPHABET, min_size=1, max_size=8))):
            self.alloc.write(req.slots[n:], req.tokens, n)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def evict_out_of_window(self, data):
        evict_window(self.alloc, self._pick(data), window=self.window, page_size=self.ps)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cache_unfinished(self, data):
        unfinished(self.cache, self._pick(data))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def early_swa_release(self, data):
        req = self._pick(data)
        if req.handle is not None and len(req.tokens) - 1 - self.window >= req.protected:
            self.cache.release_swa(req.handle)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), insert=st.booleans())
    def finish_request(self, data, insert):
        req = self._pick(data)
        self.reqs.remove(req)
        finish(self.cache, req, insert)

    @rule(full=st.integers(0, 16), swa=st.integers(0, 16))
    def evict(self, full, swa):
        before = self.alloc.available()
        got_full, got_swa = self.cache.evict(full, swa)
        after = self.alloc.available()
        assert after[0] - before[0] == got_full and after[1] - before[1] == got_swa

    @rule(tokens=st.lists(ALPHABET, max_size=24))
    def match(self, tokens):
        result = self.cache.match(tokens)
        check_kv(self.alloc, self.cache, tokens, result.slots)

    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        check_invariants(self.cache)
        ps, (full_avail, swa_avail, _) = self.ps, self.alloc.available()
        held_full = held_swa = 0
        for req in self.reqs:
            allocated = -(-len(req.tokens) // ps) * ps
            held_full += allocated - req.protected
            held_swa += allocated - max(req.protected, req.evicted)
        c = self.cache
        assert swa_avail + c.swa_evictable + c.swa_protected + held_swa == self.swa
        assert full_avail + c.full_evictable + c.full_protected + held_full == self.full

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for req in self.reqs:
            finish(self.cache, req)
        drain(self.cache)
        check_invariants(self.cache)
        assert not self.cache.root.children
        assert self.alloc.available()[:2] == (self.full, self.swa)
        assert self.cache.tier.full.used == self.cache.tier.swa.used == 0


TestHostTierMachine = HostTierMachine.TestCase
TestHostTierMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@pytest.mark.slow
class TestHostTierMachineSlow(HostTierMachine.TestCase):
    settings = settings(max_examples=5_000, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------------------------------
# Scenarios


def _cache(ps=2, window=4, full=64, swa=32, host=(64, 32)):
    alloc = HostModelAllocator(full, swa, ps)
    cache = RadixCache(alloc, page_size=ps, window=window, host_tier=host, policy=PROFILES["lean"])
    return alloc, cache


def _cached(alloc, cache, tokens):
    req = start(cache, alloc, tokens)
    alloc.write(req.slots[req.protected :], req.tokens, req.protected)
    finish(cache, req)


def test_full_eviction_moves_to_host_and_a_hit_loads_it_back():
    alloc, cache = _cache()
    tokens = list(range(1, 17))
    _cached(alloc, cache, tokens)
    full, swa = cache.evict(10**6, 0)
    assert full == 16 and cache.tier.full.used == 8  # moved, not deleted
    assert alloc.available()[:2] == (64, 32)
    assert cache.match(tokens + [99]).loaded == (16, 4)  # full KV, and the last window's SWA
    check_invariants(cache)
    result = cache.match(tokens + [99])
    assert len(result) == 16 and result.loaded == (0, 0)  # on the device again
    check_kv(alloc, cache, tokens, result.slots)
    assert cache.tier.full.used == 0


def test_a_tombstone_with_a_host_window_is_a_hit():
    alloc, cache = _cache()
    shared, a, b = list(range(1, 9)), [20, 21, 22, 23], [30, 31, 32, 33]
    _cached(alloc, cache, shared + a)
    _cached(alloc, cache, shared + b)  # `shared` is now its own node, with two children
    node = cache.walk(tuple(shared))[-1]  # the node ending where the prompts diverge
    assert len(node) <= 4 and len(node.children) == 2
    cache.evictor.tombstone(node)
    assert not node.swa_live and node.host_swa is not None and cache.tier.saved[1] == 4
    result = cache.match(shared + [7, 7])
    assert len(result) == 8 and result.loaded == (0, 4) and node.swa_live
    check_kv(alloc, cache, shared, result.slots)
    check_invariants(cache)


def test_without_room_on_the_device_a_hit_falls_back_to_the_device_part():
    alloc, cache = _cache(full=32, swa=32)
    tokens = list(range(1, 17))
    _cached(alloc, cache, tokens)
    cache.evict(10**6, 0)
    held = start(cache, alloc, [50 + i for i in range(30)])  # every device page in use
    assert held is not None and alloc.available()[0] <= 2
    result = cache.match(tokens + [99])
    assert len(result) == 0 and result.loaded == (0, 0)
    check_invariants(cache)
    finish(cache, held, insert=False)
    assert len(cache.match(tokens + [99])) == 16


def test_host_eviction_is_lru_and_keeps_no_useless_host_leaf():
    alloc, cache = _cache(host=(16, 4))  # room for one 16-token prefix (tokens)
    first, second = list(range(1, 17)), list(range(40, 56))
    _cached(alloc, cache, first)
    cache.evict(10**6, 0)
    _cached(alloc, cache, second)
    cache.evict(10**6, 0)
    check_invariants(cache)
    assert len(cache.match(first + [0])) == 0  # dropped for the newer one
    assert len(cache.match(second + [0])) == 16


def test_insert_through_a_host_node_takes_the_request_kv():
    alloc, cache = _cache()
    tokens = list(range(1, 17))
    _cached(alloc, cache, tokens)
    cache.evict(10**6, 0)
    req = start(cache, alloc, [5])  # no hit: computes its own KV for another prompt
    finish(cache, req, insert=False)
    alloc2 = alloc
    _, slots, _ = alloc2.alloc_extend([0], [16], [-1])
    slots = np.asarray(slots, np.int32)
    alloc.write(slots, tokens, 0)
    cache.insert(tokens, slots)  # the same tokens computed again: the node adopts them
    check_invariants(cache)
    assert cache.tier.full.used == 0
    result = cache.match(tokens + [1])
    assert len(result) == 16 and result.loaded == (0, 0)
    check_kv(alloc, cache, tokens, result.slots)
