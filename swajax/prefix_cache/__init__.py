"""Prefix caches (host code, no JAX): the radix cache with full + SWA parts, the chunk cache."""

from swajax.prefix_cache.checks import check_invariants as check_invariants, stats as stats
from swajax.prefix_cache.chunk import ChunkCache as ChunkCache
from swajax.prefix_cache.locks import LockHandle as LockHandle
from swajax.prefix_cache.policy import SWAJAX, CachePolicy
from swajax.prefix_cache.protocol import PrefixCache as PrefixCache, Releaser as Releaser
from swajax.prefix_cache.radix import MatchResult as MatchResult, RadixCache as RadixCache
from swajax.sizing import PoolMode


def make_prefix_cache(
    releaser,
    *,
    page_size: int,
    window: int | None,
    pool_mode: PoolMode,
    enabled: bool = True,
    cap_leaf_to_window: bool = True,
    policy: CachePolicy = SWAJAX,
    host_tier: tuple[int, int] | None = None,
) -> PrefixCache:
    """The radix cache (any pool mode; all-SWA gives the pure-SWA cache), or the chunk cache.
    `host_tier`: (full, SWA) token capacities of a host tier for the radix cache."""
    if not enabled:
        return ChunkCache(releaser, page_size=page_size, window=window, pool_mode=pool_mode)
    window = None if PoolMode(pool_mode) is PoolMode.SINGLE else window
    return RadixCache(
        releaser,
        page_size=page_size,
        window=window,
        pool_mode=pool_mode,
        cap_leaf_to_window=cap_leaf_to_window,
        policy=policy,
        host_tier=host_tier,
    )
