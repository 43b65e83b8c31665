"""Planted bugs in SGLang 0.5.23 itself: each patches one rule of the seed in SGLang's own
objects (its allocator, its unified radix tree, or the scheduler's calls into them), the way a
contributor's mistake would, for measuring what the conformance kit catches there
(`tests/peers/test_sglang.py`). Runs in SGLang's environment:

    .venvs/sglang/bin/python tests/peers/sglang_mutants.py KIT_DIR

prints one JSON line per planted bug, {"mutant": name, "caught": [case names]}, then
{"listed_survivors": [names]}.

The tree's core is SGLang's Rust one, so bugs inside it are planted at the Python surface it
offers: the window the tree is built with, the parameters of its calls, the methods its Python
wrapper exposes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]

from peers.sglang_adapter import SGLangAdapter  # noqa: E402

from swajax.conformance import kit as kit_lib  # noqa: E402


def _window(delta):
    def header(h):
        return dict(h, window=h["window"] + delta)

    return dict(header=header)


def _free_swa_keeps_mapping(alloc, cache):
    """free_swa returns the SWA pages but leaves the full -> SWA entries behind."""
    sg = alloc.sg
    sg.clear_full_to_swa_mapping = lambda full_indices: None


def _free_forgets_swa(alloc, cache):
    """free returns the full pages but not the SWA pages mapped to them."""
    sg = alloc.sg

    def free(free_index):
        if free_index.numel():
            sg.clear_full_to_swa_mapping(free_index)
            sg.full_attn_allocator.free(free_index)

    sg.free = free


def _swa_available_is_full(alloc, cache):
    """The SWA pool's free count reports the full pool's."""
    alloc.sg.swa_available_size = alloc.sg.full_available_size


def _available_max(alloc, cache):
    """Both free counts report the larger pool."""
    sg = alloc.sg
    full, swa = sg.full_available_size, sg.swa_available_size
    sg.full_available_size = sg.swa_available_size = lambda: max(full(), swa())


def _release_swa_noop(alloc, cache):
    """Releasing a request's window early does nothing."""
    cache.sg.release_swa = lambda lock: None


def _unlock_keeps_swa_lock(alloc, cache):
    """Unlocking releases the full lock and leaves the SWA lock counted."""
    sg = cache.sg
    dec = sg.dec_lock_ref
    sg.dec_lock_ref = lambda node_id, params, skip_swa=False: dec(node_id, params, True)


def _evict_short(alloc, cache):
    """Eviction frees one page less than it is asked for."""
    sg, ps = cache.sg, cache.ps

    def evict(params):
        params.num_tokens = max(0, params.num_tokens - ps)
        params.swa_num_tokens = max(0, params.swa_num_tokens - ps)
        return evict_inner(params)

    evict_inner = sg.evict
    sg.evict = evict


def _insert_all_live(alloc, cache):
    """An insert ignores how far its request's SWA KV was evicted: all of it goes in live."""
    insert = cache.sg.insert

    def all_live(params):
        params.set_evicted_seqlen(_SWA, 0)
        return insert(params)

    cache.sg.insert = all_live


def _insert_all_tombstones(alloc, cache):
    """An insert treats every token as evicted: nothing is revived, nothing enters live."""
    insert = cache.sg.insert

    def none_live(params):
        params.set_evicted_seqlen(_SWA, len(params.key))
        return insert(params)

    cache.sg.insert = none_live


def _decode_page_off_by_one(alloc, cache):
    """A decode step asks for a new page when the previous token ended one."""
    sg = alloc.sg
    decode = sg.alloc_decode

    def alloc_decode(seq_lens, seq_lens_cpu, last_loc):
        return decode(seq_lens - 1, seq_lens_cpu - 1, last_loc)

    sg.alloc_decode = alloc_decode


def _double_free_on_finish(alloc, cache):
    """A finishing request frees its whole row, the prefix the tree owns included."""
    free_kv_row = cache.sg.free_kv_row

    def free(kv, ranges):
        return free_kv_row(kv, [(0, end) for _, end in ranges])

    cache.sg.free_kv_row = free


def _sentinel_lost(alloc, cache):
    """The mapping's -1 sentinel is lost: translating -1 gives the padding slot 0."""
    alloc.sg.full_to_swa_index_mapping[-1] = 0


