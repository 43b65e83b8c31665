"""/metrics in Prometheus' text format (`prometheus-client`): the engine's state read when the
endpoint is scraped (running / waiting requests, both pools' free tokens and what the prefix
cache holds of them, prefix hits, SWA KV freed, tail rebuilds, a host tier's stores and
traffic, steps and the last step's time). Read from the HTTP thread while the engine thread
runs: each figure is current, a set of them is not one instant."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class _EngineCollector:
    def __init__(self, engine, loop):
        self.engine, self.loop = engine, loop

    def collect(self):
        e, sched, cache = self.engine, self.engine.scheduler, self.engine.cache
        free_full, free_swa = e.ledger.available()

        def metric(family, name, doc, value):
            m = family(f"swajax_{name}", doc)
            m.add_metric([], float(value))
            return m

        def gauge(name, doc, value):
            return metric(GaugeMetricFamily, name, doc, value)

        def counter(name, doc, value):
            return metric(CounterMetricFamily, name, doc, value)

        yield gauge("requests_running", "requests holding KV", len(sched.running))
        yield gauge("requests_waiting", "requests queued", len(sched.waiting))
        yield gauge("full_pool_free_tokens", "full pool tokens free", free_full)
        yield gauge("swa_pool_free_tokens", "SWA pool tokens free", free_swa)
        yield gauge("full_pool_tokens", "full pool size", e.sizes.full_tokens)
        yield gauge("swa_pool_tokens", "SWA pool size", e.sizes.swa_tokens)
        yield gauge(
            "full_cached_evictable_tokens",
            "full KV the prefix cache holds unlocked",
            cache.full_evictable,
        )
        yield gauge(
            "swa_cached_evictable_tokens",
            "SWA KV the prefix cache holds unlocked",
            cache.swa_evictable,
        )
        yield gauge(
            "full_cached_locked_tokens",
            "full KV the prefix cache holds locked",
            cache.full_protected,
        )
        yield counter(
            "prefix_hit_tokens", "prompt tokens served by the prefix cache", sched.hit_tokens
        )
        yield counter("swa_freed_tokens", "out-of-window SWA KV given back", sched.swa_freed_tokens)
        yield counter(
            "tail_rebuilt_tokens", "tokens recomputed by SWA tail rebuilds", sched.rebuilt_tokens
        )
        tier = getattr(cache, "tier", None)
        if tier is not None:  # a host tier (--host-cache-gib)
            ps = e.sizes.page_size
            for part, store in (("full", tier.full), ("swa", tier.swa)):
                yield gauge(f"host_{part}_tokens", f"host tier {part} store size", store.total * ps)
                yield gauge(
                    f"host_{part}_used_tokens", f"host tier {part} KV held", store.used * ps
                )
            for i, part in enumerate(("full", "swa")):
                yield counter(
                    f"host_saved_{part}_tokens", f"{part} KV moved to the host", tier.saved[i]
                )
                yield counter(
                    f"host_loaded_{part}_tokens", f"{part} KV loaded back by hits", tier.loaded[i]
                )
        yield counter("retractions", "requests retracted for memory", sched.retractions)
        yield counter("steps", "engine steps run", self.loop.steps)
        yield gauge("step_seconds", "wall time of the last step", self.loop.step_seconds)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine, loop):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, loop))

    def render(self) -> str:
        return generate_latest(self.registry).decode()
