"""The engine: a three-call loop, `plan = scheduler.schedule()`, `step = runner.dispatch(plan)`
then `result = runner.collect(step)`, `scheduler.postprocess(plan, result)`; with overlap, the
next step is planned and dispatched between the last two.

Host code. The model is the `serving.batch.Model` Protocol the runner calls (the null model
reads no KV, so production-size presets run on a CPU). The device half of a step (the
`Runner`, `swajax.runner.DeviceRunner`) is given by whoever builds the engine
(`swajax.api.engine_for`), so this layer never imports JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import numpy as np

from swajax.config import HybridConfig
from swajax.errors import InputError, RequestError
from swajax.prefix_cache import make_prefix_cache
from swajax.prefix_cache.policy import policy_of
from swajax.serving import tail_rebuild
from swajax.serving.batch import Model, PoolMode, Runner, StepMetrics, StepPlan
from swajax.serving.ledger import PoolLedger
from swajax.serving.options import EngineOptions, SchedulerConfig, is_int
from swajax.serving.request import Request, Status
from swajax.serving.sampling_params import SamplingParams
from swajax.serving.scheduler import Scheduler
from swajax.sizing import PoolSizes

POOLS = ("full", "swa")


def engine_window(cfg: HybridConfig, draft=None) -> int:
    """W as host code keeps it: an int, 0 when there are no local layers. With a speculative
    draft, W covers its windows too (its SWA KV lives at the target's slots)."""
    return max(cfg.sliding_window or 0, draft.memory_window if draft is not None else 0)


class Engine:
    """The serving loop over two KV pools: `add_request`, `step` (one scheduled batch through
    the device), `run` (until idle), `abort`; `requests`, `metrics` and `errors` record what
    happened. Build it with `swajax.api.engine_for` (or `make_engine`, or `swajax.LLM`)."""

    def __init__(
        self,
        cfg: HybridConfig,
        model: Model,
        sizes: PoolSizes,
        options: EngineOptions | None = None,
        *,
        runner: Runner,
        draft=None,
        snapshots=None,
    ):
        """`runner`: the device half, built for the same model, pools, options and
        `engine_window` (`swajax.api.engine_for` builds both). `draft`: the speculative draft
        model (a `HybridLM` with the target's vocabulary), whose KV shares the target's slots;
        size the pools with it (`sizing`'s `draft=`). `snapshots`: what `snapshot` and
        `restore` call (`swajax.api.state.Snapshots`, given by `engine_for`: the device half
        of a snapshot is orbax, which this layer does not import)."""
        options = options or EngineOptions()
        _check_setup(model, draft, options, sizes)
        self.cfg, self.model, self.sizes, self.options = cfg, model, sizes, options
        self.draft, self.runner, self.snapshots = draft, runner, snapshots
        # The cache takes the config's None for "no SWA component"; host arithmetic an int.
        self.window = engine_window(cfg, draft)
        self._host_state()
        self.overlap = options.overlap and runner.supports_overlap
        if options.warmup and hasattr(runner, "fix_shapes"):  # (the host runner compiles none)
            runner.fix_shapes(
                chunk_tokens=options.chunk_size or options.max_context,
                max_logprobs=options.max_logprobs,
                decode_steps=_decode_steps(options, runner, draft),
                draft_tokens=options.num_speculative_tokens,
            )
        # Set while a call that changes the engine's state runs; left set by one that did not
        # finish (an interrupt, an exception out of a step): the state is then rebuilt.
        self.damaged, self._changes = False, 0
        self.launched_ahead = 0  # steps planned while the one before still ran
        self.requests: dict[int, Request] = {}
        self.metrics: list[StepMetrics] = []
        self.errors: list[Exception] = []  # every step that raised, for logs and tests
        # The next request id and the steps taken (a snapshot keeps both: serving/snapshot.py).
        self.next_id = 0
        self.steps = 0
        # Unset sampling fields: the checkpoint's generation config (set by whoever knows the
        # checkpoint: swajax.LLM), else SamplingParams.NEUTRAL; unset seeds: drawn in order.
        self.sampling_defaults: dict = {}
        self.seed_generator = np.random.default_rng(options.seed)

    def _host_state(self) -> None:
        """The ledger, prefix cache and scheduler, empty."""
        sizes, options = self.sizes, self.options
        self.ledger = PoolLedger(sizes)
        policy = policy_of(options.cache_policy)
        host = (sizes.host_full_tokens, sizes.host_swa_tokens) if sizes.host_full_tokens else None
        self.cache = make_prefix_cache(
            self.ledger,
            page_size=sizes.page_size,
            window=self.window or None,
            pool_mode=sizes.mode,
            enabled=options.prefix_cache,
            policy=policy,
            host_tier=host,
        )
        layout = SchedulerConfig(
            page_size=sizes.page_size,
            window=self.window,
            pool_mode=sizes.mode,
            policy=policy,
            rebuild_reach=self._rebuild_reach(),
            decode_steps=_decode_steps(options, self.runner, self.draft),
        )
        self.scheduler = Scheduler(layout, options, self.cache, self.ledger)
        self._launched = None  # a step launched but not read yet (overlap scheduling)

    @contextlib.contextmanager
    def _changing(self):
        """Around every call that changes the state: one that does not end normally (a
        KeyboardInterrupt between a program's donation of its inputs and the runner taking
        its outputs, an exception half way through the scheduler's bookkeeping) leaves the
        engine marked damaged, and the next such call rebuilds it first (`recover`)."""
        if self.damaged and not self._changes:
            self.recover()
        self._changes += 1  # nested: step inside run
        self.damaged = True
        try:
            yield
        finally:
            self._changes -= 1
        if not self._changes:
            self.damaged = False

    def recover(self, reason: str = "abort: the engine was interrupted") -> None:
        """Rebuild a damaged engine: every unfinished request ends with `reason` (its KV is
        gone with the pools), the prefix cache starts empty and the device state is made anew
        (the old one may hold donated buffers). Requests added afterwards get exactly the
        tokens a fresh engine gives them."""
        for req in self.requests.values():
            if not req.done:
                req.abandon(reason)
        self.runner.reset()
        self._host_state()
        self.damaged = False

    def warm_up(self) -> tuple[int, int]:
        """Make every step program ready before the first request (`EngineOptions.warmup`):
        returns (programs made ready, of which compiled in this process: the rest came from
        the program store); (0, 0) where nothing compiles (the host runner) or the option is
        off."""
        if not self.options.warmup or not hasattr(self.runner, "warm_up"):
            return 0, 0
        with self._changing():
            return self.runner.warm_up()

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
        return request_capacity(self.sizes, self.options.chunk_size)

    def add_request(
        self,
        prompt,
        params: SamplingParams | None = None,
        *,
        keep_logits: bool = False,
        follows: int | None = None,
        cache_hits: bool = True,
    ) -> int:
        """Queue a request; raises RequestError (naming the value and the limit) if it can never
        be served. Other requests are unaffected either way. `follows`: the id of a request
        with the same prompt whose prefill this one waits for, to take the prompt's KV from
        the prefix cache (another sample of it; `swajax.LLM` does this for `n > 1`).
        `cache_hits=False`: take no cached prefix, so every prompt position is computed (and,
        with `keep_logits`, has its logits: teacher forcing, a server's echo)."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        seed = self.draw_seed() if params.seed is None else None
        params = params.resolved(self.sampling_defaults, seed=seed)
        prompt = _token_ids(prompt)
        vocab = self.model.vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        total = len(prompt) + params.max_tokens
        # A speculative round holds k positions past the last kept one, in the row and pools.
        k = self.options.num_speculative_tokens
        lookahead = f" + {k} speculative positions" if k else ""
        if total + k > self.options.max_context:
            raise RequestError(
                f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}){lookahead}"
                f" = {total + k} exceeds the context limit {self.options.max_context} "
                "(max_model_len, --context-length)"
            )
        if total + k + self.sizes.page_size > self.capacity():
            raise RequestError(
                f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}){lookahead}"
                f" = {total + k} tokens cannot fit in the KV pools ({self.capacity()} "
                "tokens per request, a page kept spare; raise kv_budget_gib, --kv-budget-gib)"
            )
        self._check_sampling(params)
        lead = self._lead(follows, prompt)
        with self._changing():
            rid = self.next_id
            self.next_id += 1
            req = Request(
                rid, prompt, params, keep_logits=keep_logits, follows=lead, cache_hits=cache_hits
            )
            if lead is not None:
                lead.leads = True
            self.requests[rid] = req
            self.scheduler.waiting.append(req)
        return rid

    def draw_seed(self) -> int:
        """The next seed for a request that sets none (the engine's generator, `options.seed`)."""
        return int(self.seed_generator.integers(0, 2**32))

    def _check_sampling(self, params: SamplingParams) -> None:
        vocab = self.model.vocab_size
        if vocab is not None and params.top_k > vocab:
            raise RequestError(
                f"top_k {params.top_k} exceeds the vocabulary size {vocab} (0 keeps every token)"
            )
        if params.samples != 1:
            raise RequestError(
                f"n and best_of must be 1 for one engine request, got n={params.n}, best_of="
                f"{params.best_of} (swajax.LLM samples them per prompt; or add each sample "
                "with follows=)"
            )
        limit = self.options.max_logprobs
        if params.logprobs > limit:
            raise RequestError(f"logprobs {params.logprobs} exceeds max_logprobs {limit}")
        if params.bad_words and not params.bad_words_token_ids:
            raise RequestError(
                f"bad_words {params.bad_words!r} need a tokenizer: swajax.LLM and the server "
                "tokenize them; an engine caller gives bad_words_token_ids"
            )
        outside = [t for t in params.token_ids() if vocab is not None and t >= vocab]
        if outside:
            raise RequestError(
                f"token id {outside[0]} (logit_bias, allowed_token_ids or bad words) is outside "
                f"the vocabulary (size {vocab})"
            )

    def _lead(self, follows, prompt: list[int]) -> Request | None:
        if follows is None:
            return None
        lead = self.requests.get(follows) if is_int(follows) else None
        if lead is None:
            raise RequestError(f"follows={follows!r}: no request has that id")
        if lead.prompt != prompt:
            raise RequestError(f"follows={follows}: request {follows} has another prompt")
        return lead

    def abort(self, rid: int, reason: str = "aborted") -> None:
        """Abort request `rid` in any state (its KV goes back); a finished one is left as is."""
        req = self._request(rid)
        with self._changing():
            self.scheduler.abort(req, reason)

    def stop(self, rid: int, keep: int | None = None) -> None:
        """Finish request `rid` now with reason "stop" (a stop string the caller matched): a
        running one hands its KV to the prefix cache as if it had sampled a stop token.
        `keep`: the output tokens it keeps (those up to the one that completed the stop
        string); the rest, and their KV, go first."""
        req = self._request(rid)
        with self._changing():
            if req.status is Status.RUNNING:
                if keep is not None:
                    self.scheduler.truncate(req, keep)
                self.scheduler.finish(req, "stop")
            else:  # waiting (retracted) or ended: nothing of it is held
                self.scheduler.abort(req, "stop")

    def _request(self, rid: int) -> Request:
        req = self.requests.get(rid) if is_int(rid) else None
        if req is None:
            raise RequestError(f"no request has the id {rid!r} (ids come from add_request)")
        return req

    def snapshot(self, folder, *, force: bool = False) -> dict:
        """Save this engine, running or at rest, to `folder` (`swajax.api.state.save_state`);
        a fresh engine built the same way `restore`s it and goes on exactly as this one does.
        Returns the snapshot's header."""
        return self._snapshots().save(self, folder, force=force)

    def restore(self, folder, *, requests: bool = True) -> dict:
        """Load the snapshot in `folder` into this fresh engine (`swajax.api.state.
        restore_state`); `requests=False`: its prefix cache alone, into pools of any size."""
        return self._snapshots().restore(self, folder, requests=requests)

    def _snapshots(self):
        if self.snapshots is None:
            raise InputError(
                "this engine has no snapshots: the null model holds no KV (a model on the "
                "device built by swajax.api.engine_for has them)"
            )
        return self.snapshots

    @property
    def idle(self) -> bool:
        return not self.scheduler.waiting and not self.scheduler.running and not self._launched

    # ------------------------------------------------------------------------------------------
    # The step

    def step(self) -> StepMetrics | None:
        """One step; None only when nothing is in flight. A step that raises (the model, the
        sampler) is rolled back and its requests retried alone, then failed with the error;
        the engine keeps serving the others."""
        with self._changing():
            return self._step()

    def _step(self) -> StepMetrics | None:
        if self._launched is not None:
            return self._take_launched()
        plan = self.scheduler.schedule()
        if plan is None:
            return None
        if not plan.requests:  # the step only retracted or aborted: its releases still go
            self.runner.apply_releases(plan.memory.releases, plan.memory.transfers)
            return self._record(plan)
        try:
            self._launched = self.runner.dispatch(plan)
        except Exception as error:  # noqa: BLE001 - handed to the requests, never dropped
            self._failed(plan, error)
            return self._record(plan)
        return self._take_launched()

    def _take_launched(self, *, plan_ahead: bool = True) -> StepMetrics:
        """Read the launched step n and take its result; with overlap, first launch step n + 1
        when it can be planned without n's result (a steady decode): the host plans while the
        device computes. The one step path: a runner without overlap ran the step in
        `dispatch` and hands its result back in `collect`."""
        launched, after = self._launched, None
        plan = launched.plan
        ahead = self.scheduler.plan_ahead(plan) if plan_ahead and self.overlap else None
        if ahead is not None:
            try:
                after = self.runner.dispatch(ahead, after=launched)
                self.launched_ahead += 1
            except Exception as error:  # noqa: BLE001 - its requests are retried alone
                ahead_error = error
            else:
                ahead_error = None
        self._launched = after
        try:
            result = self.runner.collect(launched)
        except Exception as error:  # noqa: BLE001 - the read failed: as atomic as a launch
            self._launched = None
            if after is not None:  # planned on top of `launched`: undone first
                self.runner.discard(after)
            self.runner.discard(launched)
            self._failed(plan, error)  # its requests, `ahead`'s among them
            return self._record(plan)
        self.scheduler.postprocess(plan, result, ahead if after is not None else None)
        if ahead is not None and after is None:
            self._failed(ahead, ahead_error)
        return self._record(plan)

    def _failed(self, plan: StepPlan, error: Exception) -> None:
        """A step that raised: the error is kept, its requests are retried alone (a suspect
        that fails alone is aborted with it); the device state was already rolled back."""
        self.errors.append(error)
        if self.runner.state_lost():  # after the program took its inputs: nothing to roll back
            self.recover(f"abort: the device state was lost ({type(error).__name__}: {error})")
            return
        self.scheduler.step_failed(plan, error)

    def run(self, max_steps: int | None = None) -> None:
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if self.idle or self.step() is None:
                break
        self.flush()

    def flush(self) -> None:
        """Apply releases still queued on the host (e.g. of requests that just finished), so the
        device pools match the ledger even when no further step runs. A step still launched is
        read first (its releases were counted with it)."""
        with self._changing():
            while self._launched is not None:
                self._take_launched(plan_ahead=False)
            if self.ledger.has_pending:
                releases = self.ledger.take_releases()
                self.runner.apply_releases(releases, self.ledger.take_transfers())

    def _record(self, plan: StepPlan) -> StepMetrics:
        self.steps += 1
        full, swa = self.ledger.available()
        ps = self.sizes.page_size
        total_full = self.ledger.primary_pages * ps
        total_swa = (
            self.ledger.swa_pages
            if self.sizes.mode is PoolMode.HYBRID
            else self.ledger.primary_pages
        ) * ps
        c = self.cache
        tier = getattr(c, "tier", None)
        loads = [t for t in plan.memory.transfers if t.kind == "load"]
        m = StepMetrics(
            step=self.steps,
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
            host_loaded=tuple(sum(len(t.slots) for t in loads if t.pool == p) for p in POOLS),
            host_used=(tier.full.used * ps, tier.swa.used * ps) if tier else (0, 0),
        )
        self.metrics.append(m)
        return m


def _decode_steps(options: EngineOptions, runner, draft) -> int:
    """Multi-step decode's N: the option, else the runner's default; 1 where no round runs
    (a runner without rounds, a speculative draft, whose rounds come first)."""
    if not runner.supports_rounds or draft is not None:
        return 1
    return options.decode_steps or runner.default_decode_steps


def _token_ids(prompt) -> list[int]:
    """A prompt as a list of ints; a RequestError names what is not a token id."""
    if isinstance(prompt, str | bytes) or not hasattr(prompt, "__len__"):
        raise RequestError(
            f"the prompt must be a sequence of token ids, got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise RequestError("the prompt is empty")
    for i, t in enumerate(prompt):
        if not is_int(t) or t < 0:
            raise RequestError(f"prompt[{i}] = {t!r} is not a token id (an integer >= 0)")
    return [int(t) for t in prompt]


def request_capacity(sizes: PoolSizes, chunk_size: int | None) -> int:
    """Most tokens one request can ever hold: the full pool, or the SWA pool where a request's
    whole prefill must fit in it at once (all-SWA pools, or hybrid pools without chunking)."""
    mode = sizes.mode
    if mode is PoolMode.ALL_SWA or (mode is PoolMode.HYBRID and chunk_size is None):
        return min(sizes.full_tokens or sizes.swa_tokens, sizes.swa_tokens)
    return sizes.full_tokens


def resolve_context(options: EngineOptions, sizes: PoolSizes) -> EngineOptions:
    """`max_context=None` made concrete: as long as one request can hold, a page kept spare."""
    if options.max_context is not None:
        return options
    hold = request_capacity(sizes, options.chunk_size) - sizes.page_size
    return dataclasses.replace(options, max_context=max(1, hold))


def _check_setup(model, draft, options: EngineOptions, sizes: PoolSizes) -> None:
    if options.max_context is None:
        raise RequestError("max_context is None: resolve it first (serving.engine.resolve_context)")
    if options.chunk_size is not None and options.chunk_size < sizes.page_size:
        raise RequestError(
            f"chunk_size {options.chunk_size} is smaller than the page size "
            f"{sizes.page_size}: a chunk must hold at least one page"
        )
    _check_draft(model, draft, options.num_speculative_tokens, sizes)


def _check_draft(model, draft, k: int, sizes: PoolSizes) -> None:
    """A draft that can share the target's slots, or a clear error."""
    if draft is None:
        if k and model.needs_kv:
            raise ValueError(f"num_speculative_tokens={k} needs a draft model (Engine(draft=...))")
        return
    if not k:
        raise ValueError("a draft model needs num_speculative_tokens >= 1")
    if model.fused_forward is None or draft.fused_forward is None:
        raise ValueError("speculative decoding needs models in the fused step (with KV)")
    if model.state_sharding != draft.state_sharding:
        raise ValueError("the draft must be placed like the target (the same mesh, or none)")
    if draft.vocab_size != model.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({draft.vocab_size}) differs from the target's "
            f"({model.vocab_size}): its tokens could not be verified"
        )
    if sizes.mode is PoolMode.ALL_SWA and draft.spec.hybrid.full_layer_ids:
        raise ValueError("the target's pools are all-SWA: a draft with full layers has no room")