def _free_swa_ignores_the_page(alloc, cache):
    """free_swa frees the SWA peers of the given slots only, not of their whole pages."""
    alloc.sg._expand_to_full_pages = lambda indices: indices


def _evict_ignores_swa(alloc, cache):
    """Eviction ignores how much SWA KV it was asked for."""
    sg = cache.sg
    evict = sg.evict

    def full_only(params):
        params.swa_num_tokens = 0
        return evict(params)

    sg.evict = full_only


def _evict_swapped(alloc, cache):
    """Eviction reads the full and SWA amounts the wrong way round."""
    sg = cache.sg
    evict = sg.evict

    def swapped(params):
        params.num_tokens, params.swa_num_tokens = params.swa_num_tokens, params.num_tokens
        return evict(params)

    sg.evict = swapped


def _checkpoint_forgets_the_prefix(alloc, cache):
    """A checkpoint inserts as if the request had no cached prefix (its protected length 0)."""
    sg = cache.sg
    checkpoint = sg.checkpoint

    def fresh(req, **kwargs):
        req.kv.cache_protected_len = 0
        return checkpoint(req, **kwargs)

    sg.checkpoint = fresh


def _lock_skips_swa(alloc, cache):
    """A lock pins the full KV only: the window's SWA KV stays evictable."""
    sg = cache.sg
    inc = sg.inc_lock_ref
    sg.inc_lock_ref = lambda node_id, skip_lock_components=(): inc(node_id, (_SWA,))


def _release_swa_unlocks(alloc, cache):
    """Releasing the window early releases the whole lock."""
    sg = cache.sg
    unlock = sg.unlock

    def release(lock):
        if lock is not None and not lock.swa_released:
            unlock(lock)
            lock.swa_released = True

    sg.release_swa = release


# Planted in SGLang's Python tree core (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python, which
# the kit passes unmodified as the Rust one does): the window lock's extent, where an entry
# lands in the SWA recency list, and what a hit refreshes live there in Python.


def _swa(cache):
    return cache.sg.tree_core.components_by_type[_SWA]


def _lock_window(delta):
    def plant(alloc, cache):
        swa = _swa(cache)
        acquire = swa.acquire_component_lock

        def shifted(node, result, lock_host=False):
            swa.sliding_window_size += delta
            try:
                return acquire(node, result, lock_host)
            finally:
                swa.sliding_window_size -= delta

        swa.acquire_component_lock = shifted

    plant.__doc__ = f"A window lock covers W {'+' if delta > 0 else '-'} 1 tokens (the hit rule W)."
    return plant


def _to_oldest_end(lru, node):
    pt = lru._pt
    lru._remove_node(node)
    lru._add_node_after(lru.tail.lru_prev[pt], node)


def _revived_at_oldest_end(alloc, cache):
    """A tombstone revived by an insert enters the SWA recency list at its oldest end (a
    node taking an SWA value it held before is a revival; the insert applies it after its
    walk, so the node is told by that, not by the call it comes from)."""
    core = cache.sg.tree_core
    store = core.set_component_device_value
    held = set()

    def set_value(node_id, component_type, value):
        revived = component_type == _SWA and node_id in held
        store(node_id, component_type, value)
        if component_type == _SWA:
            held.add(node_id)
        if revived:
            _to_oldest_end(core.lru_lists[_SWA], core.node_by_id(node_id))

    core.set_component_device_value = set_value


def _refresh(extent):
    def plant(alloc, cache):
        from sglang.srt.mem_cache.unified_cache.components.swa import LRURefreshPhase

        core, swa = cache.sg.tree_core, _swa(cache)
        lru = core.lru_lists[_SWA]

        def refresh_lru(phase, node, root_node):
            if phase is LRURefreshPhase.WALKDOWN:
                return
            if extent == "path":
                lru.reset_node_and_parents_mru(node, root_node, swa.node_has_component_data)
            else:
                lru.reset_node_and_window_ancestors_mru(
                    node, root_node, core.page_size, swa.node_has_component_data
                )

        swa.refresh_lru = refresh_lru

    plant.__doc__ = {
        "page": "A hit refreshes the SWA recency of its last page's node only.",
        "path": "A hit refreshes the SWA recency of the whole matched path.",
    }[extent]
    return plant


