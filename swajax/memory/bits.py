"""Narrow floats moved as their bits on CPU.

XLA:CPU computes with floats narrower than 32 bits (bfloat16, float16, float8) by widening them
to float32, and it widens data movement too: a scatter into a bfloat16 buffer, or a dynamic
slice of a bfloat16 stack inside a loop, becomes a float32 copy of the whole buffer (converted
and converted back), which at published shapes is gigabytes. Moving the same bits as unsigned
integers of the same width copies only what moves. Elsewhere, and for other dtypes, values pass
through unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from swajax import platform


def narrow(dtype) -> bool:
    """Whether XLA:CPU would widen `dtype` (a float narrower than 32 bits) on this backend."""
    dtype = jnp.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4 and platform.is_cpu()


def held(dtype) -> jnp.dtype:
    """The dtype values of `dtype` are held in: unsigned integers of its width where `narrow`."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(f"uint{8 * dtype.itemsize}") if narrow(dtype) else dtype


def to_bits(x: jax.Array) -> jax.Array:
    """`x` as unsigned integers of its width where `narrow`, else `x`."""
    return jax.lax.bitcast_convert_type(x, held(x.dtype)) if narrow(x.dtype) else x


def from_bits(x: jax.Array, dtype) -> jax.Array:
    """The inverse of `to_bits` for values whose dtype was `dtype`."""
    return jax.lax.bitcast_convert_type(x, dtype) if x.dtype != jnp.dtype(dtype) else x
