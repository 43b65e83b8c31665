"""Speculative decoding's device half: one verify round inside the step's program.

After `commit_step` has allocated k + 1 positions [p, p + k] for every decoding request (an
extend), the draft proposes k tokens one position at a time (k + 1 single-token forwards: the
last one writes the draft's KV of the k-th proposal, so the draft's KV stays in step with the
target's whatever is accepted), and the target scores all k + 1 rows in one extend.

Acceptance is speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a proposal d drawn
from the draft's distribution q is kept with probability min(1, p(d) / q(d)) under the
target's distribution p (both after temperature, top-k, top-p and min-p); at the first
rejection the token is drawn from max(p - q, 0), renormalized, and after k acceptances one more
is drawn from p. The tokens kept are then distributed exactly as the target's own samples. A
greedy request (temperature 0) is the limit: proposals are the draft's argmax and are kept while
they equal the target's. Every draw is keyed by (seed, position, role), so a round is
reproducible. Both models' KV of the rejected positions is simply not used again: the host
frees their pages.

The draft's KV lives at the same slots as the target's (its layers are part of the cell,
`sizing.token_bytes(draft=...)`), in its own pool buffers. A checkpoint's own MTP layer
(`models/mtp.py`) drafts from the target's hidden states instead: it proposes k tokens from the
one the previous step left, and after the verify rewrites its entries from the target's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from swajax.attention.metadata import MetadataShape, metadata_core, shape_of
from swajax.models.sampling import draw_keys, processed

# Salts of the draws at one position: the draft's proposal, the acceptance test, the residual
# draw after a rejection, the draw after k acceptances.
DRAFT, ACCEPT, RESIDUAL, FINAL = 1, 2, 3, 4


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _params(b, n: int):
    """The sampling fields of the first n requests (a round has one row per request)."""
    return b.temperature[:n], b.top_k[:n], b.top_p[:n], b.min_p[:n]


def _sample_rows(logits, params, keys):
    """(tokens, probabilities [N, V]) drawn from each row's processed distribution."""
    x = processed(logits.astype(jnp.float32), *params)
    return jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32), jax.nn.softmax(x, -1)


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
    batch,
    rows,
    *,
    k: int,
    draft_shapes: tuple[MetadataShape, ...],
):
    """One round (traced inside the runner's jit). `batch` is the extend's `ForwardBatch`: its
    flat tokens hold each request's pending token at row r (k + 1), its sampling fields one
    entry per request. Returns (pools, draft pools, (tokens i32[R, k+1], their logprobs under
    the target f32[R, k+1], accepted i32[R]))."""
    n_rows, prefix_lens = rows.shape[0], meta.prefix_lens
    params = _params(batch, n_rows)
    temp, seeds = params[0], batch.seeds[:n_rows]
    sampling = temp > 0
    real = (meta.seq_lens > prefix_lens).astype(jnp.int32)  # padding rows extend nothing
    first = jnp.take(batch.tokens, jnp.arange(n_rows) * (k + 1), mode="clip")  # pending tokens

    def choose(j, logits, n):
        """The j-th proposal of the first n requests and the distribution it was drawn from."""
        keys = draw_keys(seeds[:n], prefix_lens[:n] + 1 + j, DRAFT)
        drawn, q = _sample_rows(logits, [x[:n] for x in params], keys)
        return jnp.where(sampling[:n], drawn, _argmax(logits)), q

    mtp = getattr(draft, "needs_hidden", False)
    if mtp:
        args = (d_state, t_state, d_pools, first, real, prefix_lens, r2t, alloc, rows)
        proposals, q_probs, d_pools = draft.propose(*args, draft_shapes, choose, k)
    else:
        proposals, q_probs, d_pools = _draft_proposals(
            draft, d_state, d_pools, first, real, meta, r2t, alloc, rows, draft_shapes, choose
        )
    proposed = jnp.stack(proposals[:k], axis=1)  # [R, k]: d1 .. dk
    flat = jnp.concatenate([first[:, None], proposed], axis=1)  # t, d1 .. dk per request
    t = meta.num_tokens
    verify_tokens = jnp.zeros(max(t, flat.size), jnp.int32).at[: flat.size].set(flat.reshape(-1))
    verify_rows = jnp.arange(t, dtype=jnp.int32)
    if mtp:
        hidden, logits, pools = target.hidden_logits(
            t_state, pools, verify_tokens[:t], meta, verify_rows
        )
    else:
        logits, pools = target.logits(t_state, pools, verify_tokens[:t], meta, verify_rows)
    size, v = n_rows * (k + 1), logits.shape[-1]
    logits = jnp.zeros((max(t, size), v), jnp.float32).at[:t].set(logits.astype(jnp.float32))
    logits = logits[:size].reshape(n_rows, k + 1, v)
    greedy = _argmax(logits)  # [R, k + 1]
    tokens, accepted = _accept(
        logits, greedy, proposed, q_probs[:k], params, seeds, prefix_lens[:n_rows], k
    )
    tokens = jnp.where(sampling[:, None], tokens, greedy)
    agree = (proposed == greedy[:, :k]).astype(jnp.int32)
    accepted = jnp.where(sampling, accepted, jnp.sum(jnp.cumprod(agree, axis=1), axis=1))
    accepted = accepted.astype(jnp.int32)
    if mtp:  # the draft's entries of the verified positions, from the target's hidden states
        shape = shape_of(meta, draft_shapes[0].window)
        args = (d_state, t_state, d_pools, hidden, proposed, accepted, real, meta, r2t, alloc)
        d_pools = draft.settle(*args, rows, shape)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
    return pools, d_pools, (tokens, lp, accepted)


