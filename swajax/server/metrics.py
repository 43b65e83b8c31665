"""/metrics in Prometheus' text format (`prometheus-client`), in vLLM's metric set and meanings
under the `swajax:` prefix, so dashboards built for vLLM read them with the prefix changed,
plus the hybrid memory's own figures.

Two kinds: state read from the engine when the endpoint is scraped (requests running and
waiting, KV usage per pool, the prefix cache's holdings, counters the scheduler keeps), and
per-request timings the engine loop reports as they happen (time to first token, time between
tokens, end to end, prompt and generated tokens, finished requests by reason). Read from the
HTTP thread while the engine thread runs: each figure is current, a set of them is not one
instant. Every metric carries the served model's name as `model_name`, as vLLM's do.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "swajax:"
# vLLM's buckets for these histograms (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

# Every metric's name and type, for the dashboard test and readers of the docs.
STATE = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge",
    "swa_kv_cache_usage_perc": "gauge",
    "full_pool_free_tokens": "gauge",
    "swa_pool_free_tokens": "gauge",
    "full_pool_tokens": "gauge",
    "swa_pool_tokens": "gauge",
    "full_cached_evictable_tokens": "gauge",
    "swa_cached_evictable_tokens": "gauge",
    "full_cached_locked_tokens": "gauge",
    "prefix_cache_tombstones": "gauge",
    "prefix_cache_hits": "counter",
    "prefix_cache_missed_tokens": "counter",  # labelled by reason (prefix_cache/explain.py)
    "num_preemptions": "counter",
    "swa_freed_tokens": "counter",
    "tail_rebuilt_tokens": "counter",
    "engine_steps": "counter",
    "engine_step_seconds": "gauge",
    # Programs compiled in this process, and loaded from the program store instead, labelled
    # by program (fused_step, fused_round, ...): after the warm-up, a compile in the serving
    # loop shows here.
    "compilations": "counter",
    "programs_loaded": "counter",
    # Speculative decoding, vLLM's four (a draft is one request's proposals in one round),
    # and the tokens a request gains per round as a histogram (swajax's).
    "spec_decode_num_drafts": "counter",
    "spec_decode_num_draft_tokens": "counter",
    "spec_decode_num_accepted_tokens": "counter",
    "spec_decode_num_accepted_tokens_per_pos": "counter",  # labelled by position
    "spec_decode_acceptance_length": "histogram",
    "cache_config_info": "gauge",  # labelled by the KV cache's settings
}
EVENTS = {
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "prefix_cache_queries": "counter",
    "request_success": "counter",
    "time_to_first_token_seconds": "histogram",
    "inter_token_latency_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
    "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram",
    "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram",
}


class _EngineCollector:
    def __init__(self, engine, loop, model: str, prefix: str):
        self.engine, self.loop, self.model, self.prefix = engine, loop, model, prefix

    def collect(self):
        e, sched, cache = self.engine, self.engine.scheduler, self.engine.cache
        free_full, free_swa = e.ledger.available()
        full, swa = e.sizes.full_tokens, e.sizes.swa_tokens

        def metric(family, name, doc, value):
            m = family(self.prefix + name, doc, labels=["model_name"])
            m.add_metric([self.model], float(value))
            return m

        def gauge(name, doc, value):
            return metric(GaugeMetricFamily, name, doc, value)

        def counter(name, doc, value):
            return metric(CounterMetricFamily, name, doc, value)

        yield gauge("num_requests_running", "requests holding KV", len(sched.running))
        yield gauge("num_requests_waiting", "requests queued", len(sched.waiting))
        used = 1 - free_full / full if full else 0.0
        yield gauge("kv_cache_usage_perc", "full pool: share of tokens in use (0-1)", used)
        used = 1 - free_swa / swa if swa else 0.0
        yield gauge("swa_kv_cache_usage_perc", "SWA pool: share of tokens in use (0-1)", used)
        yield gauge("full_pool_free_tokens", "full pool tokens free", free_full)
        yield gauge("swa_pool_free_tokens", "SWA pool tokens free", free_swa)
        yield gauge("full_pool_tokens", "full pool size", full)
        yield gauge("swa_pool_tokens", "SWA pool size", swa)
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
        yield gauge(
            "prefix_cache_tombstones",
            "tree nodes whose SWA KV is gone (full KV kept)",
            getattr(cache, "tombstones", 0),
        )
        yield counter(
            "prefix_cache_hits", "prompt tokens the prefix cache supplied", sched.hit_tokens
        )
        missed = CounterMetricFamily(
            self.prefix + "prefix_cache_missed_tokens",
            "prompt tokens the prefix cache did not supply, by where the match stopped and why",
            labels=["model_name", "reason"],
        )
        for reason, tokens in sched.missed_tokens.items():
            missed.add_metric([self.model, reason], float(tokens))
        yield missed
        yield counter("num_preemptions", "requests retracted for memory", sched.retractions)
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
        yield counter("engine_steps", "engine steps run", self.loop.steps)
        yield gauge("engine_step_seconds", "wall time of the last step", self.loop.step_seconds)
        yield from self._speculative(sched, counter)
        yield from self._programs()

    def _programs(self):
        runner = self.engine.runner
        store = getattr(runner, "programs", None)  # none on the host runner
        if store is not None:
            yield CounterMetricFamily(
                self.prefix + "xla_compilations",
                "XLA programs compiled in this process since the engine started (its step "
                "programs and the small ones beside them; loads from a cache excluded)",
                value=float(runner.compilations()),
            )
        for name, doc, counts in (
            ("compilations", "step programs compiled in this process", "compiled"),
            ("programs_loaded", "step programs loaded from the program store", "reused"),
        ):
            family = CounterMetricFamily(self.prefix + name, doc, labels=["model_name", "program"])
            for program, n in sorted(getattr(store, counts, {}).items()):
                family.add_metric([self.model, program], float(n))
            yield family

    def _speculative(self, sched, counter):
        """From the scheduler's request-rounds by proposals accepted (all zero without a
        draft: the series exist either way)."""
        k = self.engine.options.num_speculative_tokens
        rounds = dict(sched.acceptance)
        yield counter("spec_decode_num_drafts", "request-rounds verified", sum(rounds.values()))
        yield counter("spec_decode_num_draft_tokens", "draft tokens proposed", sched.draft_tokens)
        accepted = sum(a * n for a, n in rounds.items())
        yield counter("spec_decode_num_accepted_tokens", "draft tokens accepted", accepted)
        per_pos = CounterMetricFamily(
            self.prefix + "spec_decode_num_accepted_tokens_per_pos",
            "draft tokens accepted, by their position in the round",
            labels=["model_name", "position"],
        )
        for pos in range(k):
            taken = sum(n for a, n in rounds.items() if a > pos)
            per_pos.add_metric([self.model, str(pos)], float(taken))
        yield per_pos
        lengths = HistogramMetricFamily(
            self.prefix + "spec_decode_acceptance_length",
            "tokens a request gains per round (accepted proposals and the target's own)",
            labels=["model_name"],
        )
        buckets, total = [], 0
        for length in range(1, k + 2):
            total += rounds.get(length - 1, 0)
            buckets.append((str(float(length)), float(total)))
        buckets.append(("+Inf", float(total)))
        gained = sum((a + 1) * n for a, n in rounds.items())
        lengths.add_metric([self.model], buckets, float(gained))
        yield lengths


def one_two_five(limit: int) -> list[int]:
    """vLLM's buckets of token counts: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


