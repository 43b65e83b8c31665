"""Zero-filled device buffers, several per program.

An eager `jnp.zeros` compiles a program per shape; building a set of buffers (the four KV pool
buffers, the request table) in one jitted call makes that one program, which the persistent
compilation cache keeps across runs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.cache
def _program(specs, sharding):
    def make():
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in specs)

    return jax.jit(make, out_shardings=None if sharding is None else (sharding,) * len(specs))


def zeros(*specs: tuple[tuple[int, ...], str], sharding=None) -> tuple[jax.Array, ...]:
    """One zero array per (shape, dtype name) spec; `sharding` (a `jax.sharding.Sharding`):
    made in place over its devices, so a buffer split over a mesh never exists whole on one
    device (nor, across processes, on a device another process owns)."""
    return _program(tuple((tuple(shape), str(dtype)) for shape, dtype in specs), sharding)()
