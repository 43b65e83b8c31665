"""The platform programs are traced for: JAX's default backend, or the one named while
lowering ahead of time for another (`lowering_for`: a TPU or GPU program exported from a CPU
machine). Every choice the code makes by platform (the attention kernels, XLA:CPU's
workarounds) asks `target()`, so an exported program is the one that platform would run.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax

from swajax.switch import switched

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)
ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def target() -> str:
    """ "cpu", "gpu" or "tpu"."""
    name = _TARGET.get() or jax.default_backend()
    return ALIASES.get(name, name)


def is_cpu() -> bool:
    return target() == "cpu"


def lowering_for(platform: str) -> contextlib.AbstractContextManager[None]:
    """Trace for `platform` ("tpu", "cuda", "gpu", "cpu") inside the block."""
    return switched(_TARGET, platform)


def mosaic_gpu() -> bool:
    """The GPU traced for runs Mosaic GPU kernels: an NVIDIA GPU of compute capability 9.0
    (Hopper) or newer. Lowered ahead of time for CUDA: yes (the design's GPUs are H100 and
    H200); for ROCm, no (an AMD GPU reports its architecture, "gfx90a", instead)."""
    if target() != "gpu":
        return False
    named = _TARGET.get()
    if named is not None:
        return named in ("cuda", "gpu")
    capability = str(getattr(jax.devices()[0], "compute_capability", "0"))
    try:
        return float(capability) >= 9.0
    except ValueError:
        return False
