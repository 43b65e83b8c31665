"""Planted bugs: realistic mistakes in an allocator or a hybrid radix tree, each applied to a
copy of swajax's reference pair (the plain-Python allocator model under swajax's prefix cache)
to measure what the conformance kit catches (tests/conformance/test_mutants.py)."""

from __future__ import annotations

import types

from helpers.conformance_adapters import PythonModelAdapter


def _free_swa_keeps_mapping(alloc, cache):
    """free_swa returns the SWA pages but leaves full -> SWA entries behind."""
    model = alloc.model
    if model.mode != "hybrid":
        return  # one pool: no mapping

    def free_swa(slots):
        pages = {s // model.ps for s in slots if s > 0}
        expanded = [p * model.ps + o for p in pages for o in range(model.ps)]
        swa = [model.mapping[f] for f in expanded if f in model.mapping]
        model._release(model.swa_free, {s // model.ps for s in swa})

    model.free_swa = free_swa


def _free_swa_unexpanded(alloc, cache):
    """free_swa clears the mapping of the slot it was given only, not of its whole page."""
    model = alloc.model
    if model.mode != "hybrid":
        return

    def free_swa(slots):
        swa = [model.mapping.pop(s) for s in slots if s > 0 and s in model.mapping]
        model._release(model.swa_free, {s // model.ps for s in swa})

    model.free_swa = free_swa


def _available_max(alloc, cache):
    """The free count reports the larger pool for both."""
    available = alloc.available
    alloc.available = lambda: (max(available()),) * 2


def _double_free_on_retract(alloc, cache):
    """An aborted request also frees the prefix it took from the cache (the tree's slots), and
    the allocator does not notice a page freed twice."""
    model = alloc.model

    def release(free_list, pages):
        free_list[:0] = sorted(p for p in pages if p > 0)

    model._release = staticmethod(release)
    model._used_pages = lambda free_list, slots: {s // model.ps for s in slots if s > 0}
    finished = cache.requests.cache_finished

    def cache_finished(tokens, slots, *, cache_protected_len, insert=True, **kw):
        start = 0 if not insert else cache_protected_len
        finished(tokens, slots, cache_protected_len=start, insert=insert, **kw)

    cache.requests.cache_finished = cache_finished


def _decode_page_off_by_one(alloc, cache):
    """A decode step takes a new page when the previous token ended one (seq % ps == 0)."""
    model = alloc.model
    ps = model.ps
    decode = type(model).alloc_decode

    def alloc_decode(seq_lens, last_loc):
        return decode(model, [s - 1 if ps > 1 else s for s in seq_lens], last_loc)

    model.alloc_decode = alloc_decode


def _insert_leaks_duplicates(alloc, cache):
    """An insert over cached tokens keeps the request's duplicate slots instead of freeing them."""
    cache.free_request = types.MethodType(lambda self, slots, start, evicted: None, cache)


def _tombstone_leaf(alloc, cache):
    """SWA eviction tombstones an unlocked leaf instead of deleting it."""
    ev = cache.evictor

    def evict(full_tokens=0, swa_tokens=0):
        full, swa = 0, 0
        while full < full_tokens:
            leaf = cache.full_lru.oldest(lambda n: n.is_leaf and n.full_lock == 0)
            if leaf is None:
                break
            f, s = ev.delete_leaf(leaf)
            full, swa = full + f, swa + s
        while swa < swa_tokens:
            node = cache.swa_lru.oldest(lambda n: n.swa_lock == 0)
            if node is None:
                break
            swa += len(node)
            ev.tombstone(node)
        return full, swa

    cache.evictor.evict = evict


def _hit_rule_off_by_one(alloc, cache):
    """A match needs W + 1 live tokens before its end, not W."""
    match = cache.match

    def strict(tokens):
        cache.window += 1
        try:
            return match(tokens)
        finally:
            cache.window -= 1

    cache.match = strict


def _lock_whole_path(alloc, cache):
    """A window lock pins the SWA KV of the whole path, not of its last W tokens."""
    window = cache.window
    lock = cache.locks.lock

    def lock_all(node):
        cache.window = 1 << 30
        try:
            return lock(node)
        finally:
            cache.window = window

    cache.locks.lock = lock_all


def _evict_locked(alloc, cache):
    """Full eviction takes the oldest leaf whether or not a request holds it."""
    oldest = cache.full_lru.oldest

    def any_leaf(accept):
        leaf = oldest(lambda n: n.is_leaf)
        if leaf is not None and leaf.full_lock:
            leaf.full_lock = 0  # the lock is forgotten, not released
        return leaf

    cache.full_lru.oldest = any_leaf


def _lru_reversed(name: str):
    """Eviction walks one recency list from its most recent end."""

    def mutate(alloc, cache):
        lru = getattr(cache, name)
        lru.oldest = lambda accept: next((n for n in reversed(list(lru)) if accept(n)), None)

    part = (
        "Full eviction takes the most recently used leaf"
        if name == "full_lru"
        else ("SWA eviction tombstones the most recently used node")
    )
    mutate.__doc__ = f"{part} first."
    return mutate


def _release_swa_noop(alloc, cache):
    """Releasing a request's window early does nothing: the window stays pinned."""
    cache.locks.release_swa = lambda handle: None


def _hit_rule_one_short(alloc, cache):
    """A match accepts an end with W - 1 live tokens before it."""
    match = cache.match

    def lax(tokens):
        cache.window -= 1
        try:
            return match(tokens)
        finally:
            cache.window += 1

    cache.match = lax


def _window_lock(delta):
    def mutate(alloc, cache):
        lock = cache.locks.lock

        def shifted(node):
            cache.window += delta
            try:
                return lock(node)
            finally:
                cache.window -= delta

        cache.locks.lock = shifted

    mutate.__doc__ = f"A window lock pins W {'+' if delta > 0 else '-'} 1 tokens, not W."
    return mutate


def _no_revival(alloc, cache):
    """An insert over a tombstone frees the request's SWA KV instead of reviving the node."""
    cache._revive = lambda node, req: cache.releaser.free(req)


def _keep_childless_tombstones(alloc, cache):
    """Deleting a leaf leaves its childless tombstone parent (holding full KV no match can
    reach through the window rule)."""
    import dataclasses

    cache.policy = dataclasses.replace(cache.policy, keep_childless_tombstones=True)


def _sentinel_lost(alloc, cache):
    """The mapping's -1 sentinel is lost: translating -1 gives 0."""
    model = alloc.model
    translate = model.translate
    model.translate = lambda slot: 0 if slot < 0 else translate(slot)


def _available_full_only(alloc, cache):
    """The free count reports the full pool's for both pools."""
    available = alloc.available
    alloc.available = lambda: (available()[0],) * 2


def _extend_ignores_swa(alloc, cache):
    """An extend checks only the full pool's free pages."""
    model = alloc.model
    if model.mode != "hybrid":
        return
    check = model._check

    def full_only(pages, needs_last_slot):
        status = check(pages, needs_last_slot)
        if status == 2 and pages <= len(model.full_free):  # SWA_SHORT: allocate anyway
            model.swa_free += [0] * (pages - len(model.swa_free))
            return 0
        return status

    model._check = full_only


def _free_forgets_swa(alloc, cache):
    """free returns the full pages but not the SWA pages mapped to them."""
    model = alloc.model

    def free(slots):
        if model.mode != "all_swa":
            model._release(model.full_free, model._used_pages(model.full_free, slots))

    model.free = free


def _unlock_keeps_swa_lock(alloc, cache):
    """Unlocking releases the full lock but leaves the window's SWA lock counted."""
    unlock = cache.locks.unlock

    def partial(handle):
        if handle is not None:
            handle.swa_released = True  # the SWA part is skipped, never released
        return unlock(handle)

    cache.locks.unlock = partial


def _evict_short(alloc, cache):
    """Eviction stops one page short of what it was asked for."""
    evict = cache.evictor.evict
    ps = cache.ps
    cache.evictor.evict = lambda full=0, swa=0: evict(max(0, full - ps), max(0, swa - ps))


def _hit_refreshes_last_node(lists: str):
    def mutate(alloc, cache):
        if lists == "swa":
            cache._window_part = lambda path: path[-1:]
        else:
            add_path = cache.full_lru.add_path
            cache.full_lru.add_path = lambda path: add_path(path[-1:])

    mutate.__doc__ = (
        f"A refresh renews the {'SWA' if lists == 'swa' else 'full'} recency of the last node "
        "of its path only."
    )
    return mutate


def _split_upper_oldest(alloc, cache):
    """A split puts its new upper part at the least recent end of both lists."""
    split = cache.split

    def oldest_first(child, k):
        upper = split(child, k)
        for lru in (cache.full_lru, cache.swa_lru):
            if upper in lru:
                lru._nodes.move_to_end(upper, last=False)
        return upper

    cache.split = oldest_first


def _swa_count_page_short(alloc, cache):
    """The SWA pool's free count is one page short."""
    available = alloc.available
    alloc.available = lambda: (available()[0], max(0, available()[1] - cache.ps))


MUTANTS = {
    "free_swa keeps the mapping": _free_swa_keeps_mapping,
    "free_swa ignores the page": _free_swa_unexpanded,
    "available reports the max": _available_max,
    "double free on retract": _double_free_on_retract,
    "decode page off by one": _decode_page_off_by_one,
    "insert leaks duplicates": _insert_leaks_duplicates,
    "tombstone leaf": _tombstone_leaf,
    "hit rule off by one": _hit_rule_off_by_one,
    "lock covers the whole path": _lock_whole_path,
    "eviction of a locked leaf": _evict_locked,
    "LRU order reversed": _lru_reversed("full_lru"),
    "early release is a no-op": _release_swa_noop,
    "hit rule one token short": _hit_rule_one_short,
    "window lock one token short": _window_lock(-1),
    "window lock one token long": _window_lock(+1),
    "SWA LRU reversed": _lru_reversed("swa_lru"),
    "no revival": _no_revival,
    "childless tombstones kept": _keep_childless_tombstones,
    "-1 sentinel lost": _sentinel_lost,
    "available reports the full pool": _available_full_only,
    "extend ignores the SWA pool": _extend_ignores_swa,
    "free forgets the SWA pages": _free_forgets_swa,
    "unlock keeps the SWA lock": _unlock_keeps_swa_lock,
    "eviction stops short": _evict_short,
    "a hit refreshes its last node's SWA recency only": _hit_refreshes_last_node("swa"),
    "a hit refreshes its last node's full recency only": _hit_refreshes_last_node("full"),
    "a split's upper part least recent": _split_upper_oldest,
    "SWA free count a page short": _swa_count_page_short,
}

# Planted bugs the kit does not catch, and why.
SURVIVORS = {
    # Equivalent in the protocol: a request with no prefix passes last_loc -1 and no operation
    # reads its translation (the sentinel matters to attention's gather, whose cases are the
    # kit's attention cases, not its operation cases).
    "-1 sentinel lost": "equivalent: no operation translates last_loc -1",
    # Full eviction takes leaves only, and a refresh leaves the path's last node at least as
    # recent as every node above it: an internal node's own recency decides nothing until its
    # descendants are gone, and full eviction removes them only after every leaf older than the
    # refresh. It would show only if an SWA eviction deleted the path's leaf out of full-recency
    # order; under swajax's rules a hit refreshes both lists of the same nodes, so no operation
    # sequence the protocol allows puts that leaf first in one list and not the other.
    "a hit refreshes its last node's full recency only": (
        "no answer sees it: an internal node's full recency is read only after its subtree "
        "is deleted, which full eviction does in recency order"
    ),
}


class MutantAdapter(PythonModelAdapter):
    """The reference pair with one planted bug."""

    def __init__(self, name: str):
        self.mutate = MUTANTS[name]

    def allocator_and_cache(self, header):
        alloc, cache = super().allocator_and_cache(header)
        self.mutate(alloc, cache)
        return alloc, cache
