"""Cache-policy profiles: the rules on which swajax's prefix cache and SGLang 0.5.23's unified
radix tree differ (spec §16), one switch each, so the oracle can speak either's language.

Certified by replaying traces recorded under `sglang-0.5.23` through SGLang 0.5.23's own
allocator and unified radix tree (tests/peers, a separate run): every operation agrees. Each
rule's effect on hit rate, tail misses and SWA occupancy, and why the default is what it is, is
in BUILD_NOTES.md (benchmarks/cache_policy.py).
"""

from __future__ import annotations

import dataclasses

from swajax.errors import InputError
from swajax.sizing import PoolMode


@dataclasses.dataclass(frozen=True)
class CachePolicy:
    name: str
    # 1. At a chunk checkpoint, free the request's out-of-window SWA KV first, so the chunk
    #    enters the tree as tombstones plus about one live window (SGLang frees it inside
    #    cache_unfinished); swajax keeps the chunk's SWA live until LRU eviction.
    eager_window_free: bool = False
    # 2. A match or an insert refreshes the SWA recency of the last W + page-size tokens above
    #    where it ends only (an insert's walk refreshes none on the way down; the full recency
    #    of the whole path), and a split puts the new upper part just before its lower part in
    #    SWA recency (in full recency both become most recent, as in swajax).
    window_recency: bool = False
    # 3. When a leaf is evicted, a parent left as a childless, unlocked tombstone stays (a leaf
    #    holding full KV only) instead of being deleted with it.
    keep_childless_tombstones: bool = False
    # 4. The admission match records how far the full KV matched beyond the SWA-valid hit
    #    (`swa_branching_seqlen`); the request's chunk checkpoints insert no further than that.
    branch_insert: bool = False
    # 5. The eviction frontier keeps ceil_align(max(W, ps), ps) tokens before the next query
    #    (swajax: max(W, ps)), and a checkpoint also follows the last prefill chunk.
    frontier_ceil_align: bool = False
    checkpoint_last_chunk: bool = False
    # 6. A match whose last W tokens hold a tombstone resumes at the fallback point (the last
    #    position with W live tokens before it) and recomputes everything after it; swajax
    #    recomputes only the n W tokens the exact SWA-tail rebuild needs (serving/tail_rebuild.py).
    fallback_only: bool = False
    # 7. A window lock walks up from its node counting every node it passes, tombstones
    #    included, and locks whole nodes until it has covered W tokens (swajax counts live
    #    tokens only and splits the node where the window ends, so it pins exactly W).
    node_window_lock: bool = False
    # 8. Releasing a request's window early (its query moved past the cached prefix) leaves
    #    that SWA KV evictable; swajax tombstones a leaf the request still holds at once.
    lazy_window_release: bool = False
    # 9. A chunk checkpoint that inserts nothing new still re-locks (and so pins a window the
    #    request had released); swajax keeps the request's lock.
    relock_checkpoint: bool = False
    # 10. In an all-SWA pool (no full layers), a request frees no SWA KV below where its last
    #     prefill chunk ended and, when it ends, caches only that far: the tree never holds a
    #     position whose KV the window freed, so it is a plain radix tree (no tombstones, no
    #     window hit rule, whole paths locked, leaves evicted by recency: SGLang's
    #     PureSWARadixCache with its prefill-aware floor). swajax keeps the seed's rules in
    #     all-SWA pools too. No effect on hybrid or single pools.
    prefill_floor: bool = False

    # Not a rule SGLang and swajax differ on but a capability: a profile whose cache has no
    # host tier for hybrid SWA models (SGLang 0.5.23's HiCache does not take them) refuses one.
    host_tier: bool = True

    def floors_prefills(self, mode: PoolMode) -> bool:
        """Whether rule 10 holds for a pool in `mode`: prefill floors, and a plain tree."""
        return self.prefill_floor and PoolMode(mode) is PoolMode.ALL_SWA

    RULES = (
        "eager_window_free",
        "window_recency",
        "keep_childless_tombstones",
        "branch_insert",
        "frontier_ceil_align",
        "checkpoint_last_chunk",
        "fallback_only",
        "node_window_lock",
        "lazy_window_release",
        "relock_checkpoint",
        "prefill_floor",
    )


SWAJAX = CachePolicy("swajax")
SGLANG_0_5_23 = CachePolicy(
    "sglang-0.5.23", host_tier=False, **{rule: True for rule in CachePolicy.RULES}
)
# The default, chosen by measurement (BUILD_NOTES.md, benchmarks/cache_policy.py): swajax's
# rules plus the eager out-of-window free, which lowered mean SWA-pool occupancy by 2-30% at
# the same hit rate and step count; no other rule helped on the built-in workloads.
LEAN = CachePolicy("lean", eager_window_free=True)
PROFILES = {p.name: p for p in (SWAJAX, SGLANG_0_5_23, LEAN)}
DEFAULT = "lean"


def policy_of(name: str | CachePolicy) -> CachePolicy:
    """A profile by name (or a `CachePolicy` itself: tests toggle single rules)."""
    if isinstance(name, CachePolicy):
        return name
    if not isinstance(name, str) or name not in PROFILES:
        raise InputError(f"cache policy must be one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]
