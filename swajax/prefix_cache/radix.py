"""The radix prefix cache with a full and an SWA component (host code, no JAX).

Every node holds the full-pool slots of its tokens and a flag saying whether their SWA KV is live.
Matching follows the **window hit rule**: a match may end at a node only if at least W
contiguous live-SWA tokens precede the end (or the whole path from the root is live), because a
request resuming there reads the SWA KV of the last W tokens. Two recency lists drive eviction:
full eviction deletes unlocked leaves (freeing full and SWA KV); SWA eviction frees the SWA KV
of unlocked nodes, turning internal ones into tombstones. A lock holds the full KV of the whole
path but the SWA KV of only the last W tokens.

Rule set: the legacy tree's (spec §8.3) — a leaf is never a tombstone unless a request still
holds it; childless tombstones are deleted — with three fixes from the unified tree (§8.4):
window locks pass over tombstones and remember them, so a revival under a lock cannot unbalance
the counts; leaves are capped to one page-aligned window at insert (`cap_leaf_to_window`); and
unfinished requests insert with their `swa_evicted_seqlen`. See BUILD_NOTES.md.

Pool modes: "hybrid" (full + SWA pools), "all_swa" (no full layers: the one pool is the SWA
pool, so a tombstone holds no KV at all; under the prefill-floor rule a plain tree, without a
window rule or tombstones) and "single" (no separate SWA memory: no window rule, no tombstones;
`window` must be None).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.arith import round_up
from swajax.observe import Observer, observed
from swajax.prefix_cache.eviction import Evictor
from swajax.prefix_cache.explain import INSERTED, Ghosts, explain
from swajax.prefix_cache.hit_rule import hit_end
from swajax.prefix_cache.host_tier import HostTier
from swajax.prefix_cache.locks import LockHandle, WindowLocks
from swajax.prefix_cache.match_result import MatchResult
from swajax.prefix_cache.node import LRUList, Node, device_chain
from swajax.prefix_cache.policy import SWAJAX, CachePolicy
from swajax.prefix_cache.protocol import Releaser
from swajax.prefix_cache.requests import RequestCaching
from swajax.sizing import PoolMode

_EMPTY = np.zeros(0, np.int32)
__all__ = ["LockHandle", "MatchResult", "RadixCache", "Releaser"]


@dataclasses.dataclass
class Sizes:
    """Tokens the tree holds, by pool and by whether a lock protects them."""

    full_evictable: int = 0
    full_protected: int = 0
    swa_evictable: int = 0
    swa_protected: int = 0


class RadixCache:
    """The tree, and the owner of three collaborators that work on it through its public
    operations (walk, split, refresh, free_node, free_request, insert and `sizes`): `WindowLocks`
    (locks.py), `Evictor` (eviction.py) and `RequestCaching` (requests.py)."""

    observer: Observer | None = None  # swajax.observe: a recorder, if any

    def __init__(
        self,
        releaser: Releaser,
        *,
        page_size: int,
        window: int | None,
        pool_mode: PoolMode = PoolMode.HYBRID,
        cap_leaf_to_window: bool = True,
        policy: CachePolicy = SWAJAX,
        host_tier: tuple[int, int] | None = None,
    ):
        """`host_tier`: (full, SWA) token capacities of a host tier (host_tier.py), or None."""
        pool_mode = PoolMode(pool_mode)
        self.policy = policy
        if (window is None) != (pool_mode is PoolMode.SINGLE):
            raise ValueError(
                f"pool_mode {pool_mode!r} with window {window}: only 'single' has none"
            )
        self.releaser, self.ps, self.window, self.mode = releaser, page_size, window, pool_mode
        # The SWA component (the window hit rule, tombstones, window locks): none in a single
        # pool, and none in an all-SWA pool under the prefill-floor rule, whose tree never
        # holds a position the window freed (policy.py).
        self.swa = window is not None and not policy.floors_prefills(pool_mode)
        self.cap_leaf = cap_leaf_to_window
        self.root = Node()
        self.root.full_lock = self.root.swa_lock = 1
        self.full_lru, self.swa_lru = LRUList(), LRUList()
        self.sizes = Sizes()
        self.hit_tokens = self.tail_miss_tokens = 0
        # Evictions are numbered from 1 (explain.py); `evicting`: the one under way, if any.
        self.evictions, self.evicting = 0, None
        self.ghosts = Ghosts()
        self.evictor = Evictor(self)
        self.locks = WindowLocks(self, self.evictor)
        self.requests = RequestCaching(self)
        self.tier = HostTier.attach(self, host_tier)

    # ------------------------------------------------------------------------------------------
    # Sizes (tokens). Without an SWA component the SWA figures mirror the full ones.

    @property
    def full_evictable(self) -> int:
        return self.sizes.full_evictable

    @property
    def full_protected(self) -> int:
        return self.sizes.full_protected

    @property
    def swa_evictable(self) -> int:
        return self.sizes.swa_evictable if self.swa else self.sizes.full_evictable

    @property
    def swa_protected(self) -> int:
        return self.sizes.swa_protected if self.swa else self.sizes.full_protected

    # ------------------------------------------------------------------------------------------
    # The collaborators' operations, re-exported as the cache's API

    @observed
    def lock(self, node: Node) -> LockHandle:
        return self.locks.lock(node)

    def lock_cost(self, node: Node | None) -> int:
        """Full tokens a lock on `node` would take from the evictable ones (its path's unlocked
        nodes): admission counts them, since a hit's own prefix can be all the room there is."""
        if node is None:
            return 0
        return sum(len(x) for x in node.path_to_root() if x.full_lock == 0)

    @observed
    def unlock(self, handle: LockHandle | None) -> None:
        self.locks.unlock(handle)

    @observed
    def release_swa(self, handle: LockHandle) -> None:
        self.locks.release_swa(handle)

    @observed
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        self.evictions += 1
        self.evicting = self.evictions
        try:
            return self.evictor.evict(full_tokens, swa_tokens)
        finally:
            self.evicting = None

    @observed
    def cache_finished(self, tokens, slots, **kwargs) -> None:
        self.requests.cache_finished(tokens, slots, **kwargs)

    @observed
    def cache_unfinished(self, tokens, slots, **kwargs):
        return self.requests.cache_unfinished(tokens, slots, **kwargs)

    @property
    def tombstones(self) -> int:
        return sum(1 for node in self.nodes() if node.on_device and not node.swa_live)

    def nodes(self):
        """Every node but the root (depth first)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    # ------------------------------------------------------------------------------------------
    # Walking and splitting

    def aligned(self, tokens) -> tuple[int, ...]:
        return tuple(tokens[: len(tokens) // self.ps * self.ps])

    def _common(self, node_key, key, start) -> int:
        """Length of the common prefix of node_key and key[start:], rounded down to pages."""
        n = min(len(node_key), len(key) - start)
        if node_key[:n] != key[start : start + n]:
            n = next(i for i in range(n) if node_key[i] != key[start + i])
        return n // self.ps * self.ps

    def walk(self, key: tuple[int, ...], visit=None) -> list[Node]:
        """The nodes along `key` (page aligned) from the root, splitting where it diverges.

        `visit(node, start)`, if given, sees each node as it is reached (`start` = its first
        position) and returns the node to record and go on from (it may split it)."""
        node, path, i = self.root, [], 0
        while i < len(key):
            child = node.children.get(key[i : i + self.ps])
            if child is None:
                break
            n = self._common(child.key, key, i)
            if n < len(child):
                child = self.split(child, n)
            if visit is not None:
                child = visit(child, i)
            path.append(child)
            node, i = child, i + n
        return path

    def split(self, child: Node, k: int) -> Node:
        """Cut `child` after k tokens; returns the new upper node (the child keeps the rest)."""
        upper = Node(child.key[:k], child.value[:k], child.parent, child.swa_live)
        upper.full_lock, upper.swa_lock = child.full_lock, child.swa_lock
        upper.swa_tops, child.swa_tops = child.swa_tops, set()  # a window ends at the top part
        upper.swa_skips = set(child.swa_skips)
        upper.last_access = child.last_access
        upper.tombstoned_by = child.tombstoned_by
        child.parent.children[upper.key[: self.ps]] = upper
        child.key, child.value, child.parent = child.key[k:], child.value[k:], upper
        upper.children = {child.key[: self.ps]: child}
        if self.tier is not None:
            self.tier.split(upper, child, k)
        lrus = (self.full_lru, self.swa_lru) if self.swa and child.swa_live else (self.full_lru,)
        lrus = lrus if child.on_device else ()
        child.touch()
        for lru in lrus:
            if self.policy.window_recency and lru is self.swa_lru:
                lru.add_before(upper, child)  # the upper part takes its lower part's place
            else:
                lru.add(upper)
                lru.add(child)
        return upper

    def refresh(self, path: list[Node], swa: bool = True) -> None:
        for node in path:
            node.touch()
        self.full_lru.add_path(path)
        if self.swa and swa:
            self.swa_lru.add_path([node for node in self._window_part(path) if node.swa_live])

    def _window_part(self, path: list[Node]) -> list[Node]:
        """The nodes whose SWA recency a refresh of `path` renews: all of them, or under the
        window-recency rule those holding the last W + page-size tokens."""
        if not self.policy.window_recency or not self.window:
            return path
        keep, tokens = [], 0
        for node in reversed(path):
            if tokens >= self.window + self.ps:
                break
            keep.append(node)
            tokens += len(node)
        return keep[::-1]

    # ------------------------------------------------------------------------------------------
    # Match

    @observed
    def match(self, tokens) -> MatchResult:
        """Longest cached prefix of `tokens` that satisfies the window hit rule, with its
        explanation (`MatchResult.report`)."""
        key = self.aligned(tokens)
        path = self.walk(key)
        best = len(path)
        if self.swa:  # host-resident SWA counts as valid: a load brings it back
            best = hit_end(path, self.window, lambda node: node.swa_valid)
        loaded = (0, 0)
        if self.tier is not None:
            best, *loaded = self.tier.bring_back(path, best)
        accepted = path[:best]
        self.refresh(accepted)
        slots = np.concatenate([n.value for n in accepted]) if accepted else _EMPTY
        cut = device_chain(accepted[-1] if accepted else self.root, path[best:])
        tail = np.concatenate([n.value for n in cut]) if cut else _EMPTY
        self.hit_tokens += len(slots)
        self.tail_miss_tokens += len(tail)
        node = accepted[-1] if accepted else self.root
        report = explain(
            self, key, len(tokens), path, len(accepted), len(slots) + len(tail), tuple(loaded)
        )
        return MatchResult(slots, node, tail, cut[-1] if cut else None, tuple(loaded), report)

    # ------------------------------------------------------------------------------------------
    # Releasing KV the cache or a request held

    def free_node(self, node: Node) -> None:
        """Give back a node's KV (a tombstone holds only full KV, or nothing if all-SWA)."""
        if node.swa_live or self.mode is not PoolMode.ALL_SWA:
            self.releaser.free(node.value)

    def free_request(self, slots, start: int, evicted: int) -> None:
        """Give back a request's slots for positions [start, start + len): duplicates of the
        tree's. All-SWA: the positions before `evicted` were freed by eviction already."""
        if self.mode is PoolMode.ALL_SWA:
            slots = slots[max(0, evicted - start) :]
        self.releaser.free(slots)

    # ------------------------------------------------------------------------------------------
    # Insert

    @observed
    def insert(
        self,
        tokens,
        slots,
        prev_prefix_len: int = 0,
        swa_evicted_seqlen: int = 0,
        keep_tombstone_leaf: bool = False,
    ) -> int:
        """Cache tokens[:A] (A = page-aligned length) with their full slots; returns the overlap.

        Positions [0, prev_prefix_len) are the request's prefix that came from this tree (its
        slots are the tree's own). Positions before `swa_evicted_seqlen` have no live SWA KV and
        go in as tombstones; new SWA KV revives a tombstone. Slots duplicating cached tokens are
        freed.
        """
        key = self.aligned(tokens)
        value = np.array(slots[: len(key)], np.int32)  # the tree's own copy, never a view
        if self.swa and self.mode is PoolMode.HYBRID and swa_evicted_seqlen % self.ps:
            raise ValueError(f"swa_evicted_seqlen {swa_evicted_seqlen} is not page aligned")

        bounded = self.policy.window_recency  # no SWA refresh on the way down, one at the end

        def settle(node: Node, start: int) -> Node:
            part = value[start : start + len(node)]
            node = self._overlap(node, part, start, prev_prefix_len, swa_evicted_seqlen)
            self.refresh([node], swa=not bounded)
            return node

        path = self.walk(key, settle)
        node = path[-1] if path else self.root
        total = sum(len(x) for x in node.path_to_root())  # parts split off above count too
        if total < len(key):
            node = self._add_leaf(
                node, key[total:], value[total:], total, swa_evicted_seqlen, keep_tombstone_leaf
            )
        if bounded and self.swa and node is not self.root:
            path = self._window_part(list(node.path_to_root())[::-1])
            self.swa_lru.add_path([x for x in path if x.swa_live])
        return total

    def _overlap(self, node, req, start, prev, evicted) -> Node:
        """Settle the request's slots `req` for a node it shares; returns the deepest part."""
        if not node.on_device:  # (never the request's own prefix: a lock holds device KV)
            return self.tier.adopt(node, req, start, evicted)
        dup = max(0, prev - start)
        if dup >= len(node):
            return node  # the request's own cached prefix: these are the tree's slots
        if dup:  # the request's cached prefix ends inside the node
            self.split(node, dup)
            req, start = req[dup:], start + dup
        if node.swa_live or not self.swa:
            self.free_request(req, start, evicted)
        elif evicted <= start:
            self._revive(node, req)
        elif evicted < start + len(node):  # the request has SWA KV for the lower part only
            s = evicted - start
            self.split(node, s)
            self.free_request(req[:s], start, evicted)
            self._revive(node, req[s:])
        else:
            self.free_request(req, start, evicted)
        return node

    def _revive(self, node: Node, req) -> None:
        """A tombstone takes the SWA KV a request computed for the same tokens."""
        if node.full_lock == 0 or self.mode is PoolMode.ALL_SWA:
            self.free_node(node)
            node.value = np.array(req, np.int32)
        else:  # other requests read the node's full slots: move the SWA KV under them
            self.releaser.move_swa(node.value, req)
            self.releaser.free(req)
        node.swa_live, node.tombstoned_by = True, None
        if node.host_swa is not None:
            self.tier.forget_swa(node)
        self.swa_lru.add(node)
        if node.swa_lock:  # a tombstone a node-window lock passed: the lock now holds it
            self.sizes.swa_protected += len(node)
        else:
            self.sizes.swa_evictable += len(node)

    def _new_node(self, parent, key, value, live) -> Node:
        if not live and self.mode is PoolMode.ALL_SWA:  # the slots were freed with the SWA KV
            value = np.zeros(len(key), np.int32)
        node = Node(key, value, parent, live)
        if not live and self.swa:
            node.tombstoned_by = INSERTED
        parent.children[key[: self.ps]] = node
        self.full_lru.add(node)
        self.sizes.full_evictable += len(node)
        if live and self.swa:
            self.swa_lru.add(node)
            self.sizes.swa_evictable += len(node)
        return node

    def _add_leaf(self, parent, key, value, start, evicted, keep_tombstone_leaf) -> Node:
        """Add the new suffix under `parent`; returns the deepest node the insert ends at."""
        end = start + len(key)
        if self.swa and evicted >= end:
            if keep_tombstone_leaf:  # the caller locks it at once (an unfinished request)
                return self._new_node(parent, key, value, live=False)
            # a leaf is never a tombstone: drop what could never be matched
            self.free_request(value, start, evicted)
            return parent
        if self.swa and evicted > start:
            s = evicted - start
            parent = self._new_node(parent, key[:s], value[:s], live=False)
            key, value = key[s:], value[s:]
        leaf = self._new_node(parent, key, value, live=True)
        tail = round_up(self.window or 0, self.ps)
        if self.swa and self.cap_leaf and len(leaf) > tail:
            self.split(leaf, len(leaf) - tail)  # so a window lock pins one window, not more
        return leaf
