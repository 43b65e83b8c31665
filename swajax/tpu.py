"""Compiling for a TPU this machine does not have: the TPU compiler (XLA:TPU and Mosaic, in
`libtpu`) runs on any host, and JAX builds compile-only TPU devices from a topology name.

A slice is named as Cloud TPU names it: `v5e-4`, `v6e-8`, `v5p-8`. v5e and v6e count chips,
v5p counts TensorCores (two a chip: `v5p-8` is four chips). What a compile here proves: the
program, its kernels included, compiles on that TPU with this libtpu, and what XLA says it needs
(`memory_analysis`) and costs (`cost_analysis`: XLA's TPU cost model, never a measurement).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import re

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType


@dataclasses.dataclass(frozen=True, slots=True)
class Generation:
    name: str  # "v5e"
    device_kind: str  # what its devices report
    hbm_bytes: int  # per chip
    hbm_bytes_per_s: float  # per chip, as published
    cores_per_chip: int  # what a slice's name counts per chip
    topologies: tuple[tuple[int, str], ...]  # (chips, a topology libtpu 0.0.42 and later take)


GIB = 2**30
# Published per-chip HBM and bandwidth (cloud.google.com/tpu/docs/v5e, /v6e, /v5p).
GENERATIONS = {
    g.name: g
    for g in (
        Generation("v5e", "TPU v5 lite", 16 * GIB, 819e9, 1, ((4, "2x2"), (8, "2x4"), (16, "4x4"))),
        Generation(
            "v6e", "TPU v6 lite", 32 * GIB, 1640e9, 1, ((4, "2x2"), (8, "2x4"), (16, "4x4"))
        ),
        Generation(
            "v5p", "TPU v5", 95 * GIB, 2765e9, 2, ((4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"))
        ),
    )
}


@dataclasses.dataclass(frozen=True, slots=True)
class Slice:
    generation: Generation
    chips: int

    @property
    def name(self) -> str:
        return f"{self.generation.name}-{self.chips * self.generation.cores_per_chip}"


def parse_slice(name: str) -> Slice:
    """`v5e-4` -> 4 v5e chips; a clear error for anything else."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", name.strip().lower())
    known = ", ".join(sorted(GENERATIONS))
    if match is None or match.group(1) not in GENERATIONS:
        raise ValueError(
            f"unknown TPU slice {name!r}: a generation ({known}) and a size, e.g. v6e-4"
        )
    gen, size = GENERATIONS[match.group(1)], int(match.group(2))
    chips, odd = divmod(size, gen.cores_per_chip)
    sizes = sorted({1, *dict(gen.topologies)})
    if odd or chips not in sizes:
        counts = ", ".join(f"{gen.name}-{c * gen.cores_per_chip}" for c in sizes)
        raise ValueError(f"unknown TPU slice {name!r}: {gen.name} slices here are {counts}")
    return Slice(gen, chips)


def libtpu_missing() -> str | None:
    """Why this machine cannot compile for TPU (None: it can)."""
    if importlib.util.find_spec("libtpu") is None:
        return (
            f"the TPU compiler (libtpu) is not installed: pip install 'jax[tpu]=={jax.__version__}'"
        )
    return None


@functools.cache
def devices(slice_: Slice) -> tuple:
    """The slice's compile-only devices (a one-chip slice: one chip of the smallest host)."""
    missing = libtpu_missing()
    if missing:
        raise RuntimeError(missing)
    from jax.experimental import topologies

    # libtpu locks the machine per process; compiling needs no device, so several may load it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{slice_.generation.name}-4")
    gen = slice_.generation
    shapes = dict(gen.topologies)
    shape = shapes[max(slice_.chips, min(shapes))]
    topo = topologies.get_topology_desc(topology_name=f"{gen.name}:{shape}", platform="tpu")
    return tuple(topo.devices[: slice_.chips])


@contextlib.contextmanager
def tracing_for(device):
    """Trace inside the block for `device`'s kind (Pallas asks which TPU a kernel is for), its
    one axis unsharded, as the engine's one-device programs are; and for the TPU platform."""
    from swajax import platform

    abstract = AbstractDevice(device_kind=device.device_kind, num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=abstract)
    with platform.lowering_for("tpu"), jax.sharding.use_abstract_mesh(mesh):
        yield


def placed(tree, device):
    """Every array of `tree` as a shape on `device` (statics and None left alone)."""
    sharding = jax.sharding.make_single_device_sharding(device)

    def one(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return x

    return jax.tree.map(one, tree)


def compile_on_mesh(mesh, fn, *args, **statics):
    """`fn` compiled for a mesh of a slice's devices: arguments that say where they live (a
    model's split weights and pools) stay there, the rest (the runner's state and upload) are
    replicated, as the engine places them."""
    from swajax.compile_cache import compile_uncached

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def one(x):
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None:
            return x
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
        return x

    from swajax import platform

    with platform.lowering_for("tpu"), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return compile_uncached(fn.lower(*jax.tree.map(one, args), **statics))


def compile_on(device, fn, *args, **statics):
    """`fn` (jitted) compiled for `device` with `args` placed there: the executable."""
    from swajax.compile_cache import compile_uncached

    with tracing_for(device):
        return compile_uncached(fn.lower(*placed(args, device), **statics))
