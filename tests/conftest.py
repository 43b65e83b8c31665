"""Test setup: fake CPU devices must be requested before jax is first imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

# JIT warm-up makes first examples slow; long runs are separate tests marked `slow`.
settings.register_profile("swajax", deadline=None, print_blob=True)
settings.load_profile("swajax")


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fresh_jit_caches():
    """Drop compiled programs between test modules: hundreds of small executables kept alive in
    one process made XLA's CPU compiler abort late in the run (2-core, 24 GB machine)."""
    yield
    jax.clear_caches()