class _CacheConfig:
    """vLLM's `cache_config_info`: a gauge of 1 whose labels are the KV cache's settings (vLLM's
    names; the SWA pool's beside them)."""

    def __init__(self, engine, model: str, prefix: str):
        sizes, options = engine.sizes, engine.options
        ps = sizes.page_size
        self.labels = dict(
            model_name=model,
            block_size=str(ps),
            num_gpu_blocks=str(sizes.full_tokens // ps),
            num_swa_blocks=str(sizes.swa_tokens // ps),
            cache_dtype=str(getattr(engine.model, "dtype", "auto")),  # (the pools')
            enable_prefix_caching=str(options.prefix_cache),
            swa_pool_mode=sizes.mode.value,
        )
        self.prefix = prefix

    def collect(self):
        info = GaugeMetricFamily(
            self.prefix + "cache_config_info",
            "the KV cache's settings, as labels",
            labels=list(self.labels),
        )
        info.add_metric(list(self.labels.values()), 1.0)
        yield info


class Metrics:
    """The registry /metrics renders; the engine loop reports request timings to it."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine, loop, model: str = "swajax", prefix: str = PREFIX):
        """`prefix`: of every name; "vllm:" serves them under vLLM's own names, for dashboards
        and alerts written for vLLM (`swajax serve --metrics-prefix vllm`)."""
        self.model = model
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, loop, model, prefix))
        self.registry.register(_CacheConfig(engine, model, prefix))
        labels = ["model_name"]

        def counter(name, doc, extra=()):
            return Counter(prefix + name, doc, [*labels, *extra], registry=self.registry)

        def series(name, doc, buckets=None):
            """This model's series of a counter (no buckets) or a histogram, looked up once:
            the engine thread reports every token."""
            if buckets is None:
                return counter(name, doc).labels(model)
            metric = Histogram(prefix + name, doc, labels, buckets=buckets, registry=self.registry)
            return metric.labels(model)

        self.prompt_tokens = series("prompt_tokens", "prompt tokens of requests admitted")
        self.generation_tokens = series("generation_tokens", "tokens generated")
        self.queries = series("prefix_cache_queries", "prompt tokens looked up in the cache")
        self.success = counter("request_success", "requests finished", ["finished_reason"])
        for kind in ("stop", "length", "abort"):  # every series exported from the start
            self.success.labels(model, kind)
        self.ttft = series("time_to_first_token_seconds", "submission to first token", TTFT_BUCKETS)
        self.itl = series("inter_token_latency_seconds", "time between tokens", ITL_BUCKETS)
        self.e2e = series("e2e_request_latency_seconds", "submission to last token", E2E_BUCKETS)
        # vLLM's phases of a request (its buckets: the end-to-end ones) and its sizes.
        self.queued = series("request_queue_time_seconds", "submission to scheduled", E2E_BUCKETS)
        self.prefill = series(
            "request_prefill_time_seconds", "scheduled to first token", E2E_BUCKETS
        )
        self.decode = series("request_decode_time_seconds", "first token to last", E2E_BUCKETS)
        self.inference = series(
            "request_inference_time_seconds", "scheduled to last token", E2E_BUCKETS
        )
        sizes = one_two_five(engine.options.max_context)
        self.request_prompt = series("request_prompt_tokens", "prompt tokens", sizes)
        self.request_generation = series("request_generation_tokens", "tokens generated", sizes)
        loop.observer = self

    # The engine loop's reports (its thread).

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.queries.inc(prompt_tokens)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def tokens(self, count: int, seconds_each: float | None) -> None:
        self.generation_tokens.inc(count)
        if seconds_each is not None:
            for _ in range(count):
                self.itl.observe(seconds_each)

    def phases(
        self,
        *,
        queued: float,
        prefill: float,
        decode: float,
        prompt_tokens: int,
        generation_tokens: int,
    ) -> None:
        """One finished sample's time in each phase and its sizes."""
        self.queued.observe(queued)
        self.prefill.observe(prefill)
        self.decode.observe(decode)
        self.inference.observe(prefill + decode)
        self.request_prompt.observe(prompt_tokens)
        self.request_generation.observe(generation_tokens)

    def finished(self, seconds: float, reason: str) -> None:
        self.e2e.observe(seconds)
        kind = reason if reason in ("stop", "length") else "abort"
        self.success.labels(self.model, kind).inc()

    def render(self) -> str:
        return generate_latest(self.registry).decode()
