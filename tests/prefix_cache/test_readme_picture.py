"""The README's picture of one request's pages in both pools, step by step (W = 4, page size 2,
a 6-token prompt, five decode steps, out-of-window SWA freed every step), checked on the
allocator's numpy twin and the radix tree."""

import numpy as np
from helpers.cache_sim import evict_window, finish, grow, start

from swajax.memory.host_allocator import HostAllocator
from swajax.prefix_cache import RadixCache

W, P = 4, 2


def test_the_readme_picture():
    alloc = HostAllocator(32, 16, P)
    cache = RadixCache(alloc, page_size=P, window=W)
    req = start(cache, alloc, list(range(1, 7)))
    assert (alloc.translate(req.slots) > 0).all()  # after the prefill: every page in both pools
    full_before = req.slots.copy()
    for token in range(7, 12):
        grow(alloc, req, [token])
        evict_window(alloc, req, window=W, page_size=P)
    swa = alloc.translate(req.slots)
    # The next query (position 11) reads keys 7..11: positions 0..5 gave their SWA pages back,
    # the full pool keeps every page and the full index never changed.
    assert (swa[:6] == 0).all() and (swa[6:] > 0).all()
    assert (req.slots[:6] == full_before).all() and (req.slots > 0).all()
    assert alloc.available() == (32 - 12, 16 - 6)  # 6 pages of full, 3 of SWA held
    finish(cache, req)
    nodes = [(len(n), n.swa_live) for n in cache.nodes()]
    assert nodes == [(6, False), (4, True)]  # a tombstone prefix, then W live tokens
    assert len(cache.match(list(range(1, 12)))) == 10  # W live tokens end at the match end
    cache.evict(0, W)  # the live leaf's SWA goes: a leaf is never a tombstone, so it goes whole
    assert len(cache.match(list(range(1, 12)))) == 0 and alloc.available() == (32, 16)
    assert np.array_equal(alloc.translate(np.arange(1, 32)), np.zeros(31))
