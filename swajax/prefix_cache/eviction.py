"""Eviction: the full evictor deletes unlocked leaves; the SWA evictor makes tombstones."""

from __future__ import annotations

from swajax.prefix_cache.node import Node
from swajax.sizing import PoolMode


class Eviction:
    """Mixin of `RadixCache`: tombstoning, leaf deletion and `evict`."""

    def _tombstone(self, node: Node, counted: bool = True) -> None:
        self.releaser.free_swa(node.value)
        self.swa_lru.remove(node)
        node.swa_live = False
        if counted:
            self.swa_evictable_ -= len(node)

    def _delete_leaf(self, node: Node) -> tuple[int, int]:
        """Delete an unlocked leaf, then its childless unlocked tombstone ancestors."""
        full = swa = 0
        first = True
        while node is not self.root and node.is_leaf and node.full_lock == 0:
            if not first and node.swa_live:
                break
            first = False
            self._free_node(node)
            live = node.swa_live and self.swa
            full += len(node) if (node.swa_live or self.mode is not PoolMode.ALL_SWA) else 0
            swa += len(node) if live else 0
            self.full_evictable -= len(node)
            self.swa_evictable_ -= len(node) if live else 0
            self.full_lru.remove(node)
            self.swa_lru.remove(node)
            parent = node.parent
            del parent.children[node.key[: self.ps]]
            node = parent
        return full, swa

    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        """Free at least the requested tokens where unlocked nodes allow (whole nodes).

        Returns (full tokens freed, SWA tokens freed).
        """
        if not self.swa:
            full_tokens = max(full_tokens, swa_tokens)
        full = swa = 0
        while full < full_tokens:
            leaf = self.full_lru.oldest(lambda n: n.is_leaf and n.full_lock == 0)
            if leaf is None:
                break
            f, s = self._delete_leaf(leaf)
            full, swa = full + f, swa + s
        while self.swa and swa < swa_tokens:
            node = self.swa_lru.oldest(lambda n: n.swa_lock == 0)
            if node is None:
                break
            if node.is_leaf and node.full_lock == 0:
                f, s = self._delete_leaf(node)
                full, swa = full + f, swa + s
            else:
                swa += len(node)
                self._tombstone(node)
        if self.mode is PoolMode.ALL_SWA:
            full = swa  # one pool
        return full, (swa if self.swa else full)
