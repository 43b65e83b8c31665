"""A process-wide count of XLA compilations (for metrics and for tests that bound recompiles).

A program loaded from the persistent compilation cache still reports a backend-compile event;
it also reports a cache hit, so fresh compilations are the difference.
"""

import jax

_compiles = 0
_hits = 0
# Seconds spent per phase of making programs: tracing to a jaxpr, lowering it, compiling.
PHASES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_seconds = dict.fromkeys(PHASES.values(), 0.0)


def _on_duration(name: str, duration: float, **_kwargs) -> None:
    global _compiles
    if name == "/jax/core/compile/backend_compile_duration":
        _compiles += 1
    if name in PHASES:
        _seconds[PHASES[name]] += duration


def _on_event(name: str, **_kwargs) -> None:
    global _hits
    if name == "/jax/compilation_cache/cache_hits":
        _hits += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def compilation_count() -> int:
    """Programs compiled (not loaded from the persistent cache) since this module was imported."""
    return _compiles - _hits


def phase_seconds() -> dict[str, float]:
    """Seconds spent tracing, lowering and compiling programs since this module was imported."""
    return dict(_seconds)


def cache_hits() -> int:
    """Programs loaded from the persistent compilation cache since this module was imported."""
    return _hits
