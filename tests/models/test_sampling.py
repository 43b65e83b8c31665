"""Sampling inside the jit: greedy rows are the argmax whether or not another row samples, and a
sampled row draws the same token alone or in a batch (the key is its seed and position)."""

import jax
import jax.numpy as jnp
import numpy as np

from swajax.models.sampling import sample

sample_jit = jax.jit(sample)


def test_greedy_and_sampled_rows_mix():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 50)), jnp.float32)
    t = jnp.asarray([0.0, 1.5, 0.0], jnp.float32)
    p = jnp.asarray([1.0, 0.9, 1.0], jnp.float32)
    seeds, pos = jnp.asarray([1, 7, 3], jnp.uint32), jnp.asarray([4, 9, 2], jnp.int32)
    tokens, logprobs = sample_jit(logits, t, p, seeds, pos)
    greedy = np.argmax(np.asarray(logits), axis=-1)
    assert tokens[0] == greedy[0] and tokens[2] == greedy[2]
    alone, _ = sample_jit(logits[1:2], t[1:2], p[1:2], seeds[1:2], pos[1:2])
    assert tokens[1] == alone[0]
    all_greedy, _ = sample_jit(logits, jnp.zeros(3), p, seeds, pos)
    np.testing.assert_array_equal(np.asarray(all_greedy), greedy)
    expected = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(3), tokens]
    np.testing.assert_allclose(np.asarray(logprobs), np.asarray(expected), rtol=1e-6)


def test_draws_depend_on_seed_and_position_only():
    logits = jnp.zeros((1, 1000), jnp.float32)  # uniform: the draw is the key's alone
    one = jnp.ones(1, jnp.float32)
    draws = {
        int(sample_jit(logits, one, one, jnp.asarray([s], jnp.uint32), jnp.asarray([q]))[0][0])
        for s in range(4)
        for q in range(4)
    }
    assert len(draws) > 8  # different keys, different tokens
    a = sample_jit(logits, one, one, jnp.asarray([5], jnp.uint32), jnp.asarray([3]))[0]
    b = sample_jit(logits, one, one, jnp.asarray([5], jnp.uint32), jnp.asarray([3]))[0]
    assert int(a[0]) == int(b[0])
