"""Eviction: the full evictor deletes unlocked leaves; the SWA evictor makes tombstones."""

from __future__ import annotations

import numpy as np

from swajax.prefix_cache.node import Node
from swajax.prefix_cache.protocol import Tree
from swajax.sizing import PoolMode


class Evictor:
    """Works on a `RadixCache` through its public operations: tombstoning, leaf deletion and
    `evict`."""

    def __init__(self, tree: Tree):
        self.tree = tree

    def tombstone(self, node: Node, counted: bool = True) -> None:
        t = self.tree
        t.releaser.free_swa(node.value)
        t.swa_lru.remove(node)
        node.swa_live = False
        if t.mode is PoolMode.ALL_SWA:  # the one pool's slots went back: keep no stale numbers
            node.value = np.zeros(len(node), np.int32)
        if counted:
            t.sizes.swa_evictable -= len(node)

    def delete_leaf(self, node: Node) -> tuple[int, int]:
        """Delete an unlocked leaf, then its childless unlocked tombstone ancestors."""
        t = self.tree
        full = swa = 0
        first = True
        while node is not t.root and node.is_leaf and node.full_lock == 0:
            if not first and (node.swa_live or t.policy.keep_childless_tombstones):
                break
            first = False
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
        full = swa = 0
        while full < full_tokens:
            leaf = t.full_lru.oldest(lambda n: n.is_leaf and n.full_lock == 0)
            if leaf is None:
                break
            f, s = self.delete_leaf(leaf)
            full, swa = full + f, swa + s
        while t.swa and swa < swa_tokens:
            node = t.swa_lru.oldest(lambda n: n.swa_lock == 0)
            if node is None:
                break
            if node.is_leaf and node.full_lock == 0:
                f, s = self.delete_leaf(node)
                full, swa = full + f, swa + s
            else:
                swa += len(node)
                self.tombstone(node)
        if t.mode is PoolMode.ALL_SWA:
            full = swa  # one pool
        return full, (swa if t.swa else full)
