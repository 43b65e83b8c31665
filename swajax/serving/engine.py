"""The engine: a three-call loop, `plan = scheduler.schedule()`, `result = runner.run(plan)`,
`scheduler.postprocess(plan, result)`.

Host code. The model is an interface the runner calls: `init_pools(sizes) -> pools`,
`forward_and_sample(pools, ForwardBatch, metadata, return_logits=...) -> (pools, (tokens,
logprobs, logits))`, `needs_kv` (whether it reads KV through the pools; the null model does
not, so production-size presets run on a CPU) and `vocab_size`. The device half of a step (the
`Runner`, `swajax.runner.DeviceRunner`) is given by whoever builds the engine
(`swajax.api.engine_for`), so this layer never imports JAX.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from swajax.config import HybridConfig
from swajax.prefix_cache import make_prefix_cache
from swajax.prefix_cache.policy import DEFAULT, CachePolicy, policy_of
from swajax.serving import tail_rebuild
from swajax.serving.batch import PoolMode, Runner, StepMetrics, StepPlan
from swajax.serving.ledger import PoolLedger
from swajax.serving.request import Request, RequestError, SamplingParams
from swajax.serving.scheduler import Scheduler, SchedulerConfig
from swajax.sizing import PoolSizes


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    max_running: int = 64
    max_context: int = 4096
    chunk_size: int | None = None  # chunked prefill (tokens per chunk); None = off
    prefix_cache: bool = True
    eviction_interval: int = 128
    cache_policy: str | CachePolicy = DEFAULT  # a profile of swajax.prefix_cache.policy
    # Exact SWA-tail rebuild of prefix hits the window rule cut (serving/tail_rebuild.py);
    # a profile with `fallback_only` (SGLang's) turns it off too.
    tail_rebuild: bool = True
    # Speculative decoding: draft tokens per decode step, verified greedily (0: off). Needs a
    # draft model (`Engine(draft=...)`), except on the null model, which emulates one.
    num_speculative_tokens: int = 0
    # Overlap scheduling: plan decode step n + 1 while step n runs (serving/overlap.py); used
    # where the runner can launch a step without reading the previous one (a fused model).
    overlap: bool = True

    def __post_init__(self):
        policy_of(self.cache_policy)  # a ValueError naming the profiles
        for name, lo in (("max_running", 1), ("max_context", 1), ("eviction_interval", 1),
                         ("num_speculative_tokens", 0), ("chunk_size", 1)):  # fmt: skip
            value = getattr(self, name)
            if name == "chunk_size" and value is None:
                continue
            if not _is_int(value) or value < lo:
                more = " or None" if name == "chunk_size" else ""
                raise RequestError(f"{name} must be an integer >= {lo}{more}, got {value!r}")
        for name in ("prefix_cache", "tail_rebuild", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"{name} must be True or False, got {getattr(self, name)!r}")


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def engine_window(cfg: HybridConfig, draft=None) -> int:
    """W as host code keeps it: an int, 0 when there are no local layers. With a speculative
    draft, W covers its windows too (its SWA KV lives at the target's slots)."""
    windows = [cfg.sliding_window, draft.spec.hybrid.sliding_window if draft else None]
    return max(w or 0 for w in windows)


class Engine:
    def __init__(
        self,
        cfg: HybridConfig,
        model,
        sizes: PoolSizes,
        options: EngineOptions = EngineOptions(),
        *,
        runner: Runner,
        draft=None,
    ):
        """`runner`: the device half, built for the same model, pools and `engine_window`.
        `draft`: the speculative draft model (a `HybridLM` with the target's vocabulary), whose
        KV shares the target's slots; size the pools with it (`sizing`'s `draft=`)."""
        if options.chunk_size is not None and options.chunk_size < sizes.page_size:
            raise ValueError(
                f"chunk_size {options.chunk_size} is smaller than the page size "
                f"{sizes.page_size}: a chunk must hold at least one page"
            )
        self.cfg, self.model, self.sizes, self.options = cfg, model, sizes, options
        self.draft = draft
        _check_draft(model, draft, options.num_speculative_tokens, sizes)
        # The cache takes the config's None for "no SWA component"; host arithmetic an int.
        self.window = engine_window(cfg, draft)
        self.ledger = PoolLedger(sizes)
        self.cache = make_prefix_cache(
            self.ledger,
            page_size=sizes.page_size,
            window=self.window or None,
            pool_mode=sizes.mode,
            enabled=options.prefix_cache,
            policy=policy_of(options.cache_policy),
        )
        sched_cfg = SchedulerConfig(
            page_size=sizes.page_size,
            window=self.window,
            pool_mode=sizes.mode,
            max_running=options.max_running,
            max_context=options.max_context,
            chunk_size=options.chunk_size,
            eviction_interval=options.eviction_interval,
            radix=options.prefix_cache,
            policy=policy_of(options.cache_policy),
            rebuild_reach=self._rebuild_reach(),
            lookahead=options.num_speculative_tokens,
        )
        self.scheduler = Scheduler(sched_cfg, self.cache, self.ledger)
        self.runner = runner
        self.overlap = options.overlap and getattr(runner, "supports_overlap", False)
        self._launched = None  # a step launched but not read yet (overlap scheduling)
        self.launched_ahead = 0  # steps planned while the one before still ran
        self.requests: dict[int, Request] = {}
        self.metrics: list[StepMetrics] = []
        self.errors: list[Exception] = []  # every step that raised, for logs and tests
        self._ids = itertools.count()
        self._steps = 0

    def _rebuild_reach(self) -> int | None:
        """The scheduler's tail-rebuild setting: only hybrid pools have tombstones that still
        hold full KV, only a radix cache has prefix hits to rebuild."""
        on = (
            self.options.tail_rebuild
            and self.options.prefix_cache
            and not policy_of(self.options.cache_policy).fallback_only
            and self.sizes.mode is PoolMode.HYBRID
            and self.window > 0
            and self.draft is None  # the cone is the target's; a draft's layers would need theirs
        )
        return tail_rebuild.lower_reach(self.cfg) if on else None

    # ------------------------------------------------------------------------------------------
    # Requests

    def capacity(self) -> int:
        """Most tokens one request can ever hold (the address space of the pools)."""
        mode = self.sizes.mode
        if mode is PoolMode.ALL_SWA or (
            mode is PoolMode.HYBRID and self.options.chunk_size is None
        ):
            return min(self.sizes.full_tokens or self.sizes.swa_tokens, self.sizes.swa_tokens)
        return self.sizes.full_tokens

    def add_request(
        self, prompt, params: SamplingParams | None = None, *, keep_logits: bool = False
    ) -> int:
        """Queue a request; raises RequestError (naming the value and the limit) if it can never
        be served. Other requests are unaffected either way."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = _token_ids(prompt)
        vocab = getattr(self.model, "vocab_size", None)
        if vocab is not None and not all(0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        total = len(prompt) + params.max_new_tokens
        # A speculative round holds k positions past the last kept one, in the row and pools.
        k = self.options.num_speculative_tokens
        lookahead = f" + {k} speculative positions" if k else ""
        if total + k > self.options.max_context:
            raise RequestError(
                f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}){lookahead}"
                f" = {total + k} exceeds the context limit {self.options.max_context} "
                "(max_context, --max-context)"
            )
        if total + k + self.sizes.page_size > self.capacity():
            raise RequestError(
                f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}){lookahead}"
                f" = {total + k} tokens cannot fit in the KV pools ({self.capacity()} "
                "tokens per request, a page kept spare; raise kv_budget_gib, --kv-budget-gib)"
            )
        if self.options.num_speculative_tokens and (params.temperature > 0 or keep_logits):
            raise RequestError(
                f"speculative decoding verifies greedily: temperature must be 0 (got "
                f"{params.temperature}) and logits are not kept (keep_logits={keep_logits})"
            )
        rid = next(self._ids)
        req = Request(rid, prompt, params, keep_logits=keep_logits)
        self.requests[rid] = req
        self.scheduler.waiting.append(req)
        return rid

    def abort(self, rid: int) -> None:
        """Abort request `rid` in any state (its KV goes back); a finished one is left as is."""
        req = self.requests.get(rid) if _is_int(rid) else None
        if req is None:
            raise RequestError(f"no request has the id {rid!r} (ids come from add_request)")
        self.scheduler.abort(req)

    @property
    def idle(self) -> bool:
        return not self.scheduler.waiting and not self.scheduler.running and not self._launched

    # ------------------------------------------------------------------------------------------
    # The step

    def step(self) -> StepMetrics | None:
        """One step; None only when nothing is in flight. A step that raises (the model, the
        sampler) is rolled back and its requests retried alone, then failed with the error;
        the engine keeps serving the others."""
        if self._launched is not None:
            return self._overlapped_step()
        plan = self.scheduler.schedule()
        if plan is None:
            return None
        if not plan.requests:  # the step only retracted or aborted: its releases still go
            self.runner.apply_releases(plan.releases)
        elif self.overlap:
            try:
                self._launched = self.runner.dispatch(plan)
            except Exception as error:  # noqa: BLE001 - handed to the requests, never dropped
                self.errors.append(error)
                self.scheduler.step_failed(plan, error)
            else:
                return self._overlapped_step()
        else:
            try:
                result = self.runner.run(plan)
            except Exception as error:  # noqa: BLE001 - handed to the requests, never dropped
                self.errors.append(error)
                self.scheduler.step_failed(plan, error)
            else:
                self.scheduler.postprocess(plan, result)
        return self._record(plan)

    def _overlapped_step(self, *, plan_ahead: bool = True) -> StepMetrics:
        """Read the launched step n, after launching n + 1 when it can be planned without n's
        result (a steady decode): the host plans while the device computes."""
        launched, after = self._launched, None
        plan = launched.plan
        ahead = self.scheduler.plan_ahead(plan) if plan_ahead else None
        if ahead is not None:
            try:
                after = self.runner.dispatch(ahead, after=launched)
                self.launched_ahead += 1
            except Exception as error:  # noqa: BLE001 - its requests are retried alone
                self.errors.append(error)
                ahead_error = error
            else:
                ahead_error = None
        self._launched = after
        try:
            result = self.runner.collect(launched)
        except Exception as error:  # noqa: BLE001 - the read failed: as atomic as a launch
            self.errors.append(error)
            self._launched = None
            if after is not None:  # planned on top of `launched`: undone first
                self.runner.discard(after)
            self.runner.discard(launched)
            self.scheduler.step_failed(plan, error)  # its requests, `ahead`'s among them
            return self._record(plan)
        self.scheduler.postprocess(plan, result, ahead if after is not None else None)
        if ahead is not None and after is None:
            self.scheduler.step_failed(ahead, ahead_error)
        return self._record(plan)

    def run(self, max_steps: int | None = None) -> None:
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if self.idle or self.step() is None:
                break
        self.flush()

    def flush(self) -> None:
        """Apply releases still queued on the host (e.g. of requests that just finished), so the
        device pools match the ledger even when no further step runs. A step still launched is
        read first (its releases were counted with it)."""
        while self._launched is not None:
            self._overlapped_step(plan_ahead=False)
        if self.ledger.has_pending:
            self.runner.apply_releases(self.ledger.take_releases())

    def _record(self, plan: StepPlan) -> StepMetrics:
        self._steps += 1
        full, swa = self.ledger.available()
        ps = self.sizes.page_size
        total_full = self.ledger.primary_pages * ps
        total_swa = (
            self.ledger.swa_pages
            if self.sizes.mode is PoolMode.HYBRID
            else self.ledger.primary_pages
        ) * ps
        c = self.cache
        m = StepMetrics(
            step=self._steps,
            kind=plan.kind.value,
            batch_size=len(plan.requests),
            new_tokens=plan.num_new_tokens,
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
            rebuilt_tokens=self.scheduler.rebuilt_tokens,
            rebuild_saved_tokens=self.scheduler.rebuild_saved_tokens,
            retractions=self.scheduler.retractions,
            compilations=self.runner.compilations(),
            r2t_tokens_written=plan.r2t_tokens_written,
            spans=tuple(
                (req.rid, int(pre), int(seq), req.num_tokens == seq + 1)
                for req, pre, seq in zip(plan.requests, plan.prefix_lens, plan.seq_lens)
            ),
        )
        self.metrics.append(m)
        return m


def _token_ids(prompt) -> list[int]:
    """A prompt as a list of ints; a RequestError names what is not a token id."""
    if isinstance(prompt, str | bytes) or not hasattr(prompt, "__len__"):
        raise RequestError(
            f"the prompt must be a sequence of token ids, got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise RequestError("the prompt is empty")
    for i, t in enumerate(prompt):
        if not _is_int(t) or t < 0:
            raise RequestError(f"prompt[{i}] = {t!r} is not a token id (an integer >= 0)")
    return [int(t) for t in prompt]


def _check_draft(model, draft, k: int, sizes: PoolSizes) -> None:
    """A draft that can share the target's slots, or a clear error."""
    if draft is None:
        if k and model.needs_kv:
            raise ValueError(f"num_speculative_tokens={k} needs a draft model (Engine(draft=...))")
        return
    if not k:
        raise ValueError("a draft model needs num_speculative_tokens >= 1")
    if getattr(model, "fused_forward", None) is None or draft.fused_forward is None:
        raise ValueError("speculative decoding runs in the fused step program: no mesh")
    if draft.vocab_size != model.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({draft.vocab_size}) differs from the target's "
            f"({model.vocab_size}): its tokens could not be verified"
        )
    if sizes.mode is PoolMode.ALL_SWA and draft.spec.hybrid.full_layer_ids:
        raise ValueError("the target's pools are all-SWA: a draft with full layers has no room")
