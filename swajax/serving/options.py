"""What the scheduler runs with: `EngineOptions`, every scheduling and cache setting a user
chooses, in one frozen object the engine passes down as it is (nothing copied field by field);
and `SchedulerConfig`, what the engine derives from the pools and the model."""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.errors import RequestError
from swajax.prefix_cache.policy import DEFAULT, SWAJAX, CachePolicy, policy_of
from swajax.sizing import DEFAULT_EVICTION_INTERVAL, PoolMode


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Scheduling and prefix-cache settings of an engine (validated on construction: a bad
    value is a `RequestError` naming the field and the limit)."""

    max_running: int = 64
    max_context: int | None = 4096  # None: as long as the pools allow (swajax.api resolves it)
    chunk_size: int | None = None  # chunked prefill (tokens per chunk); None = off
    prefix_cache: bool = True
    eviction_interval: int = DEFAULT_EVICTION_INTERVAL
    cache_policy: str | CachePolicy = DEFAULT  # a profile of swajax.prefix_cache.policy
    # Exact SWA-tail rebuild of prefix hits the window rule cut (serving/tail_rebuild.py);
    # a profile with `fallback_only` (SGLang's) turns it off too.
    tail_rebuild: bool = True
    # Speculative decoding: draft tokens per decode step, verified by speculative sampling
    # (greedy requests: by equality); 0: off. Needs a draft model (`Engine(draft=...)`),
    # except on the null model, which emulates one.
    num_speculative_tokens: int = 0
    # Multi-step decode: up to this many decode steps in one program, read once, when every
    # running request decodes and nothing waits (`Scheduler._decode_lens`; each request takes
    # what it has left, up to N); 1: off. Not with a speculative draft (its rounds come first). A
    # request that arrives during a round waits for its end, and streamed tokens come N at a
    # time: 1 for the lowest latency, larger for throughput at small batches. None: the
    # runner's own default (8 for a model in the fused program, where rounds amortize the
    # host's part of a step; 1 for the null model, which models an accelerator's steps, and
    # whose traces follow SGLang's one decode allocation per token).
    decode_steps: int | None = None
    # Overlap scheduling: plan decode step n + 1 while step n runs (serving/overlap.py); used
    # where the runner can launch a step without reading the previous one (a fused model).
    overlap: bool = True
    # The most top-N logprobs a request may ask for (SamplingParams.logprobs), vLLM's default.
    max_logprobs: int = 20
    # Seeds requests whose SamplingParams leave `seed` unset draw from (vLLM's `LLM(seed=)`).
    seed: int = 0
    # A server's step shapes (runner/step_shapes.py): every program a step can need is
    # compiled by `Engine.warm_up` before the first request, none in the serving loop. Each
    # step then pays for the largest of its sampling features; off (the offline default),
    # shapes follow each batch and a new one compiles when first met.
    warmup: bool = False

    def __post_init__(self):
        policy_of(self.cache_policy)  # a ValueError naming the profiles
        for name, lo in (
            ("max_running", 1),
            ("max_context", 1),
            ("eviction_interval", 1),
            ("num_speculative_tokens", 0),
            ("chunk_size", 1),
            ("decode_steps", 1),
            ("max_logprobs", 0),
        ):
            value = getattr(self, name)
            optional = name in ("chunk_size", "max_context", "decode_steps")
            if optional and value is None:
                continue
            if not is_int(value) or value < lo:
                more = " or None" if optional else ""
                raise RequestError(f"{name} must be an integer >= {lo}{more}, got {value!r}")
        for name in ("prefix_cache", "tail_rebuild", "overlap", "warmup"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"{name} must be True or False, got {getattr(self, name)!r}")


def is_int(value) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler derives from the pools and the model; every setting a user chooses is
    in the `EngineOptions` passed beside it."""

    page_size: int
    window: int  # memory window W (0 without local layers)
    pool_mode: PoolMode
    policy: CachePolicy = SWAJAX  # the resolved cache-policy profile of `options.cache_policy`
    # Multi-step decode's most steps per program: `options.decode_steps` where the runner can
    # run a round (a fused model, or the null model) and no draft does; else 1.
    decode_steps: int = 1
    decode_reserve_ratio: float = 0.5  # share of a running request's remaining tokens reserved
    # Exact SWA-tail rebuild (serving/tail_rebuild.py): the windows of every local layer but the
    # top one (`tail_rebuild.lower_reach`); None: off (always fall back as SGLang does).
    rebuild_reach: int | None = None
