"""Reading a step's outputs to the host, on one process or several.

Under JAX's multi-controller runtime a program's outputs span every process's devices, and no
process may read another's. The step's outputs are replicated (the runner's bookkeeping runs on
every device; the sampled tokens come after the model's last all-reduce), so each process reads
its own replica: the same bytes, with no collective and no extra transfer."""

from __future__ import annotations

import jax


def _local(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    if not x.sharding.is_fully_replicated:
        raise ValueError(
            f"a step output of shape {x.shape} is split over devices of other processes "
            f"({x.sharding}); the runner reads only replicated outputs"
        )
    return x.addressable_data(0)


def read(tree):
    """Host (numpy) copies of the arrays in `tree`, in one transfer."""
    return jax.device_get(jax.tree.map(_local, tree))
