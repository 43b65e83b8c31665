"""Ragged batches: per-token (request, position) for requests extended from prefix to seq length."""

import jax
import jax.numpy as jnp
import numpy as np


def token_positions(prefix_lens: jax.Array, seq_lens: jax.Array, num_tokens: int):
    """Rows of a flattened extend batch, request after request, padded to `num_tokens`.

    Returns (req i32[T], pos i32[T], valid bool[T]): row t holds position pos[t] of request
    req[t]; rows past the real tokens have valid False (and meaningless req / pos).
    """
    extend = seq_lens - prefix_lens
    ends = jnp.cumsum(extend)
    starts = ends - extend
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    # Every (row, request end) pair compared at once: one fused kernel, where the default binary
    # search is a loop of several (30-40 fewer kernels in each step program; at most
    # num_tokens x batch comparisons).
    found = jnp.searchsorted(ends, t, side="right", method="compare_all")
    req = jnp.minimum(found, prefix_lens.shape[0] - 1)
    pos = prefix_lens[req] + t - starts[req]
    return req.astype(jnp.int32), pos, t < ends[-1]


def pad(values, size: int, fill: int = 0) -> np.ndarray:
    """Host int32 array of `size` entries: `values` followed by `fill`."""
    out = np.full(size, fill, np.int32)
    out[: len(values)] = values
    return out
