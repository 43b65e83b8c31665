"""The test run's shared JAX compilation cache: safe writes for processes sharing one folder,
and how a test's child process joins it (conftest.py sets it up for the run)."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_cache_writes() -> bool:
    """Make JAX's on-disk cache write each entry to a temporary file and rename it into place
    (test processes only; JAX's own locking comes with an eviction scan of the whole folder on
    every write, which costs more than it saves here). False, and nothing changed, if JAX's
    cache class is not the one this knows (`jax._src.lru_cache.LRUCache.put(key, value)`)."""
    import inspect

    from jax._src import lru_cache

    cls, suffix = getattr(lru_cache, "LRUCache", None), getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cls is None or not isinstance(suffix, str):
        return False
    if list(inspect.signature(cls.put).parameters) != ["self", "key", "value"]:
        return False
    original = cls.put

    def put(self, key, value):
        if getattr(self, "eviction_enabled", True):
            return original(self, key, value)  # (a size-bounded cache locks on its own)
        path = Path(os.fspath(self.path)) / f"{key}{suffix}"  # (JAX's may be an etils path)
        if path.exists():
            return None
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_bytes(value)
        os.replace(partial, path)
        return None

    cls.put = put
    return True


def join(folder: str | None) -> None:
    """In a test's child process: use the run's cache folder (`None`: none), writing safely
    beside the run's own processes. The same folder gives the same keys, so the child reads
    what the run compiled."""
    from swajax import compile_cache

    if folder and atomic_cache_writes():
        compile_cache.enable(folder)


def current() -> str | None:
    """The run's cache folder, for a child process (None when the run has none)."""
    import jax

    return jax.config.jax_compilation_cache_dir or None
