"""The device half of a host tier's copies (prefix_cache/host_tier.py): whole pages of KV
gathered for the host, and loads that take the pages the host chose and scatter KV into them.

Pages move as [pages, layers, page_size, heads, dim] (K and V per sub-pool), the host store's
layout, so a page of every layer is one contiguous host block; the transposes run on the device.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from swajax.memory import allocator as A
from swajax.memory.pool import KVPools, stored


def _buffers(pools: KVPools, swa: bool) -> tuple[jax.Array, jax.Array]:
    return (pools.swa_k, pools.swa_v) if swa else (pools.full_k, pools.full_v)


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
    pages paired with them, as [n, layers, page_size, heads, dim]."""
    ps = alloc.page_size
    rows = _slots(pages, ps)
    rows = A.translate(alloc, rows) if swa else rows
    return tuple(_to_pages(buffer[:, rows], ps) for buffer in _buffers(pools, swa))


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
    padding) off the free list and store `full_kv` ((K, V) as [n, layers, ps, heads, dim])
    there; pair the full pages `pair` with fresh SWA pages and store `swa_kv` there."""
    ps = alloc.page_size
    alloc = claim_pages(alloc, claim, pair)
    rows = {False: _slots(claim, ps), True: A.translate(alloc, _slots(pair, ps))}
    new = {}
    for swa, kv in ((False, full_kv), (True, swa_kv)):
        names = ("swa_k", "swa_v") if swa else ("full_k", "full_v")
        for name, buffer, pages in zip(names, _buffers(pools, swa), kv):
            new[name] = buffer.at[:, rows[swa]].set(stored(_from_pages(pages), buffer.dtype))
    return alloc, dataclasses.replace(pools, **new)
