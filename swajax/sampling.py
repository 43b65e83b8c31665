"""Token sampling: greedy, or temperature + top-p with a key per (seed, position).

Keying each draw by the request's seed and the position makes generation reproducible across
batching and retraction: a recomputed request draws exactly the tokens it drew before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _sample(logits, temperature, top_p, seeds, positions):
    logits = logits.astype(jnp.float32)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    greedy = jnp.argmax(logits, axis=-1)

    def draw(row, t, p, seed, pos):
        scaled = row / jnp.maximum(t, 1e-6)
        order = jnp.argsort(-scaled)
        probs = jax.nn.softmax(scaled[order])
        keep = jnp.cumsum(probs) - probs < p  # the smallest prefix reaching top_p
        masked = jnp.where(keep, scaled[order], -jnp.inf)
        key = jax.random.fold_in(jax.random.key(seed), pos)
        return order[jax.random.categorical(key, masked)]

    sampled = jax.vmap(draw)(logits, temperature, top_p, seeds, positions)
    tokens = jnp.where(temperature > 0, sampled, greedy)
    return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def sample(logits, temperature, top_p, seeds, positions) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, logprobs) for logits [R, V]; per-row temperature, top_p, seed and position."""
    r = logits.shape[0]
    n = max(8, 1 << max(0, r - 1).bit_length())  # pad rows to a bucket: few compilations

    def col(values, dtype):
        out = np.zeros(n, dtype)
        out[:r] = values
        return out

    padded = np.zeros(
        (n, logits.shape[1]), np.float32
    )  # padded on the host: one program per bucket
    padded[:r] = np.asarray(logits, np.float32)
    tokens, logprobs = _sample(
        padded,
        col(temperature, np.float32),
        col(top_p, np.float32),
        col(seeds, np.uint32),
        col(positions, np.int32),
    )
    return np.asarray(tokens)[:r], np.asarray(logprobs)[:r]
