"""Lowering for a machine this one is not: the abstract device a program is exported for."""

from __future__ import annotations

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

# Newer JAX asks which GPU a kernel is lowered for even without one: an H100.
H100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=1, platform="cuda")


def tpu(device_kind: str) -> AbstractDevice:
    return AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")


def on_device(device: AbstractDevice):
    """Trace inside the block for `device`, its one axis unsharded (Auto), as the engine's
    one-device programs are."""
    mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=device)
    return jax.sharding.use_abstract_mesh(mesh)
