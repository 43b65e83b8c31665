"""A tree as plain data, and back: what a snapshot of the prefix cache holds.

The tree is saved whole: every node's tokens, full slots, whether its SWA KV is live and what
made it a tombstone, its host pages, the locks running requests hold on it (counts, and which
lock's window ends at or passed over it), both recency lists in order, the eviction counter and
the deleted pages that explanations name, the host tier's page lists. Loaded into an empty tree
of the same layout it is the same tree: the same matches, the same evictions in the same order,
the same explanations, and a lock handle rebuilt from its node and id (`tree_order` numbers the
nodes) unlocks exactly what the saved one would have.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.errors import InputError
from swajax.prefix_cache.node import Node
from swajax.prefix_cache.radix import RadixCache

FORMAT = 2


def tree_order(cache: RadixCache) -> list[Node]:
    """The root, then every node breadth first in its parent's child order: the numbering a
    saved tree and the lock handles saved beside it use (a parent comes before its children,
    and a reloaded parent keeps its children's order)."""
    order = [cache.root]
    for node in order:
        order.extend(node.children.values())
    return order


def tree_state(cache: RadixCache) -> dict:
    """The tree as JSON-able lists (node 0 is the root)."""
    order = tree_order(cache)
    index = {node: i for i, node in enumerate(order)}
    nodes = [
        dict(
            parent=index[n.parent],
            key=[int(t) for t in n.key],
            value=[int(s) for s in n.value],
            swa_live=bool(n.swa_live),
            tombstoned_by=n.tombstoned_by,
            host_full=_ints(n.host_full),
            host_swa=_ints(n.host_swa),
        )
        for n in order[1:]
    ]
    locks = [
        [i, n.full_lock, n.swa_lock, sorted(n.swa_tops), sorted(n.swa_skips)]
        for i, n in enumerate(order)
        if n.full_lock or n.swa_lock or n.swa_tops or n.swa_skips
    ]
    tier = cache.tier
    host = None
    if tier is not None:
        host = dict(
            full_free=tier.full.state(),
            swa_free=tier.swa.state(),
            lru=[index[n] for n in tier.lru],
            saved=list(tier.saved),
            loaded=list(tier.loaded),
        )
    return dict(
        format=FORMAT,
        page_size=cache.ps,
        window=cache.window,
        mode=cache.mode.value,
        nodes=nodes,
        locks=locks,
        next_lock=cache.locks.next_id,
        sizes=dataclasses.asdict(cache.sizes),
        full_lru=[index[n] for n in cache.full_lru],
        swa_lru=[index[n] for n in cache.swa_lru],
        # Recency among nodes the lists do not order (explanations and splits read it).
        last_access=sorted(range(1, len(order)), key=lambda i: order[i].last_access),
        evictions=cache.evictions,
        ghosts=[[h, cause] for h, cause in cache.ghosts.items()],
        hit_tokens=cache.hit_tokens,
        tail_miss_tokens=cache.tail_miss_tokens,
        host=host,
    )


def _ints(pages) -> list[int] | None:
    return None if pages is None else [int(p) for p in pages]


def _pages(ints) -> np.ndarray | None:
    return None if ints is None else np.asarray(ints, np.int32)


def load_tree_state(cache: RadixCache, state: dict) -> list[Node]:
    """Fill the empty tree `cache` (the same page size, window and mode) from `tree_state`;
    returns its nodes numbered as saved (`tree_order`)."""
    if next(iter(cache.nodes()), None) is not None:
        raise InputError("a prefix cache state loads into an empty tree only")
    ours = dict(page_size=cache.ps, window=cache.window, mode=cache.mode.value)
    theirs = {k: state.get(k) for k in ours}
    if theirs != ours:
        diff = ", ".join(
            f"{k} {theirs[k]} (this engine: {ours[k]})" for k in ours if theirs[k] != ours[k]
        )
        raise InputError(f"the saved prefix cache has another layout: {diff}")
    order = [cache.root]
    for spec in state["nodes"]:
        parent = order[spec["parent"]]
        node = Node(spec["key"], np.asarray(spec["value"], np.int32), parent, spec["swa_live"])
        node.tombstoned_by = spec["tombstoned_by"]
        node.host_full, node.host_swa = _pages(spec["host_full"]), _pages(spec["host_swa"])
        parent.children[node.key[: cache.ps]] = node
        order.append(node)
    for i, full_lock, swa_lock, tops, skips in state["locks"]:
        node = order[i]
        node.full_lock, node.swa_lock = full_lock, swa_lock
        node.swa_tops, node.swa_skips = set(tops), set(skips)
    cache.locks.next_id = state["next_lock"]
    for name, tokens in state["sizes"].items():  # in place: the collaborators read it
        setattr(cache.sizes, name, tokens)
    for i in state["last_access"]:
        order[i].touch()
    for i in state["full_lru"]:
        cache.full_lru.add(order[i])
    for i in state["swa_lru"]:
        cache.swa_lru.add(order[i])
    cache.evictions = state["evictions"]
    for h, cause in state["ghosts"]:
        cache.ghosts.restore(h, cause)
    cache.hit_tokens, cache.tail_miss_tokens = state["hit_tokens"], state["tail_miss_tokens"]
    host, tier = state["host"], cache.tier
    if (host is None) != (tier is None):
        raise InputError("the saved prefix cache and this one differ in having a host tier")
    if tier is not None:
        tier.full.load_state(host["full_free"])
        tier.swa.load_state(host["swa_free"])
        for i in host["lru"]:
            tier.lru.add(order[i])
        tier.saved, tier.loaded = list(host["saved"]), list(host["loaded"])
    return order


def check_tree_state(state: dict, slots: int) -> None:
    """Refuse (InputError naming the field) a saved tree that this engine cannot hold: a node
    whose parent is not saved before it, a key and value of different lengths, full slots
    outside [0, slots), node numbers in the locks and lists past the nodes saved."""

    def bad(field: str, value, limit: str):
        raise InputError(f"the snapshot's tree.{field} is {value!r}, outside {limit}")

    nodes = state["nodes"]
    for i, spec in enumerate(nodes, start=1):
        parent = spec["parent"]
        if not isinstance(parent, int) or not 0 <= parent < i:
            bad(f"nodes[{i - 1}].parent", parent, f"[0, {i})")
        value = np.asarray(spec["value"])
        if value.ndim != 1 or len(value) != len(spec["key"]) or not len(value):
            bad(f"nodes[{i - 1}].value", f"{value.shape} slots", f"{len(spec['key'])} tokens")
        if value.min() < 0 or value.max() >= slots:
            bad(f"nodes[{i - 1}].value", int(value.max()), f"the full pool [0, {slots})")
    numbered = len(nodes)
    for name in ("full_lru", "swa_lru", "last_access"):
        for i in state[name]:
            if not isinstance(i, int) or not 1 <= i <= numbered:
                bad(name, i, f"[1, {numbered}]")
    for entry in state["locks"]:
        if not isinstance(entry[0], int) or not 0 <= entry[0] <= numbered:
            bad("locks", entry[0], f"[0, {numbered}]")
