"""`LLM.get_metrics()`: vLLM's metric objects (name, labels, value) under vLLM's names, for the
offline scripts that read them: the requests running and waiting, KV usage, the prefix cache's
queries and hits, preemptions, prompt and generation tokens, finished requests by reason, and
speculative decoding's counters. Host code."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    labels: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Counter(Metric):
    value: int


@dataclasses.dataclass(frozen=True)
class Gauge(Metric):
    value: float


@dataclasses.dataclass(frozen=True)
class Vector(Metric):
    values: list[int]


def engine_metrics(engine, served: dict, model: str) -> list[Metric]:
    """`served`: what the LLM's calls returned so far (prompt_tokens, generation_tokens,
    cached_tokens, and "finished:<reason>" counts)."""
    sched, labels = engine.scheduler, {"model_name": model}
    total = engine.sizes.full_tokens or 1
    full_free, _ = engine.ledger.available()
    out: list[Metric] = [
        Gauge("vllm:num_requests_running", labels, float(len(sched.running))),
        Gauge("vllm:num_requests_waiting", labels, float(len(sched.waiting))),
        Gauge("vllm:kv_cache_usage_perc", labels, 1.0 - full_free / total),
        Counter("vllm:num_preemptions", labels, int(sched.retractions)),
        Counter("vllm:prompt_tokens", labels, int(served.get("prompt_tokens", 0))),
        Counter("vllm:generation_tokens", labels, int(served.get("generation_tokens", 0))),
        Counter("vllm:prefix_cache_queries", labels, int(served.get("prompt_tokens", 0))),
        Counter("vllm:prefix_cache_hits", labels, int(served.get("cached_tokens", 0))),
    ]
    for key, n in sorted(served.items()):
        if key.startswith("finished:"):
            reason = key.removeprefix("finished:")
            out.append(Counter("vllm:request_success", {**labels, "finished_reason": reason}, n))
    k = engine.options.num_speculative_tokens
    if k:
        rounds = dict(sched.acceptance)
        accepted = sum(a * c for a, c in rounds.items())
        per_pos = [sum(c for a, c in rounds.items() if a > i) for i in range(k)]
        out += [
            Counter("vllm:spec_decode_num_drafts", labels, sum(rounds.values())),
            Counter("vllm:spec_decode_num_draft_tokens", labels, int(sched.draft_tokens)),
            Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_pos),
        ]
    return out
