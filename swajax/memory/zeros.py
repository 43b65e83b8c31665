"""Zero-filled device buffers, several per program.

An eager `jnp.zeros` compiles a program per shape; building a set of buffers (the four KV pool
buffers, the request table) in one jitted call makes that one program, which the persistent
compilation cache keeps across runs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, static_argnums=0)
def _zeros(specs):
    return tuple(jnp.zeros(shape, dtype) for shape, dtype in specs)


def zeros(*specs: tuple[tuple[int, ...], str]) -> tuple[jax.Array, ...]:
    """One zero array per (shape, dtype name) spec."""
    return _zeros(tuple((tuple(shape), str(dtype)) for shape, dtype in specs))
