"""Batch-invariant paged attention: a query's output is the same bits however it was batched.

The XLA path and the kernels reduce over the keys a block of queries gathered, so a query's
sum depends on its block (its companions, where a chunk began, the page size). Here every query
is its own computation: its keys are folded into the online softmax in tiles of KEY_TILE key
positions aligned to absolute positions (tile j holds keys [j KEY_TILE, (j + 1) KEY_TILE)), in
order, each tile with the same shapes. Which tiles a batch scans varies (a full layer scans to
the batch's longest request), but a tile a query sees nothing of is an exact no-op: its running
max stays, the rescale factor is exp(0) = 1 and every product it adds is 0. So the output bits
depend only on the query, its position and the KV stored at the positions it sees: the same
from a cold prefill, a prefix hit, a rebuilt tail or a host-tier load, at any chunk or page
size, alone or in a batch of 64.

Queries run `QUERY_BATCH` at a time (the token count padded to a multiple of it), so every
program runs the same vectorized body. Every loop here and in `swajax.models.invariant` has a
trip count XLA cannot see (`fenced_loop`): a loop it can count, it may unroll or inline when
short, and a body fused with its neighbours computes different bits (measured: a norm in a
one-trip loop differs from the same norm in a two-trip one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from swajax.arith import ceil_div, round_up
from swajax.attention.mask import lookback, visible, window_start
from swajax.attention.metadata import AttentionMetadata
from swajax.config import LayerSpec
from swajax.kernels import common
from swajax.memory import bits

KEY_TILE = 64  # key positions per softmax step (independent of the page size)
QUERY_BATCH = 8  # queries per vectorized step of the map
# Key rows gathered out of the pools at once. Gathered outside any loop, the keys of a whole
# decode batch are read with no copy of the pools: a loop that reads a pool, which the step
# then updates in place (the next layer's KV write), makes XLA copy the whole sub-pool first
# (measured: 6 copies of a 0.25 GiB pool per layer, 100x the decode step). A batch whose keys
# exceed it (a prefill chunk; at long contexts, a decode batch of more than GATHERED_KEYS /
# context queries on full layers) gathers a chunk of queries at a time inside a loop and pays
# that copy once per layer.
GATHERED_KEYS = 1 << 16


def fenced_loop(trips, body, carry):
    """carry = body(i, carry) for i in [0, trips), the trip count hidden from XLA."""
    return jax.lax.fori_loop(0, jax.lax.optimization_barrier(jnp.int32(trips)), body, carry)


def tiled(fn, xs: tuple, tile: int):
    """fn(*xs) `tile` rows at a time: each x [N, ...] split along its rows (padded with 0), each
    output [N, ...] put back together (a pytree of them), in a `fenced_loop`."""
    n = xs[0].shape[0]
    padded = round_up(max(n, 1), tile)
    xs = tuple(jnp.pad(x, ((0, padded - n),) + ((0, 0),) * (x.ndim - 1)) for x in xs)
    parts = (jax.ShapeDtypeStruct((tile, *x.shape[1:]), x.dtype) for x in xs)
    shapes = jax.eval_shape(fn, *parts)
    out = jax.tree.map(lambda s: jnp.zeros((padded, *s.shape[1:]), s.dtype), shapes)

    def step(i, out):
        y = fn(*(jax.lax.dynamic_slice_in_dim(x, i * tile, tile) for x in xs))
        put = lambda o, y: jax.lax.dynamic_update_slice_in_dim(o, y, i * tile, 0)  # noqa: E731
        return jax.tree.map(put, out, y)

    return jax.tree.map(lambda o: o[:n], fenced_loop(padded // tile, step, out))


def key_tiles(meta: AttentionMetadata, layer: LayerSpec) -> int:
    """Tiles a query scans (static): a local layer's span [q - lookback, q] in any alignment,
    a full layer's whole page table."""
    if layer.kind.is_local:
        return ceil_div(lookback(layer) + 1, KEY_TILE) + 1
    return ceil_div(meta.full_page_table.shape[1] * meta.page_size, KEY_TILE)


