"""Runtime SWA eviction math (pure functions): which positions of a request leave the window.

A request with `pre_len` cached positions next queries position `pre_len`, which reads keys
`[pre_len - W, pre_len]`. Older positions need no SWA KV, except that

* positions before `cache_protected_len` belong to the prefix cache (it reclaims them), and
  positions before `swa_evict_floor` are protected by the model;
* with a radix cache the frontier stays at `pre_len - max(W, page_size)`, strictly below the
  page-aligned end that will be inserted, so the last inserted node always keeps live SWA.
"""

from __future__ import annotations

from swajax.arith import round_up


def eviction_frontier(
    pre_len: int,
    *,
    window: int,
    page_size: int,
    cache_protected_len: int,
    swa_evicted_seqlen: int,
    swa_evict_floor: int = 0,
    chunk_cache: bool = False,
    ceil_align: bool = False,
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
        floor = round_up(floor, ps)
    start = max(swa_evicted_seqlen, floor)  # what the cache or the floor owns is skipped
    keep = window if chunk_cache else max(window, ps)
    if ceil_align and not chunk_cache:  # SGLang 0.5.23 keeps whole pages of the window
        keep = round_up(keep, ps)
    threshold = pre_len - keep
    end = max(start, threshold) // ps * ps
    return start, max(end, start)


def decode_eviction_due(start: int, end: int, interval: int) -> bool:
    """Evict during decode only once `interval` out-of-window tokens have piled up (amortizes
    the free over many steps; the pool keeps W + interval + page_size SWA tokens per request)."""
    return end - start >= max(1, interval)


def swa_budget_for_req(extend: int, *, window: int, page_size: int, rem_chunk: int | None = None):
    """SWA tokens to reserve when admitting an extend of `extend` tokens (spec §9.1).

    The chunk and a window of decode headroom must fit: max(min(extend, rem_chunk), W) + ps.
    """
    alloc = extend if rem_chunk is None else min(extend, rem_chunk)
    return max(alloc, window) + page_size


def chunk_continue_len(
    remaining: int, *, rem_chunk: int, rem_total: int, rem_swa: int | None, page_size: int
) -> int:
    """Length of the next chunk of a chunked prefill, or 0 to park it this step (spec §9.3).

    With an SWA pool (`rem_swa` not None) one page stays reserved for the allocator's partial
    page; when even that is missing the request waits instead of taking a chunk it cannot
    place.
    """
    rem = min(rem_chunk, rem_total)
    if rem_swa is not None:
        rem = min(rem, rem_swa - page_size)
        if rem <= 0:
            return 0
    elif rem <= 0:
        rem = rem_chunk
    return max(0, min(remaining, rem))
