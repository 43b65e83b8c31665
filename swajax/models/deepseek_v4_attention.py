"""DeepSeek-V4's attention over the pools: a query's window keys and its layer's compressed
entries share one softmax (with the per-head sinks). XLA only: `--attention pallas` runs the
other families' layers in the kernels and these here (BUILD_NOTES.md, "DeepSeek-V4").

Query t sees the window [t - W, t] from the SWA pool (K = V, one head) and, on a compressed
layer, entry w iff its window has ended by t (w < (t + 1) / rate). On a CSA layer only the
`index_topk` entries the Lightning Indexer scores highest among those:
score(t, s) = sum_h w_{t,h} * relu(q_{t,h} . k_s) / sqrt(index_dim). A CSA query reads every
entry's indexer key but only its chosen entries' KV (a decode step at context n reads n / 4
keys of 128 values and top-k entries of 512, not n / 4 of 640).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from swajax.attention.mask import visible
from swajax.attention.metadata import AttentionMetadata, from_blocks, to_blocks
from swajax.attention.xla import KEYS_PER_BATCH, block_keys, block_pages, softmax_attend
from swajax.config import LayerSpec
from swajax.memory.pool import KVPools, Slot

F32 = jnp.float32
HIGHEST = jax.lax.Precision.HIGHEST


def entry_table(meta: AttentionMetadata, pools: KVPools, i: int, req):
    """Entry slots of request `req`'s windows 0..N-1 (N: what its full page table can hold)
    and the position each window ends at."""
    comp, ps = pools.compressed, meta.page_size
    table = meta.full_page_table[req]
    n = table.shape[0] * ps // comp.rates[i]
    ends = (jnp.arange(n, dtype=jnp.int32) + 1) * comp.rates[i] - 1
    full = table[ends // ps] * ps + ends % ps
    return comp.entry_slot(i, full), ends


def attend(
    q,
    pools: KVPools,
    slot: Slot,
    meta: AttentionMetadata,
    layer: LayerSpec,
    *,
    scale,
    sinks,
    compressed: int | None = None,
    index=None,
    topk: int = 0,
):
    """q [T, H, D] -> [T, H, D]. `compressed`: the layer's index in the compressed stores
    (None: window only). `index` (CSA): (indexer queries [T, Hi, Di], head weights [T, Hi])."""
    t, h, d = q.shape
    kv_pages, _, offset = pools.pages(slot)
    shifted = dataclasses.replace(meta, swa_page_table=meta.swa_page_table + offset)
    comp = pools.compressed
    rate = comp.rates[compressed] if compressed is not None else 0
    q_blocks = to_blocks(q, meta).reshape(*meta.block_tokens.shape, 1, h, d)
    idx_q = idx_w = None
    if index is not None:
        idx_q, idx_w = to_blocks(index[0], meta), to_blocks(index[1], meta)
    sink = sinks.astype(F32).reshape(1, h)

    def one_block(args):
        qb, req, first_q, tokens, iq, iw = args
        pages, k_pos = block_keys(shifted, layer, req, first_q)
        keys = kv_pages[pages].reshape(-1, 1, d)
        q_pos = first_q + jnp.arange(meta.block_q, dtype=jnp.int32)
        mask = visible(q_pos[:, None], k_pos[None, :], layer)
        mask &= (k_pos >= 0)[None, :] & (k_pos < meta.seq_lens[req])[None, :]
        mask &= (tokens < t)[:, None]
        if compressed is None:
            return softmax_attend(qb, keys, keys, mask, scale=scale, sinks=sink)
        store = comp.entries[compressed]
        slots, ends = entry_table(meta, pools, compressed, req)
        seen = (ends[None, :] <= q_pos[:, None]) & (tokens < t)[:, None]
        if iq is None:  # HCA: every entry whose window has ended
            entries = store[slots, None, :d].astype(F32)
            keys = jnp.concatenate([keys.astype(F32), entries], axis=0)
            mask = jnp.concatenate([mask, seen], axis=1)
            return softmax_attend(qb, keys, keys, mask, scale=scale, sinks=sink)
        # CSA: score every indexer key, then read only each query's top-k entries
        # Gathers of the columns needed only: an indexer key is 128 values of a 640-value row.
        top, kept = _top_entries(iq, iw, store[slots, d:].astype(F32), seen, topk)
        chosen = store[slots[top], :d].astype(F32)  # [Q, k, D]
        return _attend_own_keys(qb[:, 0], keys[:, 0].astype(F32), mask, chosen, kept, scale, sinks)

    keys = block_pages(meta, layer) * meta.page_size
    if compressed is not None:
        keys += meta.full_page_table.shape[1] * meta.page_size // rate
    batch = max(1, KEYS_PER_BATCH // keys)
    args = (q_blocks, meta.block_req, meta.block_pos, meta.block_tokens, idx_q, idx_w)
    out = jax.lax.map(one_block, args, batch_size=batch)  # None: no leaves to map over
    return from_blocks(out.reshape(*meta.block_tokens.shape, h, d), meta, q.dtype)


def _top_entries(iq, iw, keys, seen, topk: int):
    """(indices [Q, k], kept bool [Q, k]): the entries each query's indexer keeps, the top
    `topk` of the ones it sees (ties: the lower index), and which of those it does see."""
    dim = keys.shape[-1]
    dots = jnp.einsum("qhd,nd->qhn", iq.astype(F32), keys, precision=HIGHEST)
    scores = jnp.einsum(
        "qhn,qh->qn", jax.nn.relu(dots) * dim**-0.5, iw.astype(F32), precision=HIGHEST
    )
    scores = jnp.where(seen, scores, -jnp.inf)
    _, top = jax.lax.top_k(scores, min(topk, keys.shape[0]))
    return top, jnp.take_along_axis(seen, top, axis=1)


def _attend_own_keys(q, window, mask, chosen, kept, scale, sinks):
    """One softmax (with the sinks) over the window keys all queries share (K = V, [S, D],
    `mask` [Q, S]) and each query's own chosen entries ([Q, k, D], `kept` [Q, k]).
    q [Q, H, D] -> [Q, 1, H, D] float32, the layout `softmax_attend` returns."""
    q = q.astype(F32) * scale
    shared = jnp.einsum("qhd,sd->qhs", q, window, precision=HIGHEST)
    own = jnp.einsum("qhd,qkd->qhk", q, chosen, precision=HIGHEST)
    shared = jnp.where(mask[:, None, :], shared, -jnp.inf)
    own = jnp.where(kept[:, None, :], own, -jnp.inf)
    sink = sinks.astype(F32)[None, :]
    top = jnp.maximum(jnp.maximum(shared.max(-1), own.max(-1)), sink)  # [Q, H]
    p_shared, p_own = jnp.exp(shared - top[..., None]), jnp.exp(own - top[..., None])
    total = p_shared.sum(-1) + p_own.sum(-1) + jnp.exp(sink - top)
    out = jnp.einsum("qhs,sd->qhd", p_shared, window, precision=HIGHEST)
    out += jnp.einsum("qhk,qkd->qhd", p_own, chosen, precision=HIGHEST)
    return (out / total[..., None])[:, None]
