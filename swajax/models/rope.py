"""Rotary position embeddings as Hugging Face computes them: default, linear, llama3 and YaRN
frequency schedules; rotate-half or interleaved pairs; partial rotary dims."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    theta: float
    dim: int  # rotated dims (head_dim * partial_rotary_factor)
    kind: str = "default"  # default | linear | llama3 | yarn | proportional
    factor: float = 1.0
    interleaved: bool = False  # Llama 4 rotates (x[2i], x[2i+1]); the others rotate halves
    original_max_position: int = 4096
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    # Gemma 4's proportional RoPE rotates the pairs (i, i + dim/2) for i < proportion * dim / 2
    # at frequencies theta^(-2i / dim) (exponents over the whole head) and leaves the rest.
    proportion: float = 1.0

    def inv_freq_and_scale(self) -> tuple[np.ndarray, float]:
        """Inverse frequencies (float64, dim / 2) and the factor that multiplies cos and sin."""
        base = 1.0 / self.theta ** (np.arange(0, self.dim, 2, dtype=np.float64) / self.dim)
        if self.kind == "linear":
            return base / self.factor, 1.0
        if self.kind == "llama3":
            return _llama3(base, self), 1.0
        if self.kind == "yarn":
            return _yarn(base, self)
        if self.kind == "proportional":
            angles = int(self.proportion * self.dim // 2)
            inv = np.concatenate([base[:angles], np.zeros(self.dim // 2 - angles)])
            return inv / self.factor, 1.0
        return base, 1.0


def _llama3(inv, s: RopeSpec) -> np.ndarray:
    wavelen = 2 * math.pi / inv
    low, high = (
        s.original_max_position / s.low_freq_factor,
        s.original_max_position / s.high_freq_factor,
    )
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    scaled = np.where(wavelen > low, inv / s.factor, inv)
    mid = (wavelen <= low) & (wavelen >= high)
    return np.where(mid, (1 - smooth) * inv / s.factor + smooth * inv, scaled)


def _yarn(inv, s: RopeSpec) -> tuple[np.ndarray, float]:
    def correction_dim(rotations):
        return (s.dim * math.log(s.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(s.theta)
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, s.dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(s.dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (inv / s.factor) * (1 - extrapolation) + inv * extrapolation
    scale = s.attention_factor or (0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0)
    return inv_freq, scale


def apply_rope(x, positions, spec: RopeSpec):
    """Rotate the first `spec.dim` dims of x [T, heads, head_dim] at `positions` [T]."""
    inv, scale = spec.inv_freq_and_scale()
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv, jnp.float32)[None, :]
    cos, sin = jnp.cos(angles) * scale, jnp.sin(angles) * scale  # [T, dim / 2]
    rot, rest = x[..., : spec.dim].astype(jnp.float32), x[..., spec.dim :]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if spec.interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(rot.shape)
    else:
        half = spec.dim // 2
        x1, x2 = rot[..., :half], rot[..., half:]
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([out.astype(x.dtype), rest], axis=-1)
