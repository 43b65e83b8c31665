"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): the residual is `n` streams.

A block reads one input made from the streams (weights `pre`), and its output goes back to every
stream (weights `post`) on top of the streams mixed by `comb`, a matrix pushed towards doubly
stochastic by Sinkhorn-Knopp iterations so that mixing does not grow the residual. The three
weights come from a linear map of the normed, flattened streams. All of it in float32, as the
reference does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from swajax.models import quantized
from swajax.models.layers import F32, HIGHEST, param, unit_rms


class HyperConnection(nnx.Module):
    def __init__(self, n: int, hidden: int, iters: int, eps: float, norm_eps: float):
        self.n, self.iters, self.eps, self.norm_eps = n, iters, eps, norm_eps
        width = (2 + n) * n  # pre (n), post (n), comb (n * n)
        self.fn, self.base, self.scale = param((width, n * hidden)), param((width,)), param((3,))

    def load(self, w, prefix: str, name: str) -> None:
        for part in ("fn", "base", "scale"):
            w.fill(getattr(self, part), f"{prefix}.hc_{name}_{part}")

    def __call__(self, streams):
        """(post [T, n], comb [T, n, n], the block's input [T, D]) from streams [T, n, D]."""
        n = self.n
        flat = unit_rms(streams.reshape(streams.shape[0], -1).astype(F32), self.norm_eps)
        mix = jnp.dot(flat, self.fn[...].T, precision=HIGHEST)
        base, scale = self.base[...], self.scale[...]
        pre = jax.nn.sigmoid(mix[:, :n] * scale[0] + base[:n]) + self.eps
        post = 2 * jax.nn.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
        logits = mix[:, 2 * n :].reshape(-1, n, n) * scale[2] + base[2 * n :].reshape(n, n)
        comb = jax.nn.softmax(logits, axis=-1) + self.eps
        comb = comb / (comb.sum(axis=-2, keepdims=True) + self.eps)
        comb = jax.lax.fori_loop(0, self.iters - 1, self._sinkhorn, comb)
        collapsed = jnp.sum(pre[:, :, None] * streams.astype(F32), axis=1)
        return post, comb, collapsed.astype(streams.dtype)

    def _sinkhorn(self, _, comb):
        """One Sinkhorn-Knopp iteration (rows, then columns). A loop on device, not in Python:
        unrolled, V4's 20 iterations per connection, two connections per layer, were more than
        half of its step program after XLA's passes, growing with depth (BUILD_NOTES.md)."""
        comb = comb / (comb.sum(axis=-1, keepdims=True) + self.eps)
        return comb / (comb.sum(axis=-2, keepdims=True) + self.eps)


def expand(streams, post, comb, out):
    """The streams after a block: post * out on every stream, plus comb^T mixing the old ones
    (stream k gets sum_j comb[j, k] * stream j)."""
    dt = streams.dtype
    mixed = jnp.einsum("tjk,tjd->tkd", comb.astype(dt), streams, precision=quantized.precision(dt))
    return post.astype(dt)[:, :, None] * out[:, None, :] + mixed


class HyperHead(nnx.Module):
    """The last collapse of the streams into one, before the final norm."""

    def __init__(self, n: int, hidden: int, eps: float, norm_eps: float):
        self.eps, self.norm_eps = eps, norm_eps
        self.fn, self.base, self.scale = param((n, n * hidden)), param((n,)), param((1,))

    def load(self, w, names: dict[str, str]) -> None:
        for part in ("fn", "base", "scale"):
            w.fill(getattr(self, part), names[part])

    def __call__(self, streams):
        flat = unit_rms(streams.reshape(streams.shape[0], -1).astype(F32), self.norm_eps)
        mix = jnp.dot(flat, self.fn[...].T, precision=HIGHEST)
        pre = jax.nn.sigmoid(mix * self.scale[...] + self.base[...]) + self.eps
        return jnp.sum(pre[:, :, None] * streams.astype(F32), axis=1).astype(streams.dtype)
