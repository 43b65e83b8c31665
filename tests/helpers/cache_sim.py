"""A minimal request lifecycle over an allocator + prefix cache, for tests.

It does what the engine does for one request, in plain steps: match and lock the cached
prefix, allocate the rest, grow, evict out-of-window SWA, cache the unfinished prefix, finish.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.serving import tail_rebuild
from swajax.serving.window import eviction_frontier


@dataclasses.dataclass(eq=False)
class SimRequest:
    tokens: list
    slots: np.ndarray  # full slot of every position
    protected: int  # cache_protected_len
    handle: object
    evicted: int = 0  # swa_evicted_seqlen
    # The prefill-floor rule (all-SWA pools, prefix_cache/policy.py): where its prefill ended;
    # its window frees nothing below, and it caches nothing above. 0: no floor.
    floor: int = 0


def ok(status) -> bool:
    return int(status) == 0


def alloc(allocator, pre_slots, n_pre, n_new):
    """(status, new slots) for positions [n_pre, n_pre + n_new) after `pre_slots`."""
    last = int(pre_slots[n_pre - 1]) if n_pre else -1
    status, full, *_ = allocator.alloc_extend([n_pre], [n_pre + n_new], [last])
    return status, np.asarray(full[:n_new], np.int32)


def start(cache, allocator, tokens) -> SimRequest | None:
    """Match, lock, allocate the rest; None (and nothing held) if the pools are too small."""
    match = cache.match(tokens)
    handle = cache.lock(match.node)
    n = len(match)
    status, new = alloc(allocator, match.slots, n, len(tokens) - n)
    if not ok(status):
        cache.unlock(handle)
        return None
    slots = np.concatenate([match.slots, new]).astype(np.int32)
    return SimRequest(
        list(tokens), slots, n, handle, floor=len(tokens) * cache.policy.floors_prefills(cache.mode)
    )


def start_rebuild(cache, allocator, tokens, *, reach, window) -> SimRequest | None:
    """Start as a tail rebuild would (serving/tail_rebuild.py), already past the match's end L:
    the tree's slots up to s0, the node at L locked, fresh slots from s0, and the SWA KV below
    `exact_from` freed (what the scheduler's `settle` does). None if no rebuild applies."""
    match = cache.match(tokens)
    if match.tail_node is None:
        return None
    rebuild = tail_rebuild.plan(match, reach=reach, window=window, page_size=cache.ps)
    if rebuild is None:
        return None
    handle = cache.lock(match.tail_node)
    s0, prefix = rebuild.start, np.concatenate([match.slots, match.tail])[: rebuild.start]
    status, new = alloc(allocator, prefix, s0, len(tokens) - s0)
    if not ok(status):
        cache.unlock(handle)
        return None
    req = SimRequest(list(tokens), np.concatenate([prefix, new]).astype(np.int32), s0, handle)
    if rebuild.exact_from > s0:
        allocator.free_swa(req.slots[s0 : rebuild.exact_from])
    req.evicted = rebuild.exact_from
    return req


def grow(allocator, req: SimRequest, new_tokens) -> bool:
    status, new = alloc(allocator, req.slots, len(req.tokens), len(new_tokens))
    if ok(status):
        req.tokens += list(new_tokens)
        req.slots = np.concatenate([req.slots, new])
    return ok(status)


def evict_window(allocator, req: SimRequest, *, window, page_size, chunk_cache=False) -> None:
    start_, end = eviction_frontier(
        len(req.tokens) - 1,
        window=window,
        page_size=page_size,
        cache_protected_len=req.protected,
        swa_evicted_seqlen=req.evicted,
        swa_evict_floor=req.floor,
        chunk_cache=chunk_cache,
    )
    if end > start_:
        allocator.free_swa(req.slots[start_:end])
    req.evicted = max(req.evicted, end)


def unfinished(cache, req: SimRequest) -> None:
    """A chunk checkpoint; under the floor rule no further than the floor (the engine's
    checkpoints all end there: between prefill chunks, and after the last one)."""
    prefix, req.handle = cache.cache_unfinished(
        req.tokens[: req.floor or len(req.tokens)],
        req.slots,
        cache_protected_len=req.protected,
        swa_evicted_seqlen=req.evicted,
        handle=req.handle,
    )
    req.slots = np.concatenate([prefix, req.slots[len(prefix) :]]).astype(np.int32)
    req.protected = max(req.protected, len(prefix))


def finish(cache, req: SimRequest, insert=True) -> None:
    floor = {"swa_evict_floor": req.floor} if req.floor else {}
    cache.cache_finished(
        req.tokens,
        req.slots,
        cache_protected_len=req.protected,
        swa_evicted_seqlen=req.evicted,
        handle=req.handle,
        insert=insert,
        **floor,
    )
