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
from swajax.models.sampling import (
    SampleMode,
    adjusted,
    counted,
    draw_keys,
    processed,
    top_with_rank,
)

# Salts of the draws at one position: the draft's proposal, the acceptance test, the residual
# draw after a rejection, the draw after k acceptances.
DRAFT, ACCEPT, RESIDUAL, FINAL = 1, 2, 3, 4


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _first(b, n: int):
    """The batch `b` with its per-request fields cut to the first n requests."""
    return b._replace(**{name: getattr(b, name)[:n] for name in b._fields[3:]})


def _params(b):
    """The filters' fields (temperature, top-k, top-p, min-p), one entry per request."""
    return b.temperature, b.top_k, b.top_p, b.min_p


def verify_round(
    target,
    draft,
    t_state,
    d_state,
    pools,
    d_pools,
    pen,
    r2t,
    alloc,
    meta,
    batch,
    rows,
    *,
    k: int,
    draft_shapes: tuple[MetadataShape, ...],
    mode: SampleMode,
    return_logits: bool = False,
):
    """One round (traced inside the runner's jit). `batch` is the extend's `ForwardBatch`: its
    flat tokens hold each request's pending token at row r (k + 1), its sampling fields one
    entry per request. Every row samples as a plain decode step at its position would: the
    request's token rules and penalties apply, the penalties counting the proposals accepted
    before the row (`mode`; `pen` the device counts, which the round's emitted tokens join).
    Returns (pools, draft pools, penalties, (tokens i32[R, k+1], their logprobs under the raw
    target f32[R, k+1], accepted i32[R], logits [R, k+1, V] if `return_logits`, top-N ids and
    logprobs [R, k+1, N] if `mode.top_logprobs`))."""
    n_rows, prefix_lens = rows.shape[0], meta.prefix_lens
    b = _first(batch, n_rows)
    sampling = b.temperature > 0
    real = (meta.seq_lens > prefix_lens).astype(jnp.int32)  # padding rows extend nothing
    first = jnp.take(batch.tokens, jnp.arange(n_rows) * (k + 1), mode="clip")  # pending tokens
    picks = []  # the proposals so far (the draft asks for them in order)

    def choose(j, logits, n):
        """The j-th proposal of the first n requests and the distribution it was drawn from:
        the draft's logits under the request's rules and penalties, as the target's row j."""
        bn = _first(b, n)
        extra = jnp.stack(picks, axis=1)[:n] if j else None
        x = adjusted(logits, bn, pen, mode, j, extra)
        pick, q = _argmax(x), None
        if mode.draw:
            keys = draw_keys(bn.seeds, prefix_lens[:n] + 1 + j, DRAFT)
            x = processed(x, *_params(bn))
            drawn = jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
            pick, q = jnp.where(sampling[:n], drawn, pick), jax.nn.softmax(x, -1)
        picks.append(jnp.zeros(n_rows, jnp.int32).at[:n].set(pick))
        return pick, q

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
        hidden, raw, pools = target.hidden_logits(
            t_state, pools, verify_tokens[:t], meta, verify_rows
        )
    else:
        raw, pools = target.logits(t_state, pools, verify_tokens[:t], meta, verify_rows)
    size, v = n_rows * (k + 1), raw.shape[-1]
    logits = jnp.zeros((max(t, size), v), jnp.float32).at[:t].set(raw.astype(jnp.float32))
    logits = logits[:size].reshape(n_rows, k + 1, v)
    # Row j draws the token at position p + 1 + j, after the proposals d1 .. dj.
    rows_adj = [adjusted(logits[:, j], b, pen, mode, j, proposed[:, :j]) for j in range(k + 1)]
    adj = jnp.stack(rows_adj, axis=1)
    greedy = _argmax(adj)  # [R, k + 1]
    agree = (proposed == greedy[:, :k]).astype(jnp.int32)
    accepted = jnp.sum(jnp.cumprod(agree, axis=1), axis=1).astype(jnp.int32)
    tokens = greedy
    if mode.draw:
        drawn, drawn_accepted = _accept(adj, proposed, q_probs[:k], b, prefix_lens[:n_rows], k)
        tokens = jnp.where(sampling[:, None], drawn, greedy)
        accepted = jnp.where(sampling, drawn_accepted, accepted).astype(jnp.int32)
    if mtp:  # the draft's entries of the verified positions, from the target's hidden states
        shape = shape_of(meta, draft_shapes[0].window)
        args = (d_state, t_state, d_pools, hidden, proposed, accepted, real, meta, r2t, alloc)
        d_pools = draft.settle(*args, rows, shape)
    if mode.penalize:  # the emitted tokens join the counts (the host may keep fewer: a stop)
        emitted = jnp.arange(k + 1)[None, :] <= accepted[:, None]
        pen = counted(pen, b.sample_rows, tokens, emitted)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
    kept = logits.astype(raw.dtype) if return_logits else None
    top_ids = top_lp = None
    if mode.top_logprobs:
        top_lp, top_ids = top_with_rank(logprobs, lp, mode.top_logprobs)
    return pools, d_pools, pen, (tokens, lp, accepted, kept, top_ids, top_lp)


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
        if q is not None:
            q_probs.append(jnp.zeros((n_rows, q.shape[-1]), q.dtype).at[:n].set(q))
        current = nxt
    return proposals, q_probs, d_pools


def _accept(adj, proposed, q_probs, b, prefix, k: int):
    """Speculative sampling of every row as if it sampled: (tokens [R, k + 1], accepted [R]),
    where tokens[:a] are the kept proposals and tokens[a] the residual (or final) draw. `adj`:
    the target's logits under each row's rules and penalties; `b`: the requests' fields."""
    n_rows = adj.shape[0]
    rep = lambda x: jnp.repeat(x, k + 1, axis=0)  # noqa: E731 - per request -> per row
    flat = adj.reshape(n_rows * (k + 1), -1)
    p = jax.nn.softmax(processed(flat, *(rep(x) for x in _params(b))), -1)
    p = p.reshape(n_rows, k + 1, -1)
    q = jnp.stack(q_probs, axis=1) if k else p[:, :0]  # [R, k, V]
    pos = prefix[:, None] + 1 + jnp.arange(k + 1)  # position of each row's token
    seed_rows = jnp.repeat(b.seeds[:, None], k + 1, axis=1)

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
