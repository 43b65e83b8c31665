"""Caching a request's KV when it finishes or between the chunks of a chunked prefill."""

from __future__ import annotations

import numpy as np

from swajax.arith import round_up
from swajax.prefix_cache.locks import LockHandle
from swajax.prefix_cache.protocol import Tree


def branch_end(n: int, cache_protected_len: int, branching: int | None) -> int | None:
    """The branch-insert rule (`policy.branch_insert`, which decides whether the scheduler
    gives a request a point; the cache applies any point it is given, as the protocol says):
    a request whose admission match found
    full KV beyond its SWA-valid hit holds that point (`swa_branching_seqlen`); an insert of
    its first `n` tokens that reaches the point and starts below it stops there, and the
    request then drops the point (the branch is in the tree). Returns where the insert stops,
    or None when the rule does not cut it (no point, the point already cached, or not reached
    yet: the insert takes all `n` and the request keeps the point)."""
    if branching is None or branching <= cache_protected_len or branching > n:
        return None
    return branching


class RequestCaching:
    """Works on a `RadixCache` through its public operations: `cache_finished` and
    `cache_unfinished`."""

    def __init__(self, tree: Tree):
        self.tree = tree

    def cache_finished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len: int,
        swa_evicted_seqlen: int,
        handle: LockHandle | None,
        insert: bool = True,
        swa_evict_floor: int = 0,
        swa_branching_seqlen: int | None = None,
    ) -> None:
        """Hand a finished (or aborted, with insert=False) request's KV to the cache.

        `slots` are the request's full slots for positions [0, len(tokens)); the first
        `cache_protected_len` came from this cache. The page-aligned part is inserted (or
        freed); the unaligned tail is freed; then the request's lock is released.

        A `swa_evict_floor` (the prefill-floor rule, all-SWA pools): only the positions below
        it, rounded up to a page, are cached; above it the window freed
        [floor, swa_evicted_seqlen) already, and the rest is freed here.

        A `swa_branching_seqlen` (the branch-insert rule, `branch_end`): the insert stops at
        the branch point it reaches and the positions after it are freed.
        """
        t = self.tree
        n = len(tokens)
        slots = np.asarray(slots, np.int32)
        if swa_evict_floor:
            floor = min(n, round_up(max(swa_evict_floor, cache_protected_len), t.ps))
            t.releaser.free(slots[max(floor, swa_evicted_seqlen) : n])
            tokens, n, swa_evicted_seqlen = tokens[:floor], floor, 0
        aligned = n // t.ps * t.ps
        if insert:
            aligned = branch_end(aligned, cache_protected_len, swa_branching_seqlen) or aligned
            t.insert(tokens[:aligned], slots[:aligned], cache_protected_len, swa_evicted_seqlen)
        else:
            start = cache_protected_len
            t.free_request(slots[start:aligned], start, swa_evicted_seqlen)
        t.free_request(slots[aligned:n], aligned, swa_evicted_seqlen)
        t.unlock(handle)

    def cache_unfinished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len: int,
        swa_evicted_seqlen: int,
        handle: LockHandle | None,
        swa_branching_seqlen: int | None = None,
    ):
        """Insert what a chunked prefill has computed so far and move the request's lock there.

        Returns (prefix_slots, handle): the cache's full slots for positions [0, A) (A = the
        page-aligned length), which the request must now use in its req_to_token row, and the
        new lock. The request's `cache_protected_len` becomes A. A branch point it reaches
        (`branch_end`) ends the insert there.
        """
        t = self.tree
        if t.policy.floors_prefills(t.mode):
            # A checkpoint ends at the prefill floor, below which the window frees nothing:
            # every slot that duplicates the tree's is still held and goes back (a frontier at
            # the floor moves `swa_evicted_seqlen` up to it without freeing anything).
            swa_evicted_seqlen = 0
        aligned = len(tokens) // t.ps * t.ps
        aligned = branch_end(aligned, cache_protected_len, swa_branching_seqlen) or aligned
        if aligned <= cache_protected_len and not (aligned and t.policy.relock_checkpoint):
            return np.asarray(slots[:cache_protected_len], np.int32), handle
        t.insert(
            tokens[:aligned],
            np.asarray(slots[:aligned], np.int32),
            cache_protected_len,
            swa_evicted_seqlen,
            keep_tombstone_leaf=True,
        )
        path = t.walk(t.aligned(tokens[:aligned]))
        prefix = np.concatenate([node.value for node in path])
        assert len(prefix) == aligned, (len(prefix), aligned)
        new_handle = t.lock(path[-1])
        t.unlock(handle)
        return prefix, new_handle
