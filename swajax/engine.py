"""The engine: one step = schedule -> evict -> allocate -> metadata -> forward -> sample -> update.

The model is an interface: `init_pools(sizes) -> pools`, `forward(pools, ForwardBatch) ->
(logits of the sampled rows, pools)` and `needs_kv` (whether it reads KV through the pools; the
null model does not, so production-size presets run on a CPU).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from swajax import req_to_token as r2t_lib
from swajax.attention import build_metadata
from swajax.compilations import compilation_count
from swajax.config import HybridConfig
from swajax.kv_allocator import KVAllocator
from swajax.null_model import ForwardBatch
from swajax.prefix_cache import make_prefix_cache
from swajax.request import Request, RequestError, SamplingParams, Status
from swajax.sampling import sample
from swajax.scheduler import Batch, Scheduler, SchedulerConfig
from swajax.sizing import PoolSizes


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    max_running: int = 64
    max_context: int = 4096
    chunk_size: int | None = None  # chunked prefill (tokens per chunk); None = off
    prefix_cache: bool = True
    eviction_interval: int = 128

    def __post_init__(self):
        for name in ("max_running", "max_context", "eviction_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {self.chunk_size}")


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    step: int
    kind: str
    batch_size: int
    new_tokens: int
    running: int
    waiting: int
    full_used: int
    swa_used: int
    full_evictable: int
    swa_evictable: int
    full_protected: int
    swa_protected: int
    hit_tokens: int
    swa_tail_miss_tokens: int
    retractions: int
    compilations: int


def pool_mode(sizes: PoolSizes) -> str:
    return {"chunk_cap": "hybrid"}.get(sizes.mode, sizes.mode)


class Engine:
    def __init__(
        self, cfg: HybridConfig, model, sizes: PoolSizes, options: EngineOptions = EngineOptions()
    ):
        self.cfg, self.model, self.sizes, self.options = cfg, model, sizes, options
        mode, ps = pool_mode(sizes), sizes.page_size
        self.window = cfg.sliding_window or 0
        full = sizes.swa_tokens if mode == "all_swa" else sizes.full_tokens
        self.alloc = KVAllocator.create(full, sizes.swa_tokens, ps, mode)
        self.cache = make_prefix_cache(
            self.alloc,
            page_size=ps,
            window=self.window or None,
            pool_mode=mode,
            enabled=options.prefix_cache,
        )
        sched_cfg = SchedulerConfig(
            page_size=ps,
            window=self.window,
            pool_mode=mode,
            max_running=options.max_running,
            max_context=options.max_context,
            chunk_size=options.chunk_size,
            eviction_interval=options.eviction_interval,
            radix=options.prefix_cache,
        )
        self.scheduler = Scheduler(sched_cfg, self.cache, self.alloc)
        self.pools = model.init_pools(sizes)
        self.r2t = (
            r2t_lib.ReqToToken.init(options.max_running, options.max_context)
            if (model.needs_kv)
            else None
        )
        self.requests: dict[int, Request] = {}
        self.metrics: list[StepMetrics] = []
        self._ids = itertools.count()
        self._steps = 0
        self._compiles0 = compilation_count()

    # ------------------------------------------------------------------------------------------
    # Requests

    def capacity(self) -> int:
        """Most tokens one request can ever hold (the address space of the pools)."""
        mode = pool_mode(self.sizes)
        if mode == "all_swa" or (mode == "hybrid" and self.options.chunk_size is None):
            return min(self.sizes.full_tokens or self.sizes.swa_tokens, self.sizes.swa_tokens)
        return self.sizes.full_tokens

    def add_request(
        self, prompt, params: SamplingParams | None = None, *, keep_logits: bool = False
    ) -> int:
        """Queue a request; raises RequestError (naming the value and the limit) if it can never
        be served. Other requests are unaffected either way."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise RequestError("the prompt is empty")
        vocab = getattr(self.model, "vocab_size", None)
        if vocab is not None and not all(0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        total = len(prompt) + params.max_new_tokens
        if total > self.options.max_context:
            raise RequestError(
                f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) "
                f"= {total} exceeds the context limit {self.options.max_context}"
            )
        if total + self.sizes.page_size > self.capacity():
            raise RequestError(
                f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens})"
                f" = {total} tokens cannot fit in the KV pools ({self.capacity()} "
                "tokens per request)"
            )
        rid = next(self._ids)
        req = Request(rid, prompt, params, keep_logits=keep_logits)
        self.requests[rid] = req
        self.scheduler.waiting.append(req)
        return rid

    def abort(self, rid: int) -> None:
        self.scheduler.abort(self.requests[rid])

    @property
    def idle(self) -> bool:
        return not self.scheduler.waiting and not self.scheduler.running

    # ------------------------------------------------------------------------------------------
    # The step

    def step(self) -> StepMetrics | None:
        batch = self.scheduler.next_batch()
        if batch is None:
            return None
        if batch.reqs:
            fwd = self._forward_batch(batch)
            logits, self.pools = self.model.forward(self.pools, fwd)
            self._update(batch, fwd, logits)
        return self._record(batch)

    def run(self, max_steps: int | None = None) -> None:
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if self.idle or self.step() is None:
                return

    def _forward_batch(self, batch: Batch) -> ForwardBatch:
        tokens, positions, sample_index = [], [], []
        for req, n in zip(batch.reqs, batch.lens):
            start = req.kv_len - n
            tokens += req.tokens[start : req.kv_len]
            positions += range(start, req.kv_len)
            if req.keep_logits:  # every row; the last one also serves sampling
                sample_index += range(len(tokens) - n, len(tokens))
            elif req.kv_len == len(req.tokens):
                sample_index.append(len(tokens) - 1)
        meta = self._metadata(batch) if self.model.needs_kv else None
        return ForwardBatch(
            np.asarray(tokens, np.int32),
            np.asarray(positions, np.int32),
            np.asarray(sample_index, np.int32),
            meta,
        )

    def _metadata(self, batch: Batch):
        rows = [r.row for r in batch.reqs]
        pre = [r.kv_len - n for r, n in zip(batch.reqs, batch.lens)]
        seq = [r.kv_len for r in batch.reqs]
        # The row holds every slot the request uses from 0 (the cache may have re-pointed some).
        flat = np.concatenate([r.slots for r in batch.reqs])
        self.r2t = r2t_lib.write(self.r2t, rows, [0] * len(rows), seq, flat)
        return build_metadata(self.r2t, self.alloc.state, rows, pre, seq, window=self.window)

    def _update(self, batch: Batch, fwd: ForwardBatch, logits) -> None:
        logits = np.asarray(logits)
        rows, row = [], 0  # the logits row each sampled request samples from
        for req, n in zip(batch.reqs, batch.lens):
            sampled = req.kv_len == len(req.tokens)
            if req.keep_logits:
                req.logits += list(logits[row : row + n])
                row += n
            elif sampled:
                row += 1
            if sampled:
                rows.append(row - 1)
        sampled = [r for r in batch.reqs if r.kv_len == len(r.tokens)]
        if sampled:
            p = [r.params for r in sampled]
            tokens, logprobs = sample(
                logits[rows],
                [x.temperature for x in p],
                [x.top_p for x in p],
                [x.seed for x in p],
                [r.kv_len for r in sampled],
            )
            for req, token, logprob in zip(sampled, tokens.tolist(), logprobs.tolist()):
                req.output.append(token)
                req.logprobs.append(logprob)
                if token in req.params.stop_token_ids:
                    self.scheduler.finish(req, "stop")
                elif len(req.output) >= req.params.max_new_tokens:
                    self.scheduler.finish(req, "length")
        for req in batch.reqs:
            if req.status is Status.RUNNING and not req.decoding and self.options.prefix_cache:
                self._cache_chunk(req)

    def _cache_chunk(self, req: Request) -> None:
        """Between chunks of a prefill: insert what is computed so far and use the cache's slots."""
        prefix, req.handle = self.cache.cache_unfinished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
        )
        req.slots = np.concatenate([prefix, req.slots[len(prefix) :]]).astype(np.int32)
        req.cache_protected_len = max(req.cache_protected_len, len(prefix))

    def _record(self, batch: Batch) -> StepMetrics:
        self._steps += 1
        full, swa = self.alloc.available()
        total_full = self.alloc.state.primary.size * self.sizes.page_size
        total_swa = (
            self.alloc.state.swa.size
            if self.alloc.state.swa is not None
            else self.alloc.state.primary.size
        ) * self.sizes.page_size
        c = self.cache
        m = StepMetrics(
            step=self._steps,
            kind=batch.kind,
            batch_size=len(batch.reqs),
            new_tokens=sum(batch.lens),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            full_used=total_full - full,
            swa_used=total_swa - swa,
            full_evictable=c.full_evictable,
            swa_evictable=c.swa_evictable,
            full_protected=c.full_protected,
            swa_protected=c.swa_protected,
            hit_tokens=self.scheduler.hit_tokens,
            swa_tail_miss_tokens=self.scheduler.tail_miss_tokens,
            retractions=self.scheduler.retractions,
            compilations=compilation_count() - self._compiles0,
        )
        self.metrics.append(m)
        return m
