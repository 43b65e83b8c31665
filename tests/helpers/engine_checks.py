"""Checks on a whole engine after a run."""

from swajax.memory import allocator as A
from swajax.memory.host_allocator import HostAllocator
from swajax.serving.request import Status


def allocator_state(runner) -> A.AllocatorState:
    """The runner's allocator state: the device's, or the host allocator's in its form."""
    alloc = runner.alloc
    return alloc.as_state() if isinstance(alloc, HostAllocator) else alloc


def check_clean(engine):
    """Nothing in flight, every request ended, both pools entirely free (host and device) once
    the prefix cache is flushed: nothing leaked."""
    assert engine.idle
    for req in engine.requests.values():
        assert req.status in (Status.FINISHED, Status.ABORTED), (req.rid, req.status)
        assert req.finish_reason
    engine.cache.evict(10**9, 10**9)
    tier = getattr(engine.cache, "tier", None)
    if tier is not None:  # a host tier took what the device evicted: drain it too
        tier.clear()
        engine.cache.evict(10**9, 10**9)
        assert not engine.cache.root.children and tier.full.used == tier.swa.used == 0
    engine.flush()
    full = (engine.ledger.primary_pages * engine.sizes.page_size,) * 2
    if engine.sizes.mode.value == "hybrid":
        full = (full[0], engine.ledger.swa_pages * engine.sizes.page_size)
    assert engine.ledger.available() == full
    avail = A.available(allocator_state(engine.runner))
    assert (int(avail.full), int(avail.swa)) == full


def check_replays(tracer, path):
    """A recorded run (`swajax.trace.recorder.Tracer`, its engine idle): both pools free once
    drained, and the trace, written to `path`, replays with every result as recorded, through
    the plain-Python allocator model under swajax's tree (no JAX: nothing to compile)."""
    from helpers.conformance_adapters import PythonModelAdapter
    from swajax.trace.replay import replay

    tracer.finish()
    tracer.write(path)
    result = replay(path, PythonModelAdapter().allocator_and_cache)
    assert result["ok"], result
    return result
