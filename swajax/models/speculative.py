"""Speculative decoding's device half: one verify round inside the step's program.

After `commit_step` has allocated k + 1 positions [p, p + k] for every decoding request (an
extend), the draft proposes k tokens one position at a time (k + 1 single-token forwards: the
last one writes the draft's KV of the k-th proposal, so the draft's KV stays in step with the
target's whatever is accepted), the target verifies all k + 1 rows in one extend, and greedy
acceptance keeps the longest prefix of proposals that equals the target's own argmax. Both
models' KV of the rejected positions is simply not used again: the host frees their pages.

The draft's KV lives at the same slots as the target's (its layers are part of the cell,
`sizing.token_bytes(draft=...)`), in its own pool buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from swajax.attention.metadata import MetadataShape, metadata_core


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def verify_round(
    target,
    draft,
    t_state,
    d_state,
    pools,
    d_pools,
    r2t,
    alloc,
    meta,
    tokens,
    rows,
    *,
    k: int,
    draft_shapes: tuple[MetadataShape, ...],
):
    """One round (traced inside the runner's jit). `tokens` is the extend's flat token array,
    each request's pending token at row r (k + 1); returns (pools, draft pools, greedy i32[R, k+1],
    logprobs f32[R, k+1], accepted i32[R])."""
    n_rows, prefix_lens = rows.shape[0], meta.prefix_lens
    real = (meta.seq_lens > prefix_lens).astype(jnp.int32)  # padding rows extend nothing
    first = jnp.take(tokens, jnp.arange(n_rows) * (k + 1), mode="clip")  # pending tokens
    current, proposals = first, []
    for j, shape in enumerate(draft_shapes):  # k + 1 single-token draft forwards
        pre = prefix_lens + j * real
        m = metadata_core(r2t, alloc, rows, pre, pre + real, shape)
        step_tokens = current[: shape.num_tokens]
        rows_j = jnp.arange(shape.num_tokens, dtype=jnp.int32)
        logits, d_pools = draft.logits(d_state, d_pools, step_tokens, m, rows_j)
        nxt = jnp.zeros(n_rows, jnp.int32).at[: shape.num_tokens].set(_argmax(logits))
        proposals.append(nxt)
        current = nxt
    proposed = jnp.stack(proposals[:k], axis=1)  # [R, k]: d1 .. dk
    flat = jnp.concatenate([first[:, None], proposed], axis=1)  # t, d1 .. dk per request
    t = meta.num_tokens
    verify_tokens = jnp.zeros(max(t, flat.size), jnp.int32).at[: flat.size].set(flat.reshape(-1))
    logits, pools = target.logits(
        t_state, pools, verify_tokens[:t], meta, jnp.arange(t, dtype=jnp.int32)
    )
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    greedy = _argmax(logits)
    lp = jnp.take_along_axis(logprobs, greedy[:, None], axis=-1)[:, 0]
    size = n_rows * (k + 1)
    greedy = jnp.zeros(max(t, size), jnp.int32).at[:t].set(greedy)[:size].reshape(n_rows, k + 1)
    lp = jnp.zeros(max(t, size), jnp.float32).at[:t].set(lp)[:size].reshape(n_rows, k + 1)
    agree = (proposed == greedy[:, :k]).astype(jnp.int32)
    accepted = jnp.sum(jnp.cumprod(agree, axis=1), axis=1).astype(jnp.int32)
    return pools, d_pools, (greedy, lp, accepted)
