"""What a prefix cache offers the scheduler, and what it needs from the pools (host code)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class Releaser(Protocol):
    """What a cache needs from the pools (the engine's `PoolLedger`, or the numpy
    twin of the device allocator, `HostAllocator`)."""

    def free(self, slots) -> None: ...
    def free_swa(self, slots) -> None: ...
    def move_swa(self, dst, src) -> None: ...
    # A host tier's needs (host_tier.py): free counts, pages for loads, the copies.
    def available(self) -> tuple[int, int]: ...
    def claim(self, tokens: int) -> np.ndarray: ...
    def pair_swa(self, slots) -> None: ...
    def save(self, pool: str, slots, host_pages) -> None: ...
    def load(self, pool: str, slots, host_pages) -> None: ...


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
    def lock_cost(self, node) -> int: ...
    def unlock(self, handle) -> None: ...
    def release_swa(self, handle) -> None: ...
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]: ...
    def cache_finished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len,
        swa_evicted_seqlen,
        handle,
        insert=True,
        swa_evict_floor=0,
        swa_branching_seqlen=None,
    ) -> None: ...
    def cache_unfinished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len,
        swa_evicted_seqlen,
        handle,
        swa_branching_seqlen=None,
    ) -> tuple[np.ndarray, object]: ...
    def nodes(self) -> Iterator: ...


class Tree(Protocol):
    """What the radix cache's collaborators (`WindowLocks`, `Evictor`, `RequestCaching`) may
    use of the tree: its configuration, recency lists, size counters and public operations."""

    root: object
    ps: int
    window: int | None
    swa: bool
    mode: object
    cap_leaf: bool
    releaser: Releaser
    full_lru: object
    swa_lru: object
    sizes: object  # radix.Sizes: full / SWA x evictable / protected token counts
    tier: object  # host_tier.HostTier or None
    policy: object
    evictor: object
    evicting: int | None  # the number of the eviction under way (explain.py), or None
    ghosts: object  # explain.Ghosts: pages whose full KV was deleted, for explanations

    def aligned(self, tokens) -> tuple[int, ...]: ...
    def walk(self, key, visit=None) -> list: ...
    def split(self, node, k: int): ...
    def free_node(self, node) -> None: ...
    def free_request(self, slots, start: int, evicted: int) -> None: ...
    def insert(self, tokens, slots, prev_prefix_len=0, swa_evicted_seqlen=0, **kw) -> int: ...
    def nodes(self): ...
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]: ...
    def lock(self, node): ...
    def unlock(self, handle) -> None: ...
