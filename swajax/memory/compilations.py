"""A process-wide count of XLA compilations (for metrics and for tests that bound recompiles).

A program loaded from the persistent compilation cache still reports a backend-compile event;
it also reports a cache hit, so fresh compilations are the difference.
"""

import jax

_compiles = 0
_hits = 0


def _on_duration(name: str, _duration: float, **_kwargs) -> None:
    global _compiles
    if name == "/jax/core/compile/backend_compile_duration":
        _compiles += 1


def _on_event(name: str, **_kwargs) -> None:
    global _hits
    if name == "/jax/compilation_cache/cache_hits":
        _hits += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def compilation_count() -> int:
    """Programs compiled (not loaded from the persistent cache) since this module was imported."""
    return _compiles - _hits


def cache_hits() -> int:
    """Programs loaded from the persistent compilation cache since this module was imported."""
    return _hits
