"""What a prefix cache offers the scheduler, and what it needs from the pools (host code)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class Releaser(Protocol):
    """What a cache needs from the pools (the engine's `PoolLedger`, or `KVAllocator`)."""

    def free(self, slots) -> None: ...
    def free_swa(self, slots) -> None: ...
    def move_swa(self, dst, src) -> None: ...


class PrefixCache(Protocol):
    """The radix cache (`RadixCache`) and the no-sharing chunk cache (`ChunkCache`).

    Sizes are tokens; without an SWA component the SWA figures mirror the full ones.
    """

    full_evictable: int
    full_protected: int
    hit_tokens: int
    tail_miss_tokens: int

    @property
    def swa_evictable(self) -> int: ...
    @property
    def swa_protected(self) -> int: ...
    @property
    def tombstones(self) -> int: ...

    def match(self, tokens): ...
    def lock(self, node): ...
    def unlock(self, handle) -> None: ...
    def release_swa(self, handle) -> None: ...
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]: ...
    def cache_finished(
        self, tokens, slots, *, cache_protected_len, swa_evicted_seqlen, handle, insert=True
    ) -> None: ...
    def cache_unfinished(
        self, tokens, slots, *, cache_protected_len, swa_evicted_seqlen, handle
    ) -> tuple[np.ndarray, object]: ...
    def nodes(self) -> Iterator: ...
