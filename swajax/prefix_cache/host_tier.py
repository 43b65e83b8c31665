"""The host tier of the radix cache: KV the device tree evicts moves to host memory, and a hit
brings it back (host code, no JAX; the bytes move in the runner, `runner/host_kv.py`).

Per node and component there are three places: full KV on the device, on the host
(`Node.host_full`) or gone (the node is deleted); SWA KV live on the device, on the host
(`Node.host_swa`) or gone (a tombstone). Rules (reasons in BUILD_NOTES.md, "Host tier"):

- **Written when evicted** (write-back): full eviction of a device leaf moves its full KV to the
  host (the node stays, host-resident, so its subtree stays matchable); SWA eviction copies the
  SWA KV of the node's last window (`round_up(W, page)` tokens; a longer node is split there and
  its upper part tombstoned without a copy), the only SWA KV a hit ending at the node reads.
- **Device nodes are closed upwards**: a host-resident node's descendants are host-resident, so
  a lock (which holds a whole path) only ever holds device KV, and the device evictors take
  *device leaves* (no device child) as they took leaves.
- **Hits**: the window rule counts host-resident SWA as valid. The match then loads what the
  request reads (the path's host-resident full KV, and the SWA KV of its last W tokens) into
  device pages it claims through the releaser, evicting device KV (to the host) first if the
  pools lack room, with the matched path pinned; if the room cannot be made, the match falls back
  to the device-only hit. A loaded component leaves the host (one place per component).
- **Host eviction** is LRU over the nodes holding host KV: full pages come from host-resident
  leaves (deleted), SWA pages from any node's host window (dropped). A host-resident leaf without
  a host window can never end a valid match and is deleted with its last child.
"""

from __future__ import annotations

import contextlib

import numpy as np

from swajax.arith import round_up
from swajax.errors import InputError
from swajax.prefix_cache.hit_rule import hit_end
from swajax.prefix_cache.host_pages import HostPages
from swajax.prefix_cache.node import LRUList, Node
from swajax.prefix_cache.protocol import Tree
from swajax.sizing import PoolMode