def _draft_proposals(draft, d_state, d_pools, first, real, meta, r2t, alloc, rows, shapes, choose):
    """A draft model's proposals: k + 1 single-token forwards from the pending token (the last
    writes the draft's KV of the k-th proposal, so its KV stays in step with the target's)."""
    n_rows, prefix_lens = rows.shape[0], meta.prefix_lens
    current, proposals, q_probs = first, [], []
    for j, shape in enumerate(shapes):
        pre = prefix_lens + j * real
        m = metadata_core(r2t, alloc, rows, pre, pre + real, shape)
        n = shape.num_tokens
        rows_j = jnp.arange(n, dtype=jnp.int32)
        logits, d_pools = draft.logits(d_state, d_pools, current[:n], m, rows_j)
        pick, q = choose(j, logits, n)
        nxt = jnp.zeros(n_rows, jnp.int32).at[:n].set(pick)
        proposals.append(nxt)
        q_probs.append(jnp.zeros((n_rows, q.shape[-1]), q.dtype).at[:n].set(q))
        current = nxt
    return proposals, q_probs, d_pools


def _accept(logits, greedy, proposed, q_probs, params, seeds, prefix, k: int):
    """Speculative sampling of every row as if it sampled: (tokens [R, k + 1], accepted [R]),
    where tokens[:a] are the kept proposals and tokens[a] the residual (or final) draw."""
    n_rows = logits.shape[0]
    rep = lambda x: jnp.repeat(x, k + 1, axis=0)  # noqa: E731 - per request -> per row
    flat = logits.reshape(n_rows * (k + 1), -1)
    p = jax.nn.softmax(processed(flat, *(rep(x) for x in params)), -1)
    p = p.reshape(n_rows, k + 1, -1)
    q = jnp.stack(q_probs, axis=1) if k else p[:, :0]  # [R, k, V]
    pos = prefix[:, None] + 1 + jnp.arange(k + 1)  # position of each row's token
    seed_rows = jnp.repeat(seeds[:, None], k + 1, axis=1)

    def keys(salt):
        return draw_keys(seed_rows.reshape(-1), pos.reshape(-1), salt)

    u = jax.vmap(jax.random.uniform)(keys(ACCEPT)).reshape(n_rows, k + 1)[:, :k]
    p_d = jnp.take_along_axis(p[:, :k], proposed[..., None], axis=-1)[..., 0]
    q_d = jnp.take_along_axis(q, proposed[..., None], axis=-1)[..., 0]
    keep = (u * q_d < p_d).astype(jnp.int32)  # u < p / q without dividing by q
    accepted = jnp.sum(jnp.cumprod(keep, axis=1), axis=1)
    residual = jnp.maximum(p[:, :k] - q, 0.0)
    empty = jnp.sum(residual, axis=-1, keepdims=True) <= 0  # p == q: draw from p itself
    residual = jnp.where(empty, p[:, :k], residual)
    # The k + 1 candidate draws: a residual at each proposal, from p after the last.
    dist = jnp.concatenate([residual, p[:, k:]], axis=1).reshape(n_rows * (k + 1), -1)
    salts = jnp.tile(jnp.where(jnp.arange(k + 1) < k, RESIDUAL, FINAL), n_rows)
    draws = jax.vmap(jax.random.categorical)(keys(salts), jnp.log(dist)).reshape(n_rows, k + 1)
    j = jnp.arange(k + 1)[None, :]
    padded = jnp.concatenate([proposed, jnp.zeros((n_rows, 1), jnp.int32)], axis=1)
    tokens = jnp.where(j < accepted[:, None], padded, draws.astype(jnp.int32))
    return tokens, accepted
