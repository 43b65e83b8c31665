"""Quantized weights as the device holds them, dequantized inside the jitted computation.

The formats are the checkpoints' own (see `swajax.models.quantization` for how they are read):

- `Mxfp4`: a stack of [in, out] matrices kept as the published blocks [..., out, in/32, 16]
  uint8 (two e2m1 codes per byte, low nibble first) and e8m0 scales [..., out, in/32] uint8.
- `BlockFp8`: [..., in, out] float8 e4m3 with one float32 scale per (bm, bn) block of the
  checkpoint's [out, in] tensor, held [..., in/bn, parts, out/bm]. `parts` is 2 where the
  columns are the (gate, up) pairs of `weights.interleave_halves`: gate and up were quantized
  as separate tensors, so each keeps its own grid and the expansion interleaves them the way
  the columns were.

Indexing the leading (expert) axis selects experts without dequantizing anything, so a routed
block dequantizes only the expert it runs. Every product is a float of at most 8 bits times a
power of two or a float32 scale, exact in float32: the result equals dequantizing at load.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


def precision(dtype) -> jax.lax.Precision:
    """The precision of a product of `dtype` operands accumulated in float32: HIGHEST (float32
    operands must not be rounded to bfloat16 passes), except 16-bit operands traced for TPU,
    whose products are exact in float32 whatever the precision, and which XLA:TPU (libtpu
    0.0.42) routes at HIGHEST through a Mosaic kernel that refuses them ("Bad lhs type":
    found compiling the demo model and Llama 4 Scout's experts with `swajax compile-check`)."""
    from swajax import platform

    if platform.target() == "tpu" and jnp.dtype(dtype).itemsize < 4:
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST


FP8 = jnp.float8_e4m3fn


def _fp4(codes):
    """e2m1 codes (uint8, 0..15) -> float32: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives."""
    e, m = (codes >> 1) & 3, (codes & 1).astype(F32)
    magnitude = jnp.where(e == 0, 0.5 * m, (2.0 + m) * (1 << e).astype(F32) / 4)
    return jnp.where(codes & 8, -magnitude, magnitude)


def _e8m0(scales):
    """e8m0 exponents (uint8) -> 2^(s - 127) in float32, built from the bits (s = 0 is the
    subnormal 2^-127; 255, NaN, is refused at load)."""
    bits = jax.lax.bitcast_convert_type(scales.astype(jnp.uint32) << 23, F32)
    return jnp.where(scales == 0, np.float32(2.0**-127), bits)


# (bits type, mantissa bits) of the formats whose values `_scaled_bits` writes directly.
_BITS = {jnp.dtype(F32): (jnp.uint32, 23), jnp.dtype(jnp.bfloat16): (jnp.uint16, 7)}


def _scaled_bits(codes, scales, dtype):
    """e2m1 codes times 2^(s - 127), as float32 or bfloat16, written as bits in unsigned
    integers of the result's width. The magnitude code k = 2e + m of a value (1 + m/2) 2^(e-1)
    (k >= 2) or 0.5 (k = 1) sits right below the exponent's bits: the scaled value's exponent
    and mantissa bit together are t = k + 2s - 2 (k - 1 + 2s - 2 for 0.5), one sum shifted into
    place. Integer operations only, in lanes as narrow as the result (bfloat16's 16 bits: 1.5x
    faster than in 32-bit lanes, and three times faster than multiplying floats and rounding
    them to bfloat16; benchmarks/README.md, "Products of bfloat16 weights"). Results below
    float32's normal range are zero and a zero scale gives zeros, as XLA:CPU's float product
    (which flushes subnormals) gives; past the range, infinity."""
    uint, mant = _BITS[jnp.dtype(dtype)]
    c = codes.astype(uint)
    k = c & 7
    t = k + scales.astype(uint) * 2 - (k == 1).astype(uint)  # the field t, plus 2 (unsigned)
    zero = (k == 0) | (t < 4) | (scales == 0)  # a zero, or an exponent of 0 or below
    field = jnp.minimum(t, 512) - 2  # exponent 255 and up: infinity
    bits = jnp.where(zero, 0, field << (mant - 1)) | ((c & 8) << (mant + 5))
    return jax.lax.bitcast_convert_type(bits.astype(uint), dtype)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["blocks", "scales"], meta_fields=["dtype"]
)
@dataclasses.dataclass(frozen=True)
class Mxfp4:
    blocks: jax.Array  # [..., out, in/32, 16] uint8
    scales: jax.Array  # [..., out, in/32] uint8
    dtype: Any  # what the matmul runs in

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, rows, groups, _ = self.blocks.shape
        return (*lead, groups * 32, rows)

    def __getitem__(self, i) -> Mxfp4:
        return Mxfp4(self.blocks[i], self.scales[i], self.dtype)

    def outputs(self, lead: tuple, start, size: int) -> Mxfp4:
        """Stacked weight `lead`'s outputs [start, start + size) (`lead` indexes the leading
        axes; it and `start` may be traced)."""
        groups, ones = self.blocks.shape[-2], (1,) * len(lead)
        blocks = jax.lax.dynamic_slice(self.blocks, (*lead, start, 0, 0), (*ones, size, groups, 16))
        scales = jax.lax.dynamic_slice(self.scales, (*lead, start, 0), (*ones, size, groups))
        return Mxfp4(
            blocks.reshape(blocks.shape[-3:]), scales.reshape(scales.shape[-2:]), self.dtype
        )

    def halves(self) -> tuple[jax.Array, jax.Array]:
        """The values of the even and of the odd input positions (low and high nibbles), each
        [..., out, in/2] in `dtype`: no interleaving, no transpose."""
        *lead, rows, groups, _ = self.blocks.shape
        scale = self.scales[..., None]

        def values(codes):
            if jnp.dtype(self.dtype) in _BITS:
                return _scaled_bits(codes, scale, self.dtype)
            return (_fp4(codes) * _e8m0(scale)).astype(self.dtype)

        return tuple(
            values(codes).reshape(*lead, rows, groups * 16)
            for codes in (self.blocks & 0x0F, self.blocks >> 4)
        )

    def dense(self) -> jax.Array:
        even, odd = self.halves()
        values = jnp.stack([even, odd], axis=-1).reshape(*even.shape[:-1], -1)
        return jnp.swapaxes(values, -1, -2)

    def matmul(self, x) -> jax.Array:
        """x [N, in] @ this [in, out] in float32, as two products over the even and the odd
        inputs against the nibbles' values: cheaper than interleaving and transposing."""
        even, odd = self.halves()
        dims = (((1,), (1,)), ((), ()))
        x = x.astype(self.dtype)

        def part(a, w):
            return jax.lax.dot_general(
                a, w, dims, precision=precision(w.dtype), preferred_element_type=F32
            )

        return part(x[:, 0::2], even) + part(x[:, 1::2], odd)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["weight", "scale"],
    meta_fields=["block", "dtype"],
)
@dataclasses.dataclass(frozen=True)
class BlockFp8:
    weight: jax.Array  # [..., in, out] float8 e4m3
    scale: jax.Array  # [..., in/bn, parts, out/(parts bm)] float32
    block: tuple[int, int]  # (bm, bn): rows of the checkpoint's [out, in] tensor, columns
    dtype: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    def __getitem__(self, i) -> BlockFp8:
        return BlockFp8(self.weight[i], self.scale[i], self.block, self.dtype)

    def dense(self) -> jax.Array:
        return (self.weight.astype(F32) * expand_scale(self.scale, self.shape, self.block)).astype(
            self.dtype
        )