class HostTier:
    """Works on a `RadixCache` through its public operations (split, evict, the LRU lists and
    size counters, `device_leaf_removed`)."""

    def __init__(self, tree: Tree, full_tokens: int, swa_tokens: int):
        self.tree = tree
        ps = tree.ps
        self.full, self.swa = HostPages(full_tokens // ps), HostPages(swa_tokens // ps)
        self.lru = LRUList()  # nodes holding host KV, least recently saved first
        # Tokens written to the host and brought back, per component (full, SWA).
        self.saved, self.loaded = [0, 0], [0, 0]

    @classmethod
    def attach(cls, tree: Tree, capacities: tuple[int, int] | None) -> HostTier | None:
        """The tier for `tree` of (full, SWA) token `capacities`, or None without them."""
        if capacities is None:
            return None
        if tree.mode is not PoolMode.HYBRID:
            raise InputError(f"a host tier needs hybrid pools, not {tree.mode.value!r}")
        if not tree.policy.host_tier:
            raise InputError(
                f"cache policy {tree.policy.name!r} has no host tier (SGLang 0.5.23 keeps no "
                "hybrid SWA KV on the host); leave the host cache at 0"
            )
        return cls(tree, *capacities)

    @property
    def window_tokens(self) -> int:
        return round_up(self.tree.window or 0, self.tree.ps)

    @staticmethod
    def _branch_end(node: Node) -> bool:
        """Whether a hit is likely to end at the node's end: a leaf's end (a prompt or a turn
        ended there) or a branch point. A node with one child mostly ends where a split cut it
        (the leaf cap, a lock's window), and its successor's window serves the path."""
        return len(node.children) != 1

    def _pages(self, node: Node) -> int:
        return len(node) // self.tree.ps

    # ------------------------------------------------------------------------------------------
    # Host pages

    def _take(self, store: HostPages, n: int) -> np.ndarray | None:
        if store.free < n:
            self.make_room(store, n - store.free)
        return store.take(n)

    def make_room(self, store: HostPages, pages: int) -> bool:
        """Free `pages` host pages of one store, least recently saved first."""
        want = store.free + pages
        while store.free < want:
            if store is self.full:
                victim = self.lru.oldest(
                    lambda x: not x.on_device and x.is_leaf and x.full_lock == 0
                )
            else:
                victim = self.lru.oldest(lambda x: x.host_swa is not None and x.full_lock == 0)
            if victim is None:
                return False
            if not victim.on_device and victim.is_leaf:
                self.drop(victim)
            else:
                self._drop_swa(victim)
        return True

    def _drop_swa(self, node: Node) -> None:
        self.swa.give(node.host_swa)
        node.host_swa = None
        if node.on_device:
            self.lru.remove(node)
            t = self.tree
            if node.is_leaf and node.full_lock == 0 and not t.policy.keep_childless_tombstones:
                t.evictor.delete_leaf(node)  # a tombstone leaf can no longer be hit
        elif node.is_leaf and node.full_lock == 0:
            self.drop(node)

    def drop(self, node: Node) -> None:
        """Delete a host-resident leaf, then ancestors it leaves useless (a host-resident leaf
        without a host window, a device tombstone leaf no lock holds)."""
        t = self.tree
        while True:
            self.full.give(node.host_full)
            if node.host_swa is not None:
                self.swa.give(node.host_swa)
            self.lru.remove(node)
            parent = node.parent
            del parent.children[node.key[: t.ps]]
            node = parent
            if node is t.root or not node.is_leaf or node.full_lock:
                return
            if not node.on_device:
                if node.host_swa is not None:
                    return
                continue
            if not node.swa_live and not t.policy.keep_childless_tombstones:
                t.evictor.delete_leaf(node)  # (an unlocked tombstone leaf outlives no lock)
            return

    def drop_subtree(self, node: Node) -> None:
        """Delete every host-resident descendant of `node` (its children are all host-resident)."""
        for child in list(node.children.values()):
            self.drop_subtree(child)
            t = self.tree
            self.full.give(child.host_full)
            if child.host_swa is not None:
                self.swa.give(child.host_swa)
            self.lru.remove(child)
            del node.children[child.key[: t.ps]]

    def clear(self) -> None:
        """Delete everything the host tier holds (what it can: nothing is locked on the host)."""
        self.make_room(self.full, self.full.total)
        self.make_room(self.swa, self.swa.total)

    # ------------------------------------------------------------------------------------------
    # Device -> host

    def copy_window(self, node: Node, split: bool = True) -> list[Node]:
        """Before a live node's SWA KV is freed: copy its last window to the host (splitting a
        longer node there; without `split`, as inside a lock's walk, a longer node gets no
        copy). Returns the parts to tombstone (upper part first)."""
        t = self.tree
        parts = [node]
        if not self._branch_end(node):
            return parts
        if len(node) > self.window_tokens:
            if not split:
                return parts
            parts.insert(0, t.split(node, len(node) - self.window_tokens))
        pages = self._take(self.swa, self._pages(node))
        if pages is not None:
            t.releaser.save("swa", node.value, pages)
            node.host_swa = pages
            self.lru.add(node)
            self.saved[1] += len(node)
        return parts

    def move_to_host(self, node: Node) -> tuple[int, int] | None:
        """Full eviction of an unlocked device leaf: move its full KV (and the SWA KV of its
        last window, if live) to the host; the node stays in the tree. Returns the device
        (full, SWA) tokens freed, or None when the node should be deleted instead (no room, or
        nothing a match could end on)."""
        t = self.tree
        window = min(len(node), self.window_tokens) if node.swa_live else 0
        window = window if self._branch_end(node) else 0
        node.full_lock += 1  # making host room must not take the node (or delete it)
        full_pages = self._take(self.full, self._pages(node))
        swa_pages = None
        if window and full_pages is not None:
            swa_pages = self._take(self.swa, window // t.ps)
        node.full_lock -= 1
        if (
            full_pages is None
            or (node.is_leaf and swa_pages is None and not node.swa_valid)
            or (node.is_leaf and node.swa_live and swa_pages is None)
        ):
            for store, pages in ((self.full, full_pages), (self.swa, swa_pages)):
                if pages is not None:
                    store.give(pages)
            return None
        parts = [node]
        if swa_pages is not None and len(node) > window:
            parts.insert(0, t.split(node, len(node) - window))
        freed, at = [0, 0], 0
        for part in parts:
            n = self._pages(part)
            f, s = self._to_host(part, full_pages[at : at + n], swa_pages if part is node else None)
            at += n
            freed[0] += f
            freed[1] += s
        return freed[0], freed[1]

    def _to_host(self, node: Node, full_pages, swa_pages) -> tuple[int, int]:
        t = self.tree
        t.releaser.save("full", node.value, full_pages)
        if swa_pages is not None:
            t.releaser.save("swa", node.value, swa_pages)
            node.host_swa = swa_pages
            self.saved[1] += len(node)
        self.saved[0] += len(node)
        live = node.swa_live
        t.releaser.free(node.value)
        t.sizes.full_evictable -= len(node)
        t.full_lru.remove(node)
        if live:
            t.sizes.swa_evictable -= len(node)
            t.swa_lru.remove(node)
        node.host_full, node.swa_live = full_pages, False
        node.value = np.zeros(len(node), np.int32)
        self.lru.add(node)
        return len(node), len(node) if live else 0

    # ------------------------------------------------------------------------------------------
    # Host -> device

    def _window(self, accepted: list[Node]) -> list[Node]:
        """The nodes holding the last W tokens of the path (what a query at its end reads)."""
        out, tokens = [], 0
        for node in reversed(accepted):
            if tokens >= (self.tree.window or 0):
                break
            out.append(node)
            tokens += len(node)
        return out

    @contextlib.contextmanager
    def _pin(self, nodes: list[Node]):
        """Keep `nodes` from either tier's eviction while room is made for their load (lock
        counts without the size bookkeeping of a real lock: nothing is counted as moved)."""
        live = [n for n in nodes if n.swa_live]
        for n in nodes:
            n.full_lock += 1
        for n in live:
            n.swa_lock += 1
        try:
            yield
        finally:
            for n in nodes:
                n.full_lock -= 1
            for n in live:
                n.swa_lock -= 1

    def bring_back(self, path: list[Node], best: int) -> tuple[int, int, int]:
        """Load what a hit on path[:best] reads from the host. Returns (the accepted length, full
        tokens loaded, SWA tokens loaded); the accepted length drops to the device-only hit when
        the pools cannot make room."""
        accepted = path[:best]
        fulls = [n for n in accepted if not n.on_device]
        swas = [n for n in self._window(accepted) if not n.swa_live]
        need_full, need_swa = sum(map(len, fulls)), sum(map(len, swas))
        if not need_full and not need_swa:
            return best, 0, 0
        t = self.tree
        with self._pin(accepted):
            full, swa = t.releaser.available()[:2]
            if full < need_full or swa < need_swa:
                t.evict(max(0, need_full - full), max(0, need_swa - swa))
                full, swa = t.releaser.available()[:2]
        if full < need_full or swa < need_swa:
            self._prune(accepted)
            return self._device_best(accepted), 0, 0
        for node in fulls:  # top down: device nodes stay closed upwards
            slots = t.releaser.claim(len(node))
            t.releaser.load("full", slots, node.host_full)
            self.full.give(node.host_full)
            node.host_full, node.value = None, slots
            t.full_lru.add(node)
            t.sizes.full_evictable += len(node)
            self._settle(node)
        for node in swas:
            self._revive(node)
        self.loaded[0] += need_full
        self.loaded[1] += need_swa
        return best, need_full, need_swa

    def _revive(self, node: Node) -> None:
        """A device tombstone takes its SWA KV back from the host."""
        t = self.tree
        t.releaser.pair_swa(node.value)
        t.releaser.load("swa", node.value, node.host_swa)
        self.swa.give(node.host_swa)
        node.host_swa, node.swa_live = None, True
        t.swa_lru.add(node)
        t.sizes.swa_evictable += len(node)
        self._settle(node)

    def _settle(self, node: Node) -> None:
        if node.on_device and node.host_swa is None:
            self.lru.remove(node)

    def _prune(self, nodes: list[Node]) -> None:
        """After a pin: delete what host eviction left useless but could not take while pinned
        (a host-resident leaf without a host window)."""
        for node in reversed(nodes):
            if node.parent is not None and not node.on_device and node.is_leaf:
                if node.host_swa is None and node.full_lock == 0:
                    self.drop(node)

    def forget_swa(self, node: Node) -> None:
        """A device tombstone is revived by a request's SWA KV: its host window goes."""
        self.swa.give(node.host_swa)
        node.host_swa = None
        self._settle(node)

    def _device_best(self, path: list[Node]) -> int:
        """The window rule over device KV alone (the hit without any load)."""
        window = self.tree.window
        return hit_end(path, window, lambda node: node.swa_live, lambda node: node.on_device)

    def adopt(self, node: Node, req, start: int, evicted: int) -> Node:
        """An insert passes a host-resident node: it takes the request's device KV for the same
        tokens (full slots, and the SWA KV the request still holds); returns the deepest part."""
        t = self.tree
        if start < evicted < start + len(node):
            s = evicted - start
            self._adopt_one(t.split(node, s), req[:s], live=False)
            req, start = req[s:], evicted
        self._adopt_one(node, req, live=evicted <= start)
        return node

    def _adopt_one(self, node: Node, slots, live: bool) -> None:
        t = self.tree
        self.full.give(node.host_full)
        node.host_full, node.value = None, np.array(slots, np.int32)
        t.full_lru.add(node)
        t.sizes.full_evictable += len(node)
        if live:
            if node.host_swa is not None:
                self.swa.give(node.host_swa)
                node.host_swa = None
            node.swa_live = True
            t.swa_lru.add(node)
            t.sizes.swa_evictable += len(node)
        self._settle(node)

    def split(self, upper: Node, child: Node, k: int) -> None:
        """A split cut `child` after k tokens into `upper`: divide its host pages."""
        kp = k // self.tree.ps
        if child.host_full is not None:
            upper.host_full, child.host_full = child.host_full[:kp], child.host_full[kp:]
        if child.host_swa is not None:
            upper.host_swa, child.host_swa = child.host_swa[:kp], child.host_swa[kp:]
        if not upper.on_device or upper.host_swa is not None:
            self.lru.add_before(upper, child)
