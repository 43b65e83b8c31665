"""The device half of a host tier's copies (prefix_cache/host_tier.py): whole pages of KV
gathered for the host, and loads that take the pages the host chose and scatter KV into them.

Pages move as [pages, layers, page_size, heads * dim] (K and V per sub-pool), the host store's
layout, so a page of every layer is one contiguous host block; the transposes run on the device.
DeepSeek-V4's compressed stores move with the pages they live on: a full page's entry slots
([pages, E, dims] per compressed layer) and an SWA page's pending rows ([pages, ps, dims]).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from swajax.memory import allocator as A
from swajax.memory.pool import KVPools, stored
from swajax.sizing import PoolMode


def _buffers(pools: KVPools, swa: bool) -> tuple[jax.Array, jax.Array]:
    return (pools.swa_k, pools.swa_v) if swa else (pools.full_k, pools.full_v)


def _compressed(pools: KVPools, swa: bool) -> tuple[jax.Array, ...]:
    """The compressed stores that live on this sub-pool's pages (none but DeepSeek-V4's)."""
    c = pools.compressed
    if c is None:
        return ()
    return c.pending if swa else c.entries


def _rows_per_page(pools: KVPools, swa: bool) -> tuple[int, ...]:
    """Rows of each compressed store on one page: ps pending rows, or E entry slots."""
    c = pools.compressed
    return tuple(pools.page_size if swa else c.per_page(i) for i in range(len(c.rates)))


def page_layouts(pools: KVPools, swa: bool) -> tuple[tuple[tuple[int, ...], object], ...]:
    """(shape, dtype) of one page of each buffer a sub-pool's page moves: K, V, then the
    compressed stores on it (the host store's layout)."""
    ps = pools.page_size
    out = [((b.shape[0], ps, *b.shape[2:]), b.dtype) for b in _buffers(pools, swa)]
    if pools.compressed is not None:
        rows = _rows_per_page(pools, swa)
        out += [((r, b.shape[1]), b.dtype) for r, b in zip(rows, _compressed(pools, swa))]
    return tuple(out)


def _compressed_rows(pools: KVPools, swa: bool, pages, slots) -> list[jax.Array]:
    """Rows of each compressed store on `pages` (SWA: the pages' translated `slots`)."""
    if swa:
        return [slots] * len(_compressed(pools, swa))
    return [(pages[:, None] * r + jnp.arange(r)).reshape(-1) for r in _rows_per_page(pools, swa)]


def _to_pages(x: jax.Array, ps: int) -> jax.Array:
    layers, n, *rest = x.shape
    return x.reshape(layers, n // ps, ps, *rest).swapaxes(0, 1)


def _from_pages(x: jax.Array) -> jax.Array:
    pages, layers, ps, *rest = x.shape
    return x.swapaxes(0, 1).reshape(layers, pages * ps, *rest)


def _slots(pages: jax.Array, ps: int) -> jax.Array:
    return (pages[:, None] * ps + jnp.arange(ps)).reshape(-1)


@functools.partial(jax.jit, static_argnames="swa")
def gather_pages(alloc: A.AllocatorState, pools: KVPools, pages: jax.Array, *, swa: bool):
    """(K, V) of the full pages `pages` (i32[n], 0 = padding: the dummy page), or of the SWA
    pages paired with them, as [n, layers, page_size, heads * dim]."""
    ps = alloc.page_size
    rows = _slots(pages, ps)
    rows = A.translate(alloc, rows) if swa else rows
    kv = tuple(_to_pages(buffer[:, rows], ps) for buffer in _buffers(pools, swa))
    if pools.compressed is None:
        return kv
    stores = zip(_compressed(pools, swa), _compressed_rows(pools, swa, pages, rows))
    n = pages.shape[0]
    return kv + tuple(store[r].reshape(n, -1, store.shape[1]) for store, r in stores)


def _pair(alloc: A.AllocatorState, pages: jax.Array) -> A.AllocatorState:
    """Give each full page in `pages` (0 = padding) a fresh SWA page, top of the stack first."""
    ps = alloc.page_size
    valid = pages > 0
    swa_pages = jnp.where(valid, alloc.swa.peek(jnp.cumsum(valid) - 1), 0)
    full_slots, swa_slots = _slots(pages, ps), _slots(swa_pages, ps)
    size = alloc.full_to_swa.shape[0]
    target = jnp.where(jnp.repeat(valid, ps), full_slots, size)  # padding falls off the end
    return dataclasses.replace(
        alloc,
        swa=alloc.swa.pop(jnp.sum(valid, dtype=jnp.int32), swa_pages),
        full_to_swa=alloc.full_to_swa.at[target].set(swa_slots, mode="drop"),
    )


def claim_pages(alloc: A.AllocatorState, claim: jax.Array, pair: jax.Array) -> A.AllocatorState:
    """A load's allocator half (traceable): take the full pages `claim` off the free list, then
    pair the full pages `pair` with fresh SWA pages."""
    return _pair(dataclasses.replace(alloc, full=alloc.full.claim(claim)), pair)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def load_pages(alloc, pools, claim, full_kv, pair, swa_kv):
    """A host-tier load, after the step's releases: take the full pages `claim` (i32[n], 0 =
    padding) off the free list and store `full_kv` ((K, V) as [n, layers, ps, heads * dim])
    there; pair the full pages `pair` with fresh SWA pages and store `swa_kv` there."""
    ps = alloc.page_size
    alloc = claim_pages(alloc, claim, pair)
    rows = {False: _slots(claim, ps), True: A.translate(alloc, _slots(pair, ps))}
    new, comp = {}, pools.compressed
    for swa, kv, pages in ((False, full_kv, claim), (True, swa_kv, pair)):
        names = ("swa_k", "swa_v") if swa else ("full_k", "full_v")
        for name, buffer, x in zip(names, _buffers(pools, swa), kv):
            new[name] = buffer.at[:, rows[swa]].set(stored(_from_pages(x), buffer.dtype))
        if comp is not None:
            stores = _compressed(pools, swa)
            at = _compressed_rows(pools, swa, pages, rows[swa])
            for i, (store, r, x) in enumerate(zip(stores, at, kv[2:])):
                store = store.at[r].set(x.reshape(-1, store.shape[1]).astype(store.dtype))
                comp = comp.replace(i, **{"pending" if swa else "entries": store})
    return alloc, dataclasses.replace(pools, **new, compressed=comp)


def page_sets(pools: KVPools) -> tuple[bool, ...]:
    """The buffer sets (False: full, True: SWA) that hold KV at the one pool's slots in a
    one-pool layout: both in a single pool (SWA layers share the full slots), the SWA set in an
    all-SWA pool (its full set is the dummy page alone)."""
    return tuple(s for s in (False, True) if _buffers(pools, s)[0].shape[1] > pools.page_size)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def load_primary_pages(alloc, pools, claim, kv):
    """A one-pool layout's load (single or all-SWA): take the pages `claim` (i32[n], 0 =
    padding) off the pool's free list and store `kv` there, one (K, V) pair per buffer set of
    `page_sets`, each [n, layers, page_size, heads * dim]."""
    primary = "swa" if alloc.mode is PoolMode.ALL_SWA else "full"
    alloc = dataclasses.replace(alloc, **{primary: alloc.primary.claim(claim)})
    rows = _slots(claim, alloc.page_size)
    new = {}
    for swa, pair in zip(page_sets(pools), kv):
        names = ("swa_k", "swa_v") if swa else ("full_k", "full_v")
        for name, buffer, x in zip(names, _buffers(pools, swa), pair):
            new[name] = buffer.at[:, rows].set(stored(_from_pages(x), buffer.dtype))
    return alloc, dataclasses.replace(pools, **new)
