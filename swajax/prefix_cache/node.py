"""Radix tree nodes and the recency lists the two evictors walk (plain Python, no JAX)."""

from __future__ import annotations

import itertools
from collections import OrderedDict

import numpy as np

_clock = itertools.count()


class Node:
    """A run of tokens (a whole number of pages) and the full-pool slots holding their KV.

    A node whose SWA KV was freed while its full KV stays is a *tombstone* (`swa_live` False).
    Invariants (checked by `RadixCache.check_invariants`): full_lock >= swa_lock; a tombstone has
    swa_lock 0; a tombstone leaf exists only while full-locked.

    With a host tier (host_tier.py) a node's KV may sit in host memory: `host_full` lists the
    host pages of its full KV when it is not on the device (then `value` is meaningless and
    every descendant is host-resident too), `host_swa` the host pages of its SWA KV when its
    device SWA KV was freed (it is then a tombstone, or host-resident).
    """

    __slots__ = (
        "key",
        "value",
        "children",
        "parent",
        "swa_live",
        "full_lock",
        "swa_lock",
        "swa_tops",
        "swa_skips",
        "host_full",
        "host_swa",
        "last_access",
        "tombstoned_by",
        "chain",
    )

    def __init__(self, key=(), value=None, parent=None, swa_live=True):
        self.key: tuple[int, ...] = tuple(key)
        self.value: np.ndarray = np.zeros(0, np.int32) if value is None else value
        self.children: dict[tuple[int, ...], Node] = {}
        self.parent: Node | None = parent
        self.swa_live = swa_live
        self.full_lock = 0  # locks holding this node's full KV (every lock below it)
        self.swa_lock = 0  # locks whose window reaches this node
        self.swa_tops: set[int] = set()  # locks whose SWA window ends at this node
        self.swa_skips: set[int] = set()  # locks that passed this node as a tombstone
        self.host_full: np.ndarray | None = None  # host pages of its full KV, if off the device
        self.host_swa: np.ndarray | None = None  # host pages of its SWA KV, if kept there
        # A tombstone: what took its SWA KV (an eviction's number, or explain.INSERTED /
        # RELEASED); None while live. `chain`: its path's hash, memoized by explain.path_hash.
        self.tombstoned_by: int | None = None
        self.chain: int | None = None
        self.touch()

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        state = "live" if self.swa_live else "tombstone"
        if self.host_swa is not None:
            state += ", SWA on host"
        where = "" if self.on_device else ", on host"
        return f"Node({len(self)} tokens, {state}{where}, locks {self.full_lock}/{self.swa_lock})"

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def on_device(self) -> bool:
        """Its full KV is in the device pool (always, without a host tier)."""
        return self.host_full is None

    @property
    def device_leaf(self) -> bool:
        """No child holds device KV: what the device evictors may take (host-resident children
        stay in the tree below it)."""
        return not any(child.on_device for child in self.children.values())

    @property
    def swa_valid(self) -> bool:
        """Its SWA KV can be read: live on the device, or copied to the host (a load brings it
        back). What the window hit rule counts."""
        return self.swa_live or self.host_swa is not None

    def touch(self) -> None:
        self.last_access = next(_clock)

    def path_to_root(self):
        """This node and its ancestors, excluding the root."""
        node = self
        while node.parent is not None:
            yield node
            node = node.parent


def device_chain(parent: Node, nodes: list[Node]) -> list[Node]:
    """The leading `nodes` that still hang one below the other from `parent` with device KV
    (a host tier's load may have evicted or split part of a path walked before it)."""
    out = []
    for node in nodes:
        attached = node.parent is parent and node in parent.children.values()
        if not attached or not node.on_device:
            break
        out.append(node)
        parent = node
    return out


class LRUList:
    """Nodes in recency order: the front is least recently used."""

    def __init__(self):
        self._nodes: OrderedDict[Node, None] = OrderedDict()

    def __contains__(self, node: Node) -> bool:
        return node in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self):
        return iter(self._nodes)

    def add(self, node: Node) -> None:
        """Insert or move to the most recent end."""
        self._nodes[node] = None
        self._nodes.move_to_end(node)

    def add_before(self, node: Node, anchor: Node) -> None:
        """Insert `node` just before `anchor` (just less recent); O(n), used only by the
        window-recency policy's splits."""
        if anchor not in self._nodes:
            self.add(node)
            return
        self._nodes.pop(node, None)
        order = list(self._nodes)
        at = order.index(anchor)
        self._nodes = OrderedDict.fromkeys(order[:at] + [node] + order[at:])

    def remove(self, node: Node) -> None:
        self._nodes.pop(node, None)

    def add_path(self, path: list[Node]) -> None:
        """Refresh a root-to-node path so that every child is more recent than its parent."""
        for node in path:
            self.add(node)

    def oldest(self, accept) -> Node | None:
        """The least recently used node for which `accept(node)` holds."""
        return next((node for node in self._nodes if accept(node)), None)
