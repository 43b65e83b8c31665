"""DeepSeek-V4's compressed caches: a third lifetime, addressed from the full index.

A compressed layer (CSA / HCA) makes one entry per `rate` tokens: window w covers positions
[w * rate, (w + 1) * rate) and its entry is made when its last token is computed. The entry lives
as long as the request (and then as long as the prefix cache keeps its tokens); the window never
frees it. That is the full pool's lifetime, so entries ride on full pages, with no table:

    entry slot of the token at full slot f = (f // page_size) * E + (f % page_size) // rate,
    E = ceil(page_size / rate) entry slots per page.

Pages hold positions page-aligned, so two window ends in one page are `rate` apart and land in
different slots. A page is allocated, shared by the prefix cache and freed with its entries; the
allocator needs no change. When the rate does not divide the page size, some slots stay unused
(at most one per page; sizing counts E per page).

Until its entry is made a token's compressor projections are *pending*; they are kept per token
in the SWA pool's slots (`pending`), where the window keeps them live: the span an entry reads
(the window, and for CSA's overlapping windows the one before) is at most W tokens back
(`HybridConfig` checks it). So chunked prefill, retraction, resumption and a prefix hit ending
between two boundaries need no per-request compressor state: it is a function of the pools.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from swajax.arith import ceil_div
from swajax.config import HybridConfig
from swajax.memory.zeros import zeros


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CompressedPools:
    # Per compressed layer (in layer order): entries [full pages * E, entry dims] and pending
    # projections [SWA rows, pending dims]. Row 0 (page 0) is the dummy padding writes into.
    entries: tuple[jax.Array, ...]
    pending: tuple[jax.Array, ...]
    # Global layer id -> index in the tuples (-1: not compressed).
    index: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    rates: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    page_size: int = dataclasses.field(metadata=dict(static=True))

    def per_page(self, i: int) -> int:
        """E: entry slots per full page of compressed layer `i`."""
        return ceil_div(self.page_size, self.rates[i])

    def entry_slot(self, i: int, full_slot: jax.Array) -> jax.Array:
        """Where the entry whose window ends at `full_slot` lives (compressed layer `i`)."""
        ps = self.page_size
        return (full_slot // ps) * self.per_page(i) + (full_slot % ps) // self.rates[i]

    def layer(self, layer_id: int) -> int:
        i = self.index[layer_id]
        if i < 0:
            raise ValueError(f"layer {layer_id} has no compressor")
        return i

    def replace(self, i: int, *, entries=None, pending=None) -> CompressedPools:
        def put(arrays, new):
            return arrays if new is None else (*arrays[:i], new, *arrays[i + 1 :])

        return dataclasses.replace(
            self, entries=put(self.entries, entries), pending=put(self.pending, pending)
        )


def init_compressed(
    cfg: HybridConfig, full_rows: int, swa_rows: int, page_size: int, dtype, sharding=None
) -> CompressedPools | None:
    """Zeroed stores for the compressed layers of `cfg` (None without any): `full_rows` /
    `swa_rows` are the pools' rows, dummy page included."""
    ids = cfg.compressed_layer_ids
    if not ids:
        return None
    layers = [cfg.layers[i] for i in ids]
    pages = full_rows // page_size
    shapes = [
        ((pages * ceil_div(page_size, la.compress_rate), la.compress_dims), dtype) for la in layers
    ]
    shapes += [((swa_rows, la.pending_dims), dtype) for la in layers]
    arrays = zeros(*shapes, sharding=sharding)
    index = [-1] * cfg.num_layers
    for j, i in enumerate(ids):
        index[i] = j
    return CompressedPools(
        entries=tuple(arrays[: len(ids)]),
        pending=tuple(arrays[len(ids) :]),
        index=tuple(index),
        rates=tuple(la.compress_rate for la in layers),
        page_size=page_size,
    )


def dtype_of(pool_dtype) -> jnp.dtype:
    """What the compressed stores keep: the pools' dtype, bf16 for an FP8 pool (see
    `sizing.compressed_dtype_bytes`)."""
    dt = jnp.dtype(pool_dtype)
    return jnp.dtype(jnp.bfloat16) if dt.itemsize < 2 else dt
