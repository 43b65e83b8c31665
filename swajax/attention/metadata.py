"""Per-batch attention metadata: page tables, the one full->SWA translation, KV write locations.

Built once per batch on device from `req_to_token` and the allocator. Every SWA layer of the
batch reuses the same translated SWA page table, which holds only the pages that intersect
`[first query - W, last query]` of each request (W: the memory window of the model).

The batch is ragged: request i contributes queries for positions [prefix_lens[i], seq_lens[i]),
flattened request after request. Queries are also grouped into *blocks* of `block_q` queries of
one request; implementations iterate over blocks, so a sliding layer reads about
`W + block_q` keys per block whatever the sequence length.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from swajax.arith import bucket, ceil_div
from swajax.memory import allocator
from swajax.memory.padding import pad, token_positions
from swajax.memory.pool import KVWriteLoc
from swajax.memory.req_to_token import ReqToToken


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    positions: jax.Array  # i32[T]: absolute position of each flattened query token
    token_req: jax.Array  # i32[T]: its request (row of the batch)
    token_valid: jax.Array  # bool[T]: False for padding
    prefix_lens: jax.Array  # i32[R]: tokens cached before this batch
    seq_lens: jax.Array  # i32[R]: tokens after it (keys visible to the last query)
    cu_q_lens: jax.Array  # i32[R + 1]: start of each request's queries in the flat batch
    full_page_table: jax.Array  # i32[R, FP]: full page of logical page j (0 past the end)
    swa_page_table: jax.Array  # i32[R, SP]: SWA page of logical page swa_first_page + j
    swa_first_page: jax.Array  # i32[R]: logical page of column 0 of swa_page_table
    write: KVWriteLoc  # full and SWA slots of the new tokens (0 for padding)
    block_req: jax.Array  # i32[NB]: request of each query block
    block_pos: jax.Array  # i32[NB]: position of the block's first query
    block_tokens: jax.Array  # i32[NB, block_q]: flat token index of each query (T = padding)
    page_size: int = dataclasses.field(metadata=dict(static=True))

    @property
    def block_q(self) -> int:
        return self.block_tokens.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


def to_blocks(x, meta: AttentionMetadata):
    """Rows [T, ...] of the flat batch -> [NB, block_q, ...] query blocks (padding rows 0)."""
    padded = jnp.concatenate([x, jnp.zeros((1, *x.shape[1:]), x.dtype)])
    return padded[meta.block_tokens]


def from_blocks(blocks, meta: AttentionMetadata, dtype):
    """[NB, block_q, ...] query blocks -> rows [T, ...] of the flat batch."""
    t = meta.num_tokens
    flat = blocks.reshape(-1, *blocks.shape[2:]).astype(dtype)
    out = jnp.zeros((t + 1, *flat.shape[1:]), dtype).at[meta.block_tokens.reshape(-1)].set(flat)
    return out[:t]


def _row_slots(r2t, req_rows, positions):
    """Full slots at `positions` [R, n] of each request's row (0 past the table)."""
    inside = positions < r2t.max_context
    slots = r2t.table[req_rows[:, None], jnp.minimum(positions, r2t.max_context - 1)]
    return jnp.where(inside, slots, 0)


@dataclasses.dataclass(frozen=True)
class MetadataShape:
    """The static sizes of a batch's metadata (host ints, bucketed so programs are reused)."""

    window: int  # memory window W (0: none)
    block_q: int
    num_tokens: int
    full_pages: int
    swa_pages: int
    num_blocks: int


def shape_of(meta, window: int) -> MetadataShape:
    """The static shape of a built `AttentionMetadata` (`window`: the one it was built with)."""
    return MetadataShape(
        window=window,
        block_q=meta.block_q,
        num_tokens=meta.num_tokens,
        full_pages=meta.full_page_table.shape[1],
        swa_pages=meta.swa_page_table.shape[1],
        num_blocks=meta.block_req.shape[0],
    )


MIN_CONTEXT = 256


def full_pages_bucket(seq_max: int, page_size: int) -> int:
    """The full page table's width for a longest sequence of `seq_max` tokens: at least
    MIN_CONTEXT tokens' worth, so a short generation keeps one decode program throughout
    instead of recompiling each time its longest request crosses a power of two."""
    return bucket(ceil_div(seq_max, page_size), max(4, ceil_div(MIN_CONTEXT, page_size)))


