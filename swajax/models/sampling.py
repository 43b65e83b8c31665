"""Token sampling inside the model's jit: greedy, or temperature + top-p keyed by (seed, position).

Keying each draw by the request's seed and the position makes generation reproducible across
batching and retraction: a recomputed request draws exactly the tokens it drew before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample(logits, temperature, top_p, seeds, positions):
    """(tokens i32[S], logprobs f32[S]) for logits [S, V]; per-row temperature, top_p, seed
    (uint32) and position. Traceable: `forward_and_sample` calls it inside its jit."""
    logits = logits.astype(jnp.float32)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(row, t, p, seed, pos):
        scaled = row / jnp.maximum(t, 1e-6)
        order = jnp.argsort(-scaled)
        probs = jax.nn.softmax(scaled[order])
        keep = jnp.cumsum(probs) - probs < p  # the smallest prefix reaching top_p
        masked = jnp.where(keep, scaled[order], -jnp.inf)
        key = jax.random.fold_in(jax.random.key(seed), pos)
        return order[jax.random.categorical(key, masked)].astype(jnp.int32)

    def draw_all(_):
        sampled = jax.vmap(draw)(logits, temperature, top_p, seeds, positions)
        return jnp.where(temperature > 0, sampled, greedy)

    # A greedy batch skips the sort over the vocabulary that top-p needs.
    tokens = jax.lax.cond(jnp.any(temperature > 0), draw_all, lambda _: greedy, None)
    return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
