"""Window locks: a lock pins the full KV of a whole path but the SWA KV of its last W tokens."""

from __future__ import annotations

import dataclasses

from swajax.arith import round_up
from swajax.prefix_cache.eviction import Evictor
from swajax.prefix_cache.explain import RELEASED
from swajax.prefix_cache.node import Node
from swajax.prefix_cache.protocol import Tree


@dataclasses.dataclass
class LockHandle:
    node: Node
    id: int
    swa_released: bool = False


class WindowLocks:
    """Works on a `RadixCache` through its public operations: lock, unlock and early SWA
    release (deleting or tombstoning through the tree's `Evictor`)."""

    def __init__(self, tree: Tree, evictor: Evictor):
        self.tree, self.evictor = tree, evictor
        self.next_id = 1  # handle ids (a snapshot keeps the count: prefix_cache/state.py)

    def lock(self, node: Node) -> LockHandle:
        """Lock the full KV from `node` to the root and the SWA KV of the last W tokens."""
        t = self.tree
        handle = LockHandle(node, self.next_id)
        self.next_id += 1
        if t.swa:  # first: the window may split a node, and the full lock then covers both parts
            (self._lock_nodes if t.policy.node_window_lock else self._lock_window)(handle)
        for x in node.path_to_root():
            if x.full_lock == 0:
                t.sizes.full_evictable -= len(x)
                t.sizes.full_protected += len(x)
            x.full_lock += 1
        return handle

    def _lock_window(self, handle: LockHandle) -> None:
        """swajax's rule: the last W live tokens exactly; tombstones are passed over."""
        t = self.tree
        size = 0
        for x in handle.node.path_to_root():
            if not x.swa_live:
                x.swa_skips.add(handle.id)  # remembered, so the release skips it too
                continue
            if t.cap_leaf:
                # Pin exactly the window: a node reaching past it is split first, so its upper
                # part stays SWA-evictable (a long chunk node once pinned W + chunk tokens and
                # a small SWA pool had no room left for the next chunk). Part of the leaf cap.
                needed = round_up(t.window - size, t.ps)
                if len(x) > needed:
                    t.split(x, len(x) - needed)
            self._pin(x)
            size += len(x)
            if size >= t.window:
                x.swa_tops.add(handle.id)
                return

    def _lock_nodes(self, handle: LockHandle) -> None:
        """The node-window rule: whole nodes up to W tokens of path, tombstones counted (they
        take a lock count, so the release walks exactly the same nodes)."""
        t = self.tree
        covered = 0
        for x in handle.node.path_to_root():
            self._pin(x)
            covered += len(x)
            if covered >= t.window:
                x.swa_tops.add(handle.id)
                return

    def _pin(self, x: Node) -> None:
        if x.swa_lock == 0 and x.swa_live:
            self.tree.sizes.swa_evictable -= len(x)
            self.tree.sizes.swa_protected += len(x)
        x.swa_lock += 1

    def _swa_unlock(self, handle: LockHandle, on_zero) -> None:
        """Drop the handle's SWA lock from its node up to the top of its window."""
        t = self.tree
        handle.swa_released = True
        for x in handle.node.path_to_root():
            if handle.id in x.swa_skips:
                x.swa_skips.discard(handle.id)
                continue
            x.swa_lock -= 1
            if x.swa_lock == 0 and x.swa_live:  # (a tombstone is locked by node_window_lock)
                t.sizes.swa_protected -= len(x)
                on_zero(x)
            if handle.id in x.swa_tops:
                x.swa_tops.discard(handle.id)
                return

    def unlock(self, handle: LockHandle | None) -> None:
        """Release a lock (never frees anything it still covers, but a tombstone leaf)."""
        t = self.tree
        if handle is None:
            return
        if t.swa and not handle.swa_released:
            self._swa_unlock(handle, self._make_swa_evictable)
        for x in handle.node.path_to_root():
            x.full_lock -= 1
            if x.full_lock == 0:
                t.sizes.full_protected -= len(x)
                t.sizes.full_evictable += len(x)
        node = handle.node
        if t.policy.keep_childless_tombstones:  # it stays, holding full KV only
            return
        if node is not t.root and not node.swa_live and node.is_leaf and node.full_lock == 0:
            self.evictor.delete_leaf(node)  # a tombstone leaf outlives no lock

    def release_swa(self, handle: LockHandle) -> None:
        """Release only the SWA part of a lock early (the request has moved past its window)."""
        t = self.tree
        if t.swa and not handle.swa_released:
            # The lazy rule leaves it to LRU eviction (the request still holds the full KV, so
            # no node it releases here can be deleted).
            lazy = t.policy.lazy_window_release
            on_zero = self._make_swa_evictable if lazy else self._tombstone_leaf_or_evictable
            self._swa_unlock(handle, on_zero)

    def _make_swa_evictable(self, node: Node) -> None:
        t = self.tree
        t.sizes.swa_evictable += len(node)

    def _tombstone_leaf_or_evictable(self, node: Node) -> None:
        t = self.tree
        if node.is_leaf:  # nobody else can resume at a leaf this request still holds
            self.evictor.tombstone(node, counted=False, split=False, cause=RELEASED)  # in a walk
        else:
            t.sizes.swa_evictable += len(node)
