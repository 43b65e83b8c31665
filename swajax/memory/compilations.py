"""A process-wide count of XLA compilations (for metrics and for tests that bound recompiles)."""

import jax

_count = 0


def _on_event(name: str, _duration: float, **_kwargs) -> None:
    global _count
    if name == "/jax/core/compile/backend_compile_duration":
        _count += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def compilation_count() -> int:
    """Backend compilations since swajax.memory.compilations was first imported."""
    return _count
