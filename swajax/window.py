"""Runtime SWA eviction math (pure functions): which positions of a request leave the window.

A request with `pre_len` cached positions next queries position `pre_len`, which reads keys
`[pre_len - W, pre_len]`. Older positions need no SWA KV, except that

* positions before `cache_protected_len` belong to the prefix cache (it reclaims them), and
  positions before `swa_evict_floor` are protected by the model;
* with a radix cache the frontier stays at `pre_len - max(W, page_size)`, strictly below the
  page-aligned end that will be inserted, so the last inserted node always keeps live SWA.
"""

from __future__ import annotations


def _ceil_page(x: int, ps: int) -> int:
    return -(-x // ps) * ps


def eviction_frontier(
    pre_len: int,
    *,
    window: int,
    page_size: int,
    cache_protected_len: int,
    swa_evicted_seqlen: int,
    swa_evict_floor: int = 0,
    chunk_cache: bool = False,
) -> tuple[int, int]:
    """Where a request's SWA eviction stands after `free_swa_out_of_window_slots` (spec §7.4).

    Returns (start, end): free the SWA of positions [start, end) (nothing if start >= end) and
    set `swa_evicted_seqlen = end`. `end` is page aligned, monotone, and never below the
    protected prefix or the floor.
    """
    ps = page_size
    if cache_protected_len % ps:
        raise ValueError(f"cache_protected_len {cache_protected_len} is not a multiple of {ps}")
    floor = max(cache_protected_len, swa_evict_floor)
    if floor > cache_protected_len:
        floor = _ceil_page(floor, ps)
    start = max(swa_evicted_seqlen, floor)  # what the cache or the floor owns is skipped
    threshold = pre_len - (window if chunk_cache else max(window, ps))
    end = max(start, threshold) // ps * ps
    return start, max(end, start)
