"""The chunk cache: no sharing between requests; a request's KV is freed when it finishes.

With no prefix cache, runtime window eviction is the only SWA reclamation.
"""

from __future__ import annotations

import numpy as np

from swajax.observe import Observer, observed
from swajax.prefix_cache.explain import POLICY, MatchReport
from swajax.prefix_cache.protocol import Releaser
from swajax.prefix_cache.radix import MatchResult
from swajax.sizing import PoolMode

_EMPTY = np.zeros(0, np.int32)


class ChunkCache:
    observer: Observer | None = None  # swajax.observe: a recorder, if any

    swa_evictable = swa_protected = full_evictable = full_protected = 0
    hit_tokens = tail_miss_tokens = tombstones = 0

    def __init__(
        self,
        releaser: Releaser,
        *,
        page_size: int,
        window: int | None,
        pool_mode: PoolMode = PoolMode.HYBRID,
    ):
        self.releaser, self.ps, self.window = releaser, page_size, window
        self.mode = PoolMode(pool_mode)

    def nodes(self):
        return iter(())

    @observed
    def match(self, tokens) -> MatchResult:
        n = len(tokens)
        return MatchResult(_EMPTY, None, report=MatchReport(n, n, 0, 0, POLICY))

    @observed
    def lock(self, node):
        return None

    def lock_cost(self, node) -> int:
        return 0

    @observed
    def unlock(self, handle) -> None:
        pass

    @observed
    def release_swa(self, handle) -> None:
        pass

    @observed
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        return 0, 0

    @observed
    def cache_finished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len: int,
        swa_evicted_seqlen: int,
        handle=None,
        insert: bool = True,
        swa_evict_floor: int = 0,
        swa_branching_seqlen: int | None = None,
    ) -> None:
        """Free what the request holds: in hybrid mode `free` skips SWA already evicted; with
        no full pool the evicted positions are already free and must not be freed again."""
        slots = np.asarray(slots, np.int32)
        start, end = cache_protected_len, len(tokens)
        if self.mode is not PoolMode.ALL_SWA or swa_evicted_seqlen <= swa_evict_floor:
            self.releaser.free(slots[start:end])
            return
        # All-SWA: [floor, evicted) was freed by eviction; free around it (spec §8.2).
        keep = [slots[start:swa_evict_floor]] if swa_evict_floor > start else []
        keep.append(slots[max(swa_evicted_seqlen, start) : end])
        self.releaser.free(np.concatenate(keep))

    @observed
    def cache_unfinished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len: int,
        swa_evicted_seqlen: int,
        handle=None,
        swa_branching_seqlen: int | None = None,
    ):
        return np.asarray(slots[:cache_protected_len], np.int32), None
