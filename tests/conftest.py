"""Test setup: fake CPU devices must be requested before jax is first imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

# Property tests: the default run keeps CI short; SWAJAX_SLOW=1 (with `pytest -m slow`) runs long.
settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("slow", deadline=None, print_blob=True, max_examples=10_000)
settings.load_profile("slow" if os.environ.get("SWAJAX_SLOW") else "default")