def tile_slots(meta: AttentionMetadata, layer: LayerSpec, req, positions):
    """(page, row in the page) of key `positions` of request `req`, and whether the table holds
    them; local layers read the translated SWA table."""
    ps = meta.page_size
    if layer.kind.is_local:
        table, cols = meta.swa_page_table[req], positions // ps - meta.swa_first_page[req]
    else:
        table, cols = meta.full_page_table[req], positions // ps
    held = (positions >= 0) & (cols >= 0) & (cols < table.shape[0])
    pages = jnp.where(held, table[jnp.clip(cols, 0, table.shape[0] - 1)], 0)
    return (pages, positions % ps), held


def gather(pages, slots):
    """pages[slots] moved as bits (`memory.bits`): XLA:CPU would widen a bfloat16 pool whole
    to gather from it, every layer of every step."""
    return bits.from_bits(bits.to_bits(pages)[slots], pages.dtype)


def attention_invariant(
    q,
    k_pages,
    v_pages,
    meta: AttentionMetadata,
    layer: LayerSpec,
    *,
    scale,
    sinks=None,
    soft_cap=None,
    key_transform=None,
):
    """Same contract as `attention_xla`, batch-invariant (module docstring)."""
    t, hq, dk = q.shape
    hkv, dv = k_pages.shape[2], v_pages.shape[3]
    g = hq // hkv
    sink = None if sinks is None else sinks.astype(jnp.float32).reshape(hkv, g)
    tiles = key_tiles(meta, layer)
    local = layer.kind.is_local

    def keys(pos, req, valid):
        """One query's key tiles, gathered: K [tiles, KEY_TILE, Hkv, Dk], V, and its mask."""
        first = (window_start(pos, layer) if local else pos * 0) // KEY_TILE
        k_pos = (first + jnp.arange(tiles, dtype=jnp.int32))[:, None] * KEY_TILE
        k_pos = k_pos + jnp.arange(KEY_TILE, dtype=jnp.int32)
        slots, held = tile_slots(meta, layer, req, k_pos)
        k = gather(k_pages, slots)
        k = k if key_transform is None else key_transform(k.reshape(-1, hkv, dk), k_pos.ravel())
        sees = visible(pos, k_pos, layer) & held & (k_pos < meta.seq_lens[req]) & valid
        return k.reshape(tiles, KEY_TILE, hkv, dk), gather(v_pages, slots), sees

    def fold(qh, k, v, sees):  # one query: qh [Hkv, G, Dk]; its gathered tiles
        def step(j, carry):
            mask = jnp.broadcast_to(sees[j], (g, KEY_TILE))
            one = lambda c, qq, kk, vv: common.softmax_step(  # noqa: E731
                *c, qq, kk, vv, mask, scale=scale, soft_cap=soft_cap
            )
            return jax.vmap(one, in_axes=(0, 0, 1, 1))(carry, qh, k[j], v[j])

        if sink is None:
            init = jax.vmap(lambda _: common.softmax_init(g, dv))(jnp.arange(hkv))
        else:
            init = jax.vmap(lambda s: common.softmax_init(g, dv, s))(sink)
        _, l, acc = fenced_loop(tiles, step, init)
        return jax.vmap(common.softmax_finish)(l, acc)  # [Hkv, G, Dv]

    def chunk(qs, pos, req, valid):
        """Gather a chunk's keys, then fold them in `QUERY_BATCH` queries at a time."""
        k, v, sees = jax.vmap(keys)(pos, req, valid)
        return tiled(jax.vmap(fold), (qs, k, v, sees), QUERY_BATCH)

    args = (q.reshape(t, hkv, g, dk), meta.positions, meta.token_req, meta.token_valid)
    size = chunk_queries(tiles, t)
    if size >= t:  # no loop reads the pools (see GATHERED_KEYS)
        out = chunk(*args)
    else:
        out = tiled(chunk, args, size)
    return out.reshape(t, hq, dv).astype(q.dtype)


def chunk_queries(tiles: int, num_tokens: int) -> int:
    """Queries whose keys are gathered at once: all of a batch's up to GATHERED_KEYS keys (a
    multiple of QUERY_BATCH)."""
    per_query = tiles * KEY_TILE
    fit = max(QUERY_BATCH, GATHERED_KEYS // per_query // QUERY_BATCH * QUERY_BATCH)
    return min(fit, round_up(num_tokens, QUERY_BATCH))
