"""Test setup: fake CPU devices must be requested before jax is first imported."""

import os
import subprocess
import sys


def _xla_flags() -> str:
    """Four fake CPU devices for the sharding tests, and flags that make XLA:CPU compile faster
    (the suite's time is mostly compiling many tiny programs): LLVM optimization level 0 cuts
    it by about a quarter, and XLA:CPU's older elemental emitters instead of its MLIR fusion
    emitters by 40% more on the engine's step programs (measured with jax 0.10.2). Neither
    changes semantics (speed is measured by benchmarks/, never by tests), but the emitter flag
    is gone from later jaxlibs, where an unknown flag aborts the process: it is added only if a
    child process accepts it. The xdist workers inherit the result from the controller."""
    base = "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
    fast = base + " --xla_cpu_use_fusion_emitters=false"
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"],
        env={**os.environ, "XLA_FLAGS": fast, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        timeout=300,
    )
    return fast if probe.returncode == 0 else base


if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = _xla_flags()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The TPU compiler (swajax.tpu) in both xdist workers: libtpu locks the machine per process.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["SWAJAX_COMPILE_CACHE"] = "off"  # tests that want the on-disk cache set their own

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
from helpers.jax_cache import atomic_cache_writes  # noqa: E402
from hypothesis import settings  # noqa: E402

from swajax import compile_cache  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

# One on-disk compilation cache for the run, removed at the end: the suite's time is mostly
# compiling, and tests build the same programs again and again (each module drops its
# in-memory programs, below). Shared by the xdist workers, which compile many of the same
# programs (a shared folder cut the run from 11:16 to 10:09 on 2 cores): JAX writes an entry in
# place, so a worker could read another's half-written entry (seen once: JAX falls back to
# compiling but warns, and warnings fail tests here); `atomic_cache_writes` (helpers/jax_cache.py)
# makes each write a rename of a finished file, and a test's child process may join the folder
# too. Where this JAX's cache is not the shape that patch knows, each worker keeps its own
# folder instead. Kept under a folder named after the pytest process that
# runs the session (an xdist worker's parent). `SWAJAX_TEST_COMPILE_CACHE=off` turns it off.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
TEST_CACHE = (
    Path(tempfile.gettempdir()) / f"swajax-tests-{os.getppid() if _WORKER else os.getpid()}"
)


if os.environ.get("SWAJAX_TEST_COMPILE_CACHE", "on") not in compile_cache.OFF:
    shared = atomic_cache_writes()
    compile_cache.enable(TEST_CACHE / ("shared" if shared else (_WORKER or "main")))


def pytest_sessionfinish(session):
    if not _WORKER:
        import shutil

        shutil.rmtree(TEST_CACHE, ignore_errors=True)


# JIT warm-up makes first examples slow; long runs are separate tests marked `slow`.
settings.register_profile("swajax", deadline=None, print_blob=True)
settings.load_profile("swajax")


import pytest  # noqa: E402


@pytest.fixture
def cli(capsys):
    """Run the `swajax` command in process: cli("plan", "--preset", ...) -> (code, out, err)."""
    from swajax.cli.main import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def tiny_engine():
    """A factory of engines on the tiny-hybrid preset (W = 7) with the null model, or with a
    given model: tiny_engine(full=512, ratio=0.5, ps=4, chunk=32, **EngineOptions fields)."""
    from swajax import sizing
    from swajax.api import engine_for
    from swajax.presets import load_preset
    from swajax.serving.null_model import NullModel
    from swajax.serving.options import EngineOptions

    def make(full=512, ratio=0.5, ps=4, chunk=32, model=None, cfg=None, **options):
        cfg = cfg or (model.spec.hybrid if model is not None else load_preset("tiny-hybrid"))
        sizes = sizing.solve_pool_sizes(cfg, full, ratio=ratio, page_size=ps)
        options.setdefault("max_running", 8)
        options.setdefault("max_context", 512)
        return engine_for(
            cfg, model or NullModel(), sizes, EngineOptions(chunk_size=chunk, **options)
        )

    return make


@pytest.fixture(autouse=True, scope="module")
def _fresh_jit_caches():
    """Drop compiled programs between test modules: hundreds of small executables kept alive in
    one process made XLA's CPU compiler abort late in the run (2-core, 24 GB machine)."""
    yield
    jax.clear_caches()