def _split_upper_most_recent(alloc, cache):
    """A split puts the new upper part at the most recent end of the SWA list (not beside
    its lower part)."""
    lru = cache.sg.tree_core.lru_lists[_SWA]
    lru.insert_after = lambda prev_node, node: lru.insert_mru(node)


def _no_hit_refresh(alloc, cache):
    """A hit refreshes no SWA recency at all."""
    _swa(cache).refresh_lru = lambda phase, node, root_node: None


def _swa_count_page_short(alloc, cache):
    """The SWA pool's free count is one page short (its own allocator's count)."""
    sub = alloc.sg.swa_attn_allocator
    count = sub.available_size
    sub.available_size = lambda: max(0, count() - alloc.ps)


def _finish_ignores_branch(alloc, cache):
    """A finishing insert ignores the request's branch point: the whole sequence goes in (the
    h25 divergence, planted in SGLang)."""
    swa = _swa(cache)
    prepare = swa.prepare_for_caching_req

    def whole(**kwargs):
        if kwargs["is_finished"]:
            kwargs["req"].swa_branching_seqlen = None
        return prepare(**kwargs)

    swa.prepare_for_caching_req = whole


PYTHON_CORE = {
    "window lock one token short": _lock_window(-1),
    "window lock one token long": _lock_window(+1),
    "revived tombstone at the oldest end": _revived_at_oldest_end,
    "hit refreshes one page": _refresh("page"),
    "hit refreshes the whole path": _refresh("path"),
    "hit refreshes nothing": _no_hit_refresh,
    "split puts the upper part most recent": _split_upper_most_recent,
    "a finish ignores the branch point": _finish_ignores_branch,
}


MUTANTS = {
    "hit rule and window lock one token long": _window(+1),
    "hit rule and window lock one token short": _window(-1),
    "free_swa keeps the mapping": _free_swa_keeps_mapping,
    "free forgets the SWA pages": _free_forgets_swa,
    "SWA availability reports the full pool": _swa_available_is_full,
    "availability reports the larger pool": _available_max,
    "early release is a no-op": _release_swa_noop,
    "unlock keeps the SWA lock": _unlock_keeps_swa_lock,
    "eviction stops short": _evict_short,
    "insert ignores the evicted length": _insert_all_live,
    "insert revives nothing": _insert_all_tombstones,
    "decode page off by one": _decode_page_off_by_one,
    "double free on finish": _double_free_on_finish,
    "-1 sentinel lost": _sentinel_lost,
    "free_swa ignores the page": _free_swa_ignores_the_page,
    "eviction ignores the SWA request": _evict_ignores_swa,
    "eviction swaps full and SWA": _evict_swapped,
    "checkpoint forgets the cached prefix": _checkpoint_forgets_the_prefix,
    "lock skips the SWA component": _lock_skips_swa,
    "early release drops the whole lock": _release_swa_unlocks,
    "SWA free count a page short": _swa_count_page_short,
    **PYTHON_CORE,
}
# Planted bugs the kit does not catch, and why.
SURVIVORS = {
    "-1 sentinel lost": "equivalent: no operation translates last_loc -1",
}
_SWA = None  # ComponentType.SWA, set on first use (SGLang imported by the adapter)


class MutantAdapter(SGLangAdapter):
    def __init__(self, name: str):
        super().__init__()
        self.plant = MUTANTS[name]

    def allocator_and_cache(self, header: dict):
        global _SWA
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        _SWA = ComponentType.SWA
        if isinstance(self.plant, dict):
            return super().allocator_and_cache(self.plant["header"](header))
        alloc, cache = super().allocator_and_cache(header)
        self.plant(alloc, cache)
        return alloc, cache


def main(kit: str) -> int:
    import os

    for name in MUTANTS:
        core = "python" if name in PYTHON_CORE else "rust"
        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core
        results = kit_lib.run(kit, MutantAdapter(name))
        caught = [r.name for r in results if r.kind == "ops" and r.status == "fail"]
        print(json.dumps(dict(mutant=name, caught=caught)), flush=True)
    equivalent = sorted(name for name, why in SURVIVORS.items() if why.startswith("equivalent"))
    print(json.dumps(dict(listed_survivors=sorted(SURVIVORS), equivalent=equivalent)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
