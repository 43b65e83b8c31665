"""Property tests: the prefix cache and the allocator together (spec §11, §13 items 12-19)."""

import hypothesis.strategies as st
import pytest
from helpers.allocator_model import ModelAllocator
from helpers.cache_sim import evict_window, finish, grow, start, start_rebuild, unfinished
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swajax.prefix_cache import RadixCache, check_invariants
from swajax.prefix_cache.policy import PROFILES

ALPHABET = st.sampled_from([1, 2, 3])  # few symbols: requests share prefixes and diverge


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        ps=st.sampled_from([1, 2, 4]),
        window=st.sampled_from([1, 3, 4, 8]),
        cap=st.booleans(),
        mode=st.sampled_from(["hybrid", "hybrid", "all_swa"]),
        policy=st.sampled_from(sorted(PROFILES)),  # every cache-policy profile
    )
    def setup(self, ps, window, cap, mode, policy):
        self.ps, self.window, self.mode = ps, window, mode
        self.full, self.swa = 40 * ps, (40 if mode == "all_swa" else 24) * ps
        self.alloc = ModelAllocator(self.full, self.swa, ps, mode)
        self.cache = RadixCache(
            self.alloc,
            page_size=ps,
            window=window,
            pool_mode=mode,
            cap_leaf_to_window=cap,
            policy=PROFILES[policy],
        )
        self.reqs = []

    def _pick(self, data):
        return self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]

    @rule(data=st.data())
    def start_request(self, data):
        tokens = data.draw(st.lists(ALPHABET, min_size=1, max_size=6 * self.ps))
        req = start(self.cache, self.alloc, tokens)
        if req is None:
            self.cache.evict(len(tokens), len(tokens))
            req = start(self.cache, self.alloc, tokens)
        if req is not None:
            self.reqs.append(req)

    @precondition(lambda self: self.mode == "hybrid")
    @rule(data=st.data(), reach=st.integers(0, 4))
    def start_tail_rebuild(self, data, reach):
        """A request that resumes a tombstoned match by a tail rebuild: a long prompt is cached,
        part of its SWA KV evicted, and a request sharing some of it starts (if one applies)."""
        first = data.draw(st.lists(ALPHABET, min_size=8 * self.ps, max_size=16 * self.ps))
        req = start(self.cache, self.alloc, first)
        if req is None:
            return
        finish(self.cache, req)
        self.cache.evict(0, data.draw(st.integers(1, 12 * self.ps)))
        cut = data.draw(st.integers(1, len(first)))
        tokens = first[:cut] + data.draw(st.lists(ALPHABET, min_size=1, max_size=8))
        req = start_rebuild(self.cache, self.alloc, tokens, reach=reach, window=self.window)
        if req is not None:
            self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def grow_request(self, data):
        grow(self.alloc, self._pick(data), data.draw(st.lists(ALPHABET, min_size=1, max_size=8)))

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
            self.cache.release_swa(req.handle)  # the cached prefix left the request's window

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
        assert after[1] - before[1] == got_swa  # §13 item 18: counts match the allocator
        if self.mode == "hybrid":
            assert after[0] - before[0] == got_full

    @rule(tokens=st.lists(ALPHABET, max_size=24))
    def match(self, tokens):
        self.cache.match(tokens)

    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        check_invariants(self.cache)
        self._accounting()

    def _accounting(self):
        """§11: available + evictable + protected + held by running requests == pool size."""
        ps, full_avail, swa_avail = self.ps, *self.alloc.available()[:2]
        held_full = held_swa = 0
        for req in self.reqs:
            allocated = -(-len(req.tokens) // ps) * ps
            held_full += allocated - req.protected
            # the window freed [lowest, evicted): above the tree's prefix and the floor's page
            lowest = max(req.protected, -(-req.floor // ps) * ps)
            held_swa += allocated - req.protected - max(0, req.evicted - lowest)
        tree_swa = self.cache.swa_evictable + self.cache.swa_protected
        assert swa_avail + tree_swa + held_swa == self.swa
        if self.mode == "hybrid":
            tree_full = self.cache.full_evictable + self.cache.full_protected
            assert full_avail + tree_full + held_full == self.full

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for req in self.reqs:
            finish(self.cache, req)
        self.cache.evict(10**6, 10**6)
        check_invariants(self.cache)
        assert not self.cache.root.children
        assert self.alloc.available()[:2] == (
            self.full if self.mode == "hybrid" else self.swa,
            self.swa,
        )


TestCacheMachine = CacheMachine.TestCase
# 100 random runs in the default suite (about 40 s on one core); the slow case below runs 10,000.
TestCacheMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


@pytest.mark.slow
class TestCacheMachineSlow(CacheMachine.TestCase):
    settings = settings(max_examples=10_000, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------------------------------
# §13 item 15: soundness and maximality of the window hit rule.


def _rule_holds(path, window) -> bool:
    """The definition: the match end is preceded by >= W live tokens after the last tombstone,
    or the path has no tombstone at all."""
    gaps = [i for i, node in enumerate(path) if not node.swa_live]
    if not gaps:
        return True
    return sum(len(node) for node in path[gaps[-1] + 1 :]) >= window


@settings(max_examples=300, deadline=None)
@given(
    ps=st.sampled_from([1, 2]),
    window=st.sampled_from([1, 2, 3, 5]),
    ops=st.lists(
        st.tuples(
            st.lists(ALPHABET, min_size=1, max_size=14), st.integers(0, 14), st.integers(0, 3)
        ),
        min_size=1,
        max_size=12,
    ),
    extra=st.lists(ALPHABET, max_size=4),
    policy=st.sampled_from(sorted(PROFILES)),
)
def test_hit_rule_sound_and_maximal(ps, window, ops, extra, policy):
    alloc = ModelAllocator(512, 512, ps)
    cache = RadixCache(
        alloc, page_size=ps, window=window, cap_leaf_to_window=False, policy=PROFILES[policy]
    )
    for tokens, evicted, swa_evict in ops:
        n = len(tokens)
        evicted = min(evicted, n) // ps * ps
        _, slots, _ = alloc.alloc_extend([0], [n], [-1])
        alloc.free_swa(slots[:evicted])
        cache.insert(tokens, slots, swa_evicted_seqlen=evicted)
        alloc.free(slots[n // ps * ps :])
        cache.evict(0, swa_evict)
    # Query what was inserted (paths through tombstones), with and without a diverging tail.
    for query in [tokens + tail for tokens, _, _ in ops for tail in ([], extra)]:
        path = cache.walk(cache.aligned(query))  # every node on the key's path
        result = cache.match(query)
        depth = next((i + 1 for i, node in enumerate(path) if node is result.node), 0)
        accepted = path[:depth]
        assert len(result) == sum(len(node) for node in accepted)
        assert len(result) % ps == 0 and len(result) <= len(query) // ps * ps
        assert _rule_holds(accepted, window)  # sound
        deeper = [d for d in range(depth + 1, len(path) + 1) if _rule_holds(path[:d], window)]
        assert not deeper, f"a deeper boundary {deeper} also satisfies the rule"  # maximal
        check_invariants(cache)
