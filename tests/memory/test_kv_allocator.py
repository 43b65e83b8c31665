"""The host allocator handle: deferred frees apply in one call and never alias caller arrays."""

import numpy as np

from swajax.memory import allocator as A
from swajax.memory.kv_allocator import KVAllocator


def test_deferred_free_copies_its_input():
    """Regression: the engine rewrites a request's slot array in place after the cache freed
    part of it; a deferred free holding a view would then free the cache's slots."""
    alloc = KVAllocator.create(64, 64, 4)
    _, slots = alloc.alloc_extend([0], [8], [-1])
    _, other = alloc.alloc_extend([0], [8], [-1])
    arr = np.array(slots)
    alloc.free(arr)
    arr[:] = other  # the caller reuses its array before the flush
    alloc.flush()
    assert (alloc.translate(other) > 0).all() and (alloc.translate(slots) == 0).all()
    assert alloc.available() == (56, 56)
    A.check_invariants(alloc.state)


def test_frees_batch_into_one_call_and_flush_before_allocating():
    alloc = KVAllocator.create(64, 32, 4)
    _, a = alloc.alloc_extend([0], [16], [-1])
    alloc.free_swa(a[:8])
    alloc.free(a[8:])
    assert alloc._free and alloc._free_swa  # nothing applied yet
    status, _ = alloc.alloc_extend([0], [8], [-1])
    assert status == 0 and not alloc._free and not alloc._free_swa
    assert alloc.available() == (64 - 8 - 8, 32 - 8)
