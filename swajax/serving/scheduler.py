"""Scheduling with two budgets: admission, chunked prefill, decode memory, retraction, abort.

Host code (no JAX). `schedule()` plans a step: an extend batch (new requests and prefill chunks)
or a decode batch (every decoding request), with its evictions and releases queued on the
ledger; `postprocess(plan, result)` takes the device's answer: new slots, sampled tokens,
finishing and caching. The scheduler owns every `Request` mutation and every prefix-cache call.

Admission checks the full budget (`rem_total`: free + evictable full tokens, less what running
requests will still generate) and the SWA budget (`rem_swa`: free + evictable SWA tokens) as in
spec §9, from the ledger's host mirror of the free counts; see BUILD_NOTES.md for where we depart.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from swajax.arith import ceil_div, round_up
from swajax.serving import overlap, progress, results, rounds, tail_rebuild, window as win
from swajax.serving.batch import Batch, PoolMode, StepKind, StepPlan, StepResult
from swajax.serving.budget import CLIP_MAX_NEW_TOKENS, Budget, make_budget
from swajax.serving.ledger import PoolLedger
from swajax.serving.options import EngineOptions, SchedulerConfig
from swajax.serving.planning import build_plan
from swajax.serving.request import Request, Status


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, options: EngineOptions, cache, ledger: PoolLedger):
        self.cfg, self.options, self.cache, self.ledger = cfg, options, cache, ledger
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_rows = list(range(options.max_running - 1, -1, -1))
        self.retractions = 0
        self.swa_freed_tokens = 0  # out-of-window SWA KV given back by runtime eviction
        # Per admission (a refused attempt's match does not count): cached / all tokens.
        self.hit_tokens = self.admitted_tokens = self.tail_miss_tokens = 0
        # Tail rebuilds: tokens recomputed to rebuild SWA KV the tree lacked, and tokens the
        # fallback would have recomputed on top of those.
        self.rebuilt_tokens = self.rebuild_saved_tokens = 0
        self.accepted_tokens = 0  # draft tokens kept by speculative rounds
        self.dropped_tokens = 0  # overlap: tokens of requests that ended while a step ran

    @property
    def separate_swa(self) -> bool:
        return self.cfg.pool_mode is PoolMode.HYBRID and self.cfg.window > 0

    def budget(self) -> Budget:
        return make_budget(
            self.cfg, self.options, self.ledger, self.cache, self.running, self.separate_swa
        )

    def _charge(self, budget: Budget, n: int, max_new: int) -> None:
        budget.charge(n, max_new, page_size=self.cfg.page_size, window=self.cfg.window)

    # ------------------------------------------------------------------------------------------
    # Building a batch

    def _build(self) -> Batch | None:
        """Prefill work first (chunks in flight, then new requests in order), else decode; an
        empty extend batch if nothing fits the budgets; None only if nothing is in flight.

        A *suspect* (a request whose batch raised) runs alone until it finishes, so a request
        that keeps failing is found and aborted without taking the others with it."""
        if not self.running and not self.waiting:
            return None
        suspect = progress.suspect_batch(self)
        if suspect is not None:
            return suspect
        budget = self.budget()
        reqs, lens = [], []
        for req in self.running:
            if not req.decoding and req.pending > 0:
                n = self._continue(req, budget)
                if n:
                    reqs.append(req)
                    lens.append(n)
        while self.waiting and len(self.running) < self.options.max_running:
            if not self.waiting[0].startable:  # in order: it waits for its prompt's prefill
                break
            n = self.admit(self.waiting[0], budget)
            if not n:
                break
            req = self.waiting[0]
            self.start(req)
            reqs.append(req)
            lens.append(n)
        if reqs:
            return Batch(StepKind.EXTEND, reqs, lens)
        decode = self._decode_batch()
        return decode if decode.reqs else Batch(StepKind.EXTEND, [], [])

    def _decode_batch(self) -> Batch:
        decoding = [r for r in self.running if r.decoding and not r.suspect]
        return Batch(StepKind.DECODE, decoding, rounds.decode_lens(self, decoding))

    def schedule(self) -> StepPlan | None:
        """Plan the next step: choose the batch, evict out-of-window SWA, make the batch fit. If
        no prefill work fits, decode instead (finishing requests frees memory); if nothing can
        run, retract the newest prefill. None: nothing to run (a plan may hold no request when
        the step only retracted or aborted)."""
        batch = self._build()
        if batch is None:
            return None
        self.evict_windows(batch)
        batch = self.fit(batch)
        if not batch.reqs and batch.kind is StepKind.EXTEND:
            decode = self._decode_batch()
            if decode.reqs:
                self.evict_windows(decode)
                batch = self.fit(decode)
            else:
                batch = progress.force(self)
        plan = build_plan(
            batch,
            self.ledger.take_releases(),
            speculative=self.options.num_speculative_tokens > 0,
            transfers=self.ledger.take_transfers(),
            round_steps=self.cfg.decode_steps,
        )
        for req in batch.reqs:
            req.stale = None  # the plan re-points the row
            req.penalties_seeded = True  # and loads its token counts, if it has penalties
        return plan

    def _continue(self, req: Request, budget: Budget) -> int:
        if budget.rem_chunk is None:
            n = req.pending
        else:
            n = win.chunk_continue_len(
                req.pending,
                rem_chunk=budget.rem_chunk,
                rem_total=budget.rem_total,
                rem_swa=budget.rem_swa,
                page_size=self.cfg.page_size,
            )
        if req.rebuild is not None:
            n = tail_rebuild.cut(n, req.rebuild, req.kv_len)
        if n:
            last = n == req.pending
            self._charge(budget, n, self._max_new(req) if last else 0)
        return n

    def _max_new(self, req: Request) -> int:
        return min(req.params.max_tokens - len(req.output), CLIP_MAX_NEW_TOKENS)

    def admit(self, req: Request, budget: Budget) -> int:
        """Match, check both budgets, lock; the first chunk's length, or 0 to stop admitting."""
        ps, tokens = self.cfg.page_size, req.tokens
        # Compute at least one token (all of them for a request that takes no cached prefix).
        match = self.cache.match(tokens[: len(tokens) - 1 if req.cache_hits else 0])
        hit, slots, node, rebuild = len(match), match.slots, match.node, None
        budget.take_loaded(*match.loaded)  # brought back from a host tier: held from now on
        if self.cfg.rebuild_reach is not None and match.tail_node is not None:
            rebuild = tail_rebuild.plan(
                match, reach=self.cfg.rebuild_reach, window=self.cfg.window, page_size=ps
            )
            if rebuild is not None:  # resume at s0, holding the full KV up to L
                hit, node = rebuild.start, match.tail_node
                slots = np.concatenate([slots, match.tail[: hit - len(slots)]])
        extend, max_new = len(tokens) - hit, self._max_new(req)
        # Locking the hit takes its unlocked prefix out of the evictable tokens the budget
        # counted (with a host tier a hit's own prefix could be all of them: the request was
        # admitted, nothing fit, it was retracted, and so on, step after step).
        held = self.cache.lock_cost(node)
        if round_up(extend, ps) + max_new + ps + held >= budget.rem_total and self.running:
            return 0
        limit = budget.rem_chunk
        if budget.rem_swa is not None:
            need = win.swa_budget_for_req(
                round_up(extend, ps), window=self.cfg.window, page_size=ps, rem_chunk=limit
            )
            if need >= budget.rem_swa:
                cap = (budget.rem_swa - self.cfg.window - ps) // ps * ps
                if limit is None or cap <= 0:
                    return 0
                limit = min(limit, cap)
        n = extend if limit is None or extend <= limit else (hit + limit) // ps * ps - hit
        if rebuild is not None:
            n = tail_rebuild.cut(n, rebuild, hit)
        if n <= 0:
            return 0
        req.handle = self.cache.lock(node)
        budget.rem_total -= held
        req.cached_tokens = hit
        self.hit_tokens += hit
        self.tail_miss_tokens += match.tail_miss
        self.admitted_tokens += len(tokens)
        req.append_slots(slots)
        req.stale = (0, hit) if hit else None
        req.cache_protected_len = hit
        req.swa_branching_seqlen, req.rebuild = None, rebuild
        if rebuild is not None:
            self.rebuilt_tokens += rebuild.end - rebuild.start
            self.rebuild_saved_tokens += rebuild.saved
        elif self.cfg.policy.branch_insert and match.full_length > hit:
            req.swa_branching_seqlen = match.full_length
        self._charge(budget, n, max_new if n == extend else 0)
        return n

    # ------------------------------------------------------------------------------------------
    # Memory for a batch

    def evict_windows(self, batch: Batch, *, due: bool = False) -> None:
        """Runtime SWA eviction before a batch (decode: once enough has piled up, or now if
        `due`: the interval amortizes frees, it must not stop a decode that needs the room)."""
        if not self.cfg.window or self.cfg.pool_mode is PoolMode.SINGLE:
            return
        for req in batch.reqs:
            if req.kv_len == 0:
                continue
            if req.handle is not None and req.kv_len - self.cfg.window >= req.cache_protected_len:
                # The next query no longer reads the cached prefix: its window lock can go.
                self.cache.release_swa(req.handle)
            start, end = self._frontier(req)
            if (
                batch.kind is StepKind.DECODE
                and not due
                and not win.decode_eviction_due(start, end, self.options.eviction_interval)
            ):
                continue
            if batch.kind is StepKind.EXTEND and self.options.prefix_cache:
                continue  # the tree owns inserted chunks; only decode evicts with a radix cache
            self.free_window(req, start, end)

    def evict_request_window(self, req: Request) -> None:
        """Free one request's out-of-window SWA KV now (the eager-window-free policy, at a
        chunk checkpoint: the chunk then enters the tree as tombstones plus one window)."""
        # Hybrid pools only: SGLang's all-SWA path is a plain tree without tombstones (spec
        # §16.7), and an all-SWA tombstone would hold slots its pool already handed out again.
        if self.cfg.window and self.cfg.pool_mode is PoolMode.HYBRID:
            self.free_window(req, *self._frontier(req))

    def _frontier(self, req: Request) -> tuple[int, int]:
        return win.eviction_frontier(
            req.kv_len,
            window=self.cfg.window,
            page_size=self.cfg.page_size,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            chunk_cache=not self.options.prefix_cache,
            ceil_align=self.cfg.policy.frontier_ceil_align,
        )

    def free_window(self, req: Request, start: int, end: int) -> None:
        if end > start:
            self.ledger.free_swa(req.slots[start : end : self.cfg.page_size])
            self.swa_freed_tokens += end - start
        req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, end)

    def _pages_needed(self, batch: Batch) -> int:
        ps = self.cfg.page_size
        return sum(
            (ceil_div(r.kv_len + n, ps) - ceil_div(r.kv_len, ps)) * ps
            for r, n in zip(batch.reqs, batch.lens)
        )

    def _shrink_to_fit(self, batch: Batch) -> None:
        """Keep the requests that fit in order; with chunked prefill, cut the first one that does
        not to the room left (the budget is an estimate; the pools decide)."""
        ps = self.cfg.page_size
        full, swa = self.ledger.available()
        room = min(full, swa) // ps * ps
        reqs, lens = [], []
        for req, n in zip(batch.reqs, batch.lens):
            tail = round_up(req.kv_len, ps) - req.kv_len  # free slots on its last page
            pages = round_up(max(n - tail, 0), ps)
            if pages > room:
                n = min(n, tail + room) if self.options.chunk_size is not None else 0
                pages = room
            if n <= 0:
                break
            reqs.append(req)
            lens.append(n)
            room -= pages
        batch.reqs, batch.lens = reqs, lens

    def _fits(self, tokens: int) -> bool:
        full, swa = self.ledger.available()
        if full >= tokens and swa >= tokens:
            return True
        self.cache.evict(max(0, tokens - full), max(0, tokens - swa))
        full, swa = self.ledger.available()
        return full >= tokens and swa >= tokens

    def fit(self, batch: Batch) -> Batch:
        """Make the batch's new tokens fit both pools (evicting cached KV first); retract
        (decode) or shrink (extend) what cannot."""
        if batch.kind is StepKind.EXTEND and not self._fits(self._pages_needed(batch)):
            self._shrink_to_fit(batch)
        if batch.kind is StepKind.DECODE and not self._fits(self._pages_needed(batch)):
            self.evict_windows(batch, due=True)
        multi_step = max(batch.lens, default=1) > 1 and not self.options.num_speculative_tokens
        if multi_step and not self._fits(self._pages_needed(batch)):
            batch.lens = [1] * len(batch.lens)  # a round is never worth a retraction
        while (
            batch.kind is StepKind.DECODE
            and batch.reqs
            and not self._fits(self._pages_needed(batch))
        ):
            if len(self.running) > 1:
                victim = min(self.running, key=lambda r: (len(r.output), -len(r.prompt), -r.rid))
                self.retract(victim)
                if victim in batch.reqs:
                    i = batch.reqs.index(victim)
                    del batch.reqs[i], batch.lens[i]
            else:
                full, swa = self.ledger.available()
                self.abort(
                    batch.reqs[0],
                    f"out of memory: a decode step needs {self._pages_needed(batch)} tokens of "
                    f"each pool, the pools have (full {full}, SWA {swa}) free after evicting the "
                    "prefix cache and out-of-window SWA",
                )
                batch.reqs, batch.lens = [], []
        return batch

    # ------------------------------------------------------------------------------------------
    # The plan and the device's answer

    def postprocess(self, plan: StepPlan, result: StepResult, launched=None) -> None:
        """Take a step's result: new slots, logits kept, sampled tokens, finishing, caching.
        `launched`: the step already launched after it (overlap scheduling), if any."""
        results.take(self, plan, result, launched)

    def plan_ahead(self, prev: StepPlan) -> StepPlan | None:
        """Plan the decode step after `prev` while `prev` runs; None: take the plain path."""
        return overlap.plan_ahead(self, prev)

    def step_failed(self, plan: StepPlan, error: Exception) -> None:
        """The step raised before its result was taken; see `results.failed`."""
        results.failed(self, plan, error)

    # ------------------------------------------------------------------------------------------
    # Leaving

    def _release_row(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        if req.row is not None:
            self.free_rows.append(req.row)

    def _requeue(self, req: Request) -> None:
        self._release_row(req)
        req.reset_kv()
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def _hand_over(self, req: Request, insert: bool) -> None:
        """Give the request's KV to the prefix cache (insert) or back to the pools, and unlock."""
        if insert:
            tail_rebuild.settle(self, req)
        self.cache.cache_finished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
            insert=insert,
        )
        req.handle = None

    def start(self, req: Request) -> None:
        """The head of the queue, just admitted, starts running in a free row."""
        assert self.waiting[0] is req
        self.waiting.popleft()
        req.status, req.row = Status.RUNNING, self.free_rows.pop()
        self.running.append(req)

    def retract(self, req: Request, *, suspect: bool = False) -> None:
        """Give back all of a running request's KV and requeue it at the front; it recomputes
        its prompt and output later and goes on exactly where it stopped. A `suspect` (its
        step failed) runs alone from then on."""
        self._hand_over(req, insert=False)
        self._requeue(req)
        req.retractions += 1
        self.retractions += 1
        if suspect:
            req.suspect = True

    def finish(self, req: Request, reason: str) -> None:
        """Cache a finished request's KV (its last sampled token has none) and release it."""
        self._hand_over(req, insert=True)
        self._release_row(req)
        req.status, req.finish_reason = Status.FINISHED, reason

    def abort(self, req: Request, reason: str = "aborted") -> None:
        """Stop a request in any state, giving back everything it holds."""
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        elif req.status is Status.RUNNING:
            self._hand_over(req, insert=False)
            self._release_row(req)
        else:
            return
        req.reset_kv()
        req.status, req.finish_reason = Status.ABORTED, reason
