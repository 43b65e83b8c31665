"""Invariant checks and counters of a prefix cache (spec §13 items 12-14, for tests and debug)."""

from __future__ import annotations

from swajax.prefix_cache.protocol import PrefixCache
from swajax.prefix_cache.radix import RadixCache


def check_invariants(cache: PrefixCache) -> None:
    """Raise AssertionError if structure, recency lists, lock counts or size totals are off."""
    sizes = dict(full_evictable=0, full_protected=0, swa_evictable=0, swa_protected=0)
    actual = {name: getattr(cache, name) for name in sizes}
    if not isinstance(cache, RadixCache):  # a chunk cache holds nothing
        assert not list(cache.nodes()) and actual == sizes, f"a chunk cache holds {actual}"
        return
    ps, root = cache.ps, cache.root
    assert root.full_lock == root.swa_lock == 1 and root.parent is None
    nodes = list(cache.nodes())
    for node in nodes:
        assert node.parent is not None and node.parent.children.get(node.key[:ps]) is node
        assert len(node) > 0 and len(node) % ps == 0, f"{node}: length not a page multiple"
        assert len(node.value) == len(node), f"{node}: {len(node.value)} slots"
        assert node.full_lock >= node.swa_lock >= 0, f"{node}: lock counts"
        if not node.on_device:  # host-resident: the tier's own checks, below
            continue
        assert node in cache.full_lru, f"{node} missing from the full LRU"
        assert (node in cache.swa_lru) == (node.swa_live and cache.swa), f"{node}: SWA LRU"
        if not node.swa_live:
            assert cache.swa, f"{node}: a tombstone without an SWA component"
            if not cache.policy.node_window_lock:  # which alone passes tombstones by count
                assert node.swa_lock == 0, f"{node}: a locked tombstone"
            if not cache.policy.keep_childless_tombstones:
                hittable = node.host_swa is not None  # a host window makes it a match end
                assert hittable or not (node.is_leaf and node.full_lock == 0), f"{node}: leaf"
        sizes["full_protected" if node.full_lock else "full_evictable"] += len(node)
        if node.swa_live and cache.swa:
            sizes["swa_protected" if node.swa_lock else "swa_evictable"] += len(node)
    on_device = [node for node in nodes if node.on_device]
    assert len(cache.full_lru) == len(on_device) and len(cache.swa_lru) <= len(on_device)
    if not cache.swa:
        sizes["swa_evictable"], sizes["swa_protected"] = (
            sizes["full_evictable"],
            sizes["full_protected"],
        )
    assert actual == sizes, f"size accounting {actual} != recomputed {sizes}"
    if cache.tier is not None:
        check_host_tier(cache)


def check_host_tier(cache) -> None:
    """Host-tier invariants (AssertionError): every host page referenced by exactly one node
    and never free as well; host-resident nodes closed downwards, unlocked, in no device
    recency list; the host LRU lists exactly the nodes holding host KV."""
    tier = cache.tier
    refs = {"full": [], "swa": []}
    holders = set()
    for node in cache.nodes():
        pages = len(node) // cache.ps
        if node.host_swa is not None:
            assert len(node.host_swa) == pages and not node.swa_live, f"{node}: host window"
            refs["swa"] += node.host_swa.tolist()
            holders.add(node)
        if node.on_device:
            continue
        holders.add(node)
        assert len(node.host_full) == pages, f"{node}: {len(node.host_full)} host pages"
        refs["full"] += node.host_full.tolist()
        assert node.full_lock == 0 and node.swa_lock == 0, f"{node}: a locked host node"
        assert node not in cache.full_lru and node not in cache.swa_lru, f"{node}: in a device LRU"
        assert all(not c.on_device for c in node.children.values()), f"{node}: device child"
        if cache.swa:
            assert not node.is_leaf or node.host_swa is not None, f"{node}: useless host leaf"
    for name, store in (("full", tier.full), ("swa", tier.swa)):
        ids = refs[name]
        assert len(ids) == len(set(ids)), f"a {name} host page is held by two nodes"
        assert not set(ids) & store.free_ids(), f"a {name} host page is held and free"
        assert len(ids) == store.used, f"{name} host pages: {store.used} used, {len(ids)} held"
    assert set(tier.lru) == holders, "the host LRU differs from the nodes holding host KV"


def stats(cache: PrefixCache) -> dict:
    tier = getattr(cache, "tier", None)
    host = {}
    if tier is not None:
        ps = cache.ps
        host = dict(
            host_full_tokens=tier.full.used * ps,
            host_swa_tokens=tier.swa.used * ps,
            host_saved_full=tier.saved[0],
            host_saved_swa=tier.saved[1],
            host_loaded_full=tier.loaded[0],
            host_loaded_swa=tier.loaded[1],
        )
    return host | dict(
        hit_tokens=cache.hit_tokens,
        swa_tail_miss_tokens=cache.tail_miss_tokens,
        tombstones=cache.tombstones,
        full_evictable=cache.full_evictable,
        full_protected=cache.full_protected,
        swa_evictable=cache.swa_evictable,
        swa_protected=cache.swa_protected,
    )
