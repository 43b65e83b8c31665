"""Eviction: the full evictor deletes unlocked leaves; the SWA evictor makes tombstones."""

from __future__ import annotations

import numpy as np

from swajax.prefix_cache.explain import RELEASED
from swajax.prefix_cache.node import Node
from swajax.prefix_cache.protocol import Tree
from swajax.sizing import PoolMode


class Evictor:
    """Works on a `RadixCache` through its public operations: tombstoning, leaf deletion and
    `evict`."""

    def __init__(self, tree: Tree):
        self.tree = tree

    def tombstone(
        self, node: Node, counted: bool = True, split: bool = True, cause: int | None = None
    ) -> None:
        """Free a live node's SWA KV (with a host tier, its last window is copied there first;
        the node may be split at the window, unless `split` is False, as inside a lock's walk,
        and both parts become tombstones)."""
        t = self.tree
        parts = t.tier.copy_window(node, split) if t.tier is not None else [node]
        for part in parts:
            self._tombstone(part, counted, t.evicting if cause is None else cause)

    def _tombstone(self, node: Node, counted: bool, cause: int | None) -> None:
        t = self.tree
        t.releaser.free_swa(node.value)
        t.swa_lru.remove(node)
        node.swa_live, node.tombstoned_by = False, cause
        if t.mode is PoolMode.ALL_SWA:  # the one pool's slots went back: keep no stale numbers
            node.value = np.zeros(len(node), np.int32)
        if counted:
            t.sizes.swa_evictable -= len(node)

    def delete_leaf(self, node: Node) -> tuple[int, int]:
        """Delete an unlocked device leaf, then its childless unlocked tombstone ancestors. With
        a host tier the leaf moves to the host instead where it can (host_tier.py)."""
        t = self.tree
        full = swa = 0
        first = True
        while (
            node is not t.root
            and node.full_lock == 0
            and (node.device_leaf if first else node.is_leaf)
        ):
            if not first and (node.swa_valid or t.policy.keep_childless_tombstones):
                break
            first = False
            if t.tier is not None:
                moved = t.tier.move_to_host(node)
                if moved is not None:
                    return full + moved[0], swa + moved[1]
                t.tier.drop_subtree(node)
            # Remembered for explanations: an eviction's, or the tombstone's own cause (a
            # tombstone leaf deleted as its last lock goes).
            cause = t.evicting if t.evicting is not None else node.tombstoned_by
            t.ghosts.record(node, t.ps, RELEASED if cause is None else cause)
            t.free_node(node)
            live = node.swa_live and t.swa
            full += len(node) if (node.swa_live or t.mode is not PoolMode.ALL_SWA) else 0
            swa += len(node) if live else 0
            t.sizes.full_evictable -= len(node)
            t.sizes.swa_evictable -= len(node) if live else 0
            t.full_lru.remove(node)
            t.swa_lru.remove(node)
            parent = node.parent
            del parent.children[node.key[: t.ps]]
            node = parent
        return full, swa

    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        """Free at least the requested tokens where unlocked nodes allow (whole nodes).

        Returns (full tokens freed, SWA tokens freed).
        """
        t = self.tree
        if not t.swa:
            full_tokens = max(full_tokens, swa_tokens)
        if t.tier is not None:  # making host room may delete device tombstones on the side
            before = t.releaser.available()[:2]
            self._evict(full_tokens, swa_tokens)
            return tuple(b - a for a, b in zip(before, t.releaser.available()[:2]))
        return self._evict(full_tokens, swa_tokens)

    def _evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        t = self.tree
        full = swa = 0
        while full < full_tokens:
            leaf = t.full_lru.oldest(lambda n: n.device_leaf and n.full_lock == 0)
            if leaf is None:
                break
            f, s = self.delete_leaf(leaf)
            full, swa = full + f, swa + s
        while t.swa and swa < swa_tokens:
            node = t.swa_lru.oldest(lambda n: n.swa_lock == 0)
            if node is None:
                break
            if node.device_leaf and node.full_lock == 0:
                f, s = self.delete_leaf(node)
                full, swa = full + f, swa + s
            else:
                swa += len(node)
                self.tombstone(node)
        if t.mode is PoolMode.ALL_SWA and t.swa:
            full = swa  # one pool
        return full, (swa if t.swa else full)
