"""XLA attention over paged KV: the fast path on CPU and the readable reference.

For each block of `block_q` queries of one request, gather only the pages its queries can see:
for a local layer the pages of [first query - W, last query] from the batch's translated SWA
table (so the cost grows with W, not with the sequence length), for a full layer every page of
the request. Blocks run in batches under `lax.map` to bound the gathered working set.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from swajax.arith import ceil_div
from swajax.attention.mask import lookback, visible, window_start
from swajax.attention.metadata import AttentionMetadata, from_blocks, to_blocks
from swajax.config import LayerSpec
from swajax.kernels import common

KEYS_PER_BATCH = 1 << 16  # gathered key rows per lax.map step (bounds memory for long contexts)


def softmax_attend(q, k, v, mask, *, scale, sinks=None, soft_cap=None):
    """Dense masked attention of one block, in float32 (the kernels' math, vmapped over heads).

    Args:
      q: [Q, Hkv, G, Dk] queries (G query heads share one KV head).
      k: [S, Hkv, Dk]; v: [S, Hkv, Dv].
      mask: bool[Q, S], True where the query sees the key.
      sinks: optional f32[Hkv, G] per-head logits added to the softmax denominator only.
    Returns:
      [Q, Hkv, G, Dv] float32; rows that see no key (and have no sink) are 0.
    """
    nq, hkv, g, dk = q.shape
    rows = jnp.moveaxis(q, 1, 0).reshape(hkv, nq * g, dk)  # row = query * G + group
    row_mask = jnp.repeat(mask, g, axis=0)
    sink_rows = None if sinks is None else jnp.tile(sinks, (1, nq))
    one_head = functools.partial(common.dense_reference, scale=scale, soft_cap=soft_cap)
    out = jax.vmap(
        lambda qh, kh, vh, sh: one_head(qh, kh, vh, row_mask, sink=sh),
        in_axes=(0, 1, 1, 0 if sinks is not None else None),
    )(rows, k, v, sink_rows)
    return jnp.moveaxis(out.reshape(hkv, nq, g, -1), 0, 1)


def block_pages(meta: AttentionMetadata, layer: LayerSpec) -> int:
    """Pages a block of queries can touch (static)."""
    if not layer.kind.is_local:
        return meta.full_page_table.shape[1]
    span = lookback(layer) + meta.block_q - 1  # key positions before the block's last query
    return min(ceil_div(span, meta.page_size) + 1, meta.swa_page_table.shape[1])


def block_keys(meta: AttentionMetadata, layer: LayerSpec, req, first_q):
    """Pages to read for one block and the key position of every row of those pages."""
    ps, n = meta.page_size, block_pages(meta, layer)
    if layer.kind.is_local:
        first = jnp.maximum(window_start(first_q, layer), 0) // ps
        table, cols = meta.swa_page_table[req], first - meta.swa_first_page[req]
    else:
        first = jnp.int32(0)
        table, cols = meta.full_page_table[req], jnp.int32(0)
    cols = cols + jnp.arange(n, dtype=jnp.int32)
    in_table = (cols >= 0) & (cols < table.shape[0])
    pages = jnp.where(in_table, table[jnp.clip(cols, 0, table.shape[0] - 1)], 0)
    k_pos = (first + jnp.arange(n, dtype=jnp.int32))[:, None] * ps + jnp.arange(ps)
    k_pos = jnp.where(in_table[:, None], k_pos, -1)  # -1: never visible
    return pages, k_pos.reshape(-1)


def attention_xla(
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
    """Paged attention for a flattened batch.

    Args:
      q: [T, Hq, Dk] queries in the order of `meta.positions`.
      k_pages: [num_pages + 1, page_size, Hkv, Dk] one layer's K pool (page 0 is the dummy).
      v_pages: [num_pages + 1, page_size, Hkv, Dv].
      layer: kind and window of the layer (local layers read the SWA page table).
      sinks: optional [Hq] per-head sink logits.
      key_transform: optional fn(rows [S, Hkv, Dk], positions i32[S]) -> keys, applied to the
        gathered K rows (a pool whose keys are derived from the stored values, Gemma 4).
    Returns:
      [T, Hq, Dv] in q's dtype (padding rows are 0).
    """
    t, hq, dk = q.shape
    hkv, dv = k_pages.shape[2], v_pages.shape[3]
    g = hq // hkv
    sink = None if sinks is None else sinks.astype(jnp.float32).reshape(hkv, g)
    q_blocks = to_blocks(q, meta).reshape(*meta.block_tokens.shape, hkv, g, dk)

    def one_block(args):
        qb, req, first_q, tokens = args
        pages, k_pos = block_keys(meta, layer, req, first_q)
        k = k_pages[pages].reshape(-1, hkv, dk)
        k = k if key_transform is None else key_transform(k, k_pos)
        v = v_pages[pages].reshape(-1, hkv, dv)
        q_pos = first_q + jnp.arange(meta.block_q, dtype=jnp.int32)
        mask = visible(q_pos[:, None], k_pos[None, :], layer)
        mask &= (k_pos < meta.seq_lens[req])[None, :] & (tokens < t)[:, None]
        return softmax_attend(qb, k, v, mask, scale=scale, sinks=sink, soft_cap=soft_cap)

    keys = block_pages(meta, layer) * meta.page_size
    batch = max(1, KEYS_PER_BATCH // keys)
    args = (q_blocks, meta.block_req, meta.block_pos, meta.block_tokens)
    out = jax.lax.map(one_block, args, batch_size=batch)  # [NB, block_q, Hkv, G, Dv]
    return from_blocks(out.reshape(*meta.block_tokens.shape, hq, dv), meta, q.dtype)