def metadata_shape(
    prefix_lens, seq_lens, *, page_size: int, window: int, block_q=None, min_tokens: int = 1
):
    """Bucketed static sizes for a batch (host arrays of per-request lengths); at least
    `min_tokens` token rows and query blocks."""
    pre, seq = np.asarray(prefix_lens, np.int32), np.asarray(seq_lens, np.int32)
    if len(pre) == 0 or np.any(seq <= pre) or np.any(pre < 0):
        raise ValueError(
            f"every request needs 0 <= prefix < seq, got {pre.tolist()} / {seq.tolist()}"
        )
    ps, extend = page_size, seq - pre
    block_q = block_q or default_block_q(int(extend.max()))
    first = np.maximum(pre - window, 0) // ps
    return MetadataShape(
        window=window,
        block_q=block_q,
        num_tokens=bucket(int(extend.sum()), min_tokens),
        full_pages=full_pages_bucket(int(seq.max()), ps),
        # At least what a decode step's window spans, so every decode shares one width.
        swa_pages=bucket(
            int(((seq - 1) // ps - first + 1).max()), bucket((window + ps - 1) // ps + 1, 2)
        ),
        num_blocks=bucket(int(ceil_div(extend, block_q).sum()), min_tokens),
    )


def metadata_core(
    r2t, alloc, req_rows, prefix_lens, seq_lens, shape: MetadataShape, *, full_src=None
):
    """The metadata of a padded batch, traced inside a jitted caller (`commit_step`).
    `full_src` (i32[T], optional) goes into the write locations unchanged."""
    ps, window, block_q = alloc.page_size, shape.window, shape.block_q
    req, pos, valid = token_positions(prefix_lens, seq_lens, shape.num_tokens)
    full_loc = jnp.where(valid, r2t.table[req_rows[req], pos], 0)
    swa_loc = jnp.where(valid, allocator.translate(alloc, full_loc), 0)

    full_pos = jnp.arange(shape.full_pages, dtype=jnp.int32)[None, :] * ps
    full_pt = jnp.where(full_pos < seq_lens[:, None], _row_slots(r2t, req_rows, full_pos) // ps, 0)

    # The one translation of the batch: only pages that intersect the window of some query.
    first = jnp.maximum(prefix_lens - window, 0) // ps
    swa_pos = (first[:, None] + jnp.arange(shape.swa_pages, dtype=jnp.int32)[None, :]) * ps
    swa_slots = allocator.translate(alloc, _row_slots(r2t, req_rows, swa_pos))
    swa_pt = jnp.where(swa_pos < seq_lens[:, None], swa_slots // ps, 0)

    extend = seq_lens - prefix_lens
    cu = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(extend, dtype=jnp.int32)])
    blocks = ceil_div(extend, block_q)
    b_req, b_idx, b_valid = token_positions(jnp.zeros_like(blocks), blocks, shape.num_blocks)
    tokens = cu[b_req][:, None] + b_idx[:, None] * block_q + jnp.arange(block_q, dtype=jnp.int32)
    real = b_valid[:, None] & (tokens < cu[b_req + 1][:, None])
    return AttentionMetadata(
        positions=jnp.where(valid, pos, 0),
        token_req=req,
        token_valid=valid,
        prefix_lens=prefix_lens,
        seq_lens=seq_lens,
        cu_q_lens=cu,
        full_page_table=full_pt,
        swa_page_table=swa_pt,
        swa_first_page=first,
        write=KVWriteLoc(full=full_loc, swa=swa_loc, full_src=full_src),
        block_req=b_req,
        block_pos=jnp.where(b_valid, prefix_lens[b_req] + b_idx * block_q, 0),
        block_tokens=jnp.where(real, tokens, shape.num_tokens),
        page_size=ps,
    )


_build = jax.jit(metadata_core, static_argnames="shape")


def default_block_q(max_extend: int) -> int:
    """Decode batches use one-query blocks; prefill blocks hold 16 or 64 queries."""
    return 1 if max_extend <= 1 else 16 if max_extend <= 16 else 64


def build_metadata(
    r2t: ReqToToken,
    alloc: allocator.AllocatorState,
    req_rows,
    prefix_lens,
    seq_lens,
    *,
    window: int,
    block_q: int | None = None,
) -> AttentionMetadata:
    """Metadata for a batch whose new tokens' slots are already in `r2t` (one jitted call).

    The engine builds it inside `commit_step` instead; this entry point serves tests, the
    oracle and other backends.

    Args:
      req_rows: row of `r2t` of each request.
      prefix_lens, seq_lens: per request, the tokens before and after this batch.
      window: the memory window W of the model (`HybridConfig.sliding_window`; 0 if none).
      block_q: queries per block (default from the longest extend).
    """
    shape = metadata_shape(
        prefix_lens, seq_lens, page_size=alloc.page_size, window=window, block_q=block_q
    )
    r = bucket(len(req_rows), 8)
    return _build(r2t, alloc, pad(req_rows, r), pad(prefix_lens, r), pad(seq_lens, r), shape)