def expand_scale(scale, shape, block) -> jax.Array:
    """[..., gin, parts, gout] block scales -> one per element of a [..., in, out] weight."""
    bm, bn = block
    *lead, din, dout = shape
    parts = scale.shape[-2]
    per_part = dout // parts
    s = jnp.repeat(scale, bm, axis=-1)[..., :per_part]  # [..., gin, parts, out / parts]
    s = jnp.swapaxes(s, -1, -2).reshape(*lead, scale.shape[-3], dout)  # parts interleaved
    return jnp.repeat(s, bn, axis=-2)[..., :din, :]


def grid(din: int, dout: int, block: tuple[int, int], parts: int = 1) -> tuple[int, int, int]:
    """The scale shape of a [din, dout] weight whose `parts` column groups were quantized as
    separate [dout / parts, din] tensors in (bm, bn) blocks."""
    bm, bn = block
    return (-(-din // bn), parts, -(-(dout // parts) // bm))


def matmul(x, w) -> jax.Array:
    """x [N, in] @ w [in, out] in float32, w plain or quantized (dequantized on the way)."""
    if isinstance(w, Mxfp4):
        return w.matmul(x)
    w = dense(w)
    return jnp.dot(x.astype(w.dtype), w, precision=precision(w.dtype), preferred_element_type=F32)


def dense(w) -> jax.Array:
    """A weight as a plain array (quantized ones dequantized; plain ones as they are)."""
    return w.dense() if isinstance(w, Mxfp4 | BlockFp8) else w


def is_quantized(w) -> bool:
    return isinstance(w, Mxfp4 | BlockFp8)
