"""Scheduling with two budgets: admission, chunked prefill, decode memory, retraction, abort.

Host code (no JAX). `schedule()` plans a step: an extend batch (new requests and prefill chunks)
or a decode batch (every decoding request, or a round of several positions each), with its
evictions and releases queued on the ledger; `plan_ahead(prev)` plans the decode step after one
still running (overlap scheduling); `postprocess(plan, result)` takes the device's answer: new
slots, sampled tokens, finishing and caching; `step_failed` handles a step that raised. The
scheduler owns every `Request` mutation and every prefix-cache call: the whole lifecycle is this
one class. What it computes without touching a request (the plan's arrays, the window's
frontier, the budgets, a tail rebuild's plan, a plan launched ahead) are functions beside it
(`planning`, `window`, `budget`, `tail_rebuild`, `overlap`).

Admission checks the full budget (`rem_total`: free + evictable full tokens, less what running
requests will still generate) and the SWA budget (`rem_swa`: free + evictable SWA tokens) as in
spec §9, from the ledger's host mirror of the free counts; see BUILD_NOTES.md for where we depart.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque

import numpy as np

from swajax.arith import ceil_div, round_up
from swajax.prefix_cache import explain
from swajax.prefix_cache.explain import MatchReport
from swajax.prefix_cache.requests import branch_end
from swajax.serving import overlap, tail_rebuild, window as win
from swajax.serving.batch import Batch, PoolMode, StepKind, StepPlan, StepResult
from swajax.serving.budget import CLIP_MAX_NEW_TOKENS, Budget, make_budget
from swajax.serving.ledger import PoolLedger
from swajax.serving.options import EngineOptions, SchedulerConfig
from swajax.serving.planning import build_plan
from swajax.serving.request import Request, Status, TopN
from swajax.serving.token_rules import needs_history


class StepFailed(RuntimeError):
    """The device refused a step the host had checked (a bookkeeping bug, never bad input)."""


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
        # Per admission: prompt tokens the prefix cache did not supply, by why (explain.py).
        self.missed_tokens = dict.fromkeys(explain.REASONS, 0)
        self.accepted_tokens = 0  # draft tokens kept by speculative rounds
        self.draft_tokens = 0  # draft tokens proposed (k per request and round)
        self.acceptance: Counter[int] = Counter()  # request-rounds by proposals accepted
        self.dropped_tokens = 0  # overlap: tokens of requests that ended while a step ran

    @property
    def prefill_floor(self) -> bool:
        """The prefill-floor rule holds (policy.py): an all-SWA pool with a radix cache."""
        return self.options.prefix_cache and self.cfg.policy.floors_prefills(self.cfg.pool_mode)

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
        suspect = self._suspect_batch()
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
        return Batch(StepKind.DECODE, decoding, self._decode_lens(decoding))

    def _decode_lens(self, decoding: list[Request]) -> list[int]:
        """Each decoding request's positions this step (BUILD_NOTES.md, "Multi-step decode").
        With a draft, k + 1 (a verify round). Multi-step decode: up to N =
        `SchedulerConfig.decode_steps`, each request no more than it has tokens left (the
        round's program is N's whatever each takes: one program per batch size); only when
        every running request decodes and nothing waits (admission is settled) and none asks
        for what a round does not return (penalties, top-N logprobs, kept logits). Otherwise
        one each."""
        k, one = self.options.num_speculative_tokens, [1] * len(decoding)
        if k:
            return [1 + k] * len(decoding)
        if len(decoding) != len(self.running) or not self._rounds_allowed(decoding):
            return one
        cap = self.cfg.decode_steps
        return [max(1, min(cap, r.params.max_tokens - len(r.output))) for r in decoding]

    def _rounds_allowed(self, reqs) -> bool:
        """Whether `reqs` (every running request, all decoding) may run a multi-step round: the
        setting allows one, nothing waits, none asks for what a round does not return."""
        if self.cfg.decode_steps <= 1 or self.options.num_speculative_tokens or self.waiting:
            return False
        return not any(
            r.keep_logits or r.params.penalized or r.params.logprobs or needs_history(r.params)
            for r in reqs
        )

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
                batch = self._force()
        plan = build_plan(
            batch,
            self.ledger.take_releases(),
            speculative=self.options.num_speculative_tokens > 0,
            transfers=self.ledger.take_transfers(),
            round_steps=self.cfg.decode_steps,
        )
        floors = self.prefill_floor and batch.kind is StepKind.EXTEND
        for req, seq in zip(batch.reqs, plan.seq_lens.tolist()):
            req.stale = None  # the plan re-points the row
            req.penalties_seeded = True  # and loads its token counts, if it has penalties
            if floors:
                req.swa_evict_floor = seq  # where this prefill chunk ends
        return plan

    # ------------------------------------------------------------------------------------------
    # The progress guarantee (BUILD_NOTES.md, "Progress guarantee and atomic steps"): what runs
    # when the budgets stop everything, and how a suspect (a request whose step raised) runs
    # alone.

    def _suspect_batch(self) -> Batch | None:
        """The oldest suspect's next step, alone (None when there is no suspect to run)."""
        running = [r for r in self.running if r.suspect]
        if running:
            req = min(running, key=lambda r: r.rid)
            if req.decoding:
                return Batch(StepKind.DECODE, [req], [1 + self.options.num_speculative_tokens])
            return Batch(StepKind.EXTEND, [req], [self._chunk_len(req)])
        if (
            self.waiting
            and self.waiting[0].suspect
            and len(self.running) < self.options.max_running
        ):
            return self._force_admit()
        return None

    def _chunk_len(self, req: Request) -> int:
        chunk = self.options.chunk_size
        return req.pending if chunk is None else min(req.pending, chunk)

    def _force_admit(self) -> Batch:
        """Admit the head of the queue whatever the budgets say (the pools decide in `fit`)."""
        unlimited = Budget(2**62, 2**62 if self.separate_swa else None, self.options.chunk_size)
        req = self.waiting[0]
        n = self.admit(req, unlimited)
        self.start(req)
        return Batch(StepKind.EXTEND, [req], [n])

    def _force(self) -> Batch:
        """The budgets are estimates; when they park every prefill and nothing decodes, the
        oldest prefill (or, with none running, the head of the queue) gets a chunk of what the
        pools physically hold. If not one page fits, the newest other request is retracted; a
        request alone that still cannot fit is aborted with the numbers."""
        prefills = [r for r in self.running if r.pending > 0]
        if prefills:
            req = min(prefills, key=lambda r: r.rid)
            batch = Batch(StepKind.EXTEND, [req], [self._chunk_len(req)])
        elif self.waiting and len(self.running) < self.options.max_running:
            batch = self._force_admit()
            req = batch.reqs[0]
        else:
            raise RuntimeError(
                f"no progress possible: {len(self.running)} running, {len(self.waiting)} waiting"
            )
        need = batch.lens[0]
        self.evict_windows(batch)
        batch = self.fit(batch)
        if batch.reqs:
            return batch
        others = [r for r in self.running if r is not req]
        if others:
            self.retract(max(others, key=lambda r: r.rid))
        else:
            full, swa = self.ledger.available()
            self.abort(
                req,
                f"out of memory: {need} more tokens do not fit in the free pools "
                f"(full {full}, SWA {swa} tokens free after evicting the prefix cache)",
            )
        return batch

    # ------------------------------------------------------------------------------------------
    # Admission

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
        req.cache_report = self._report(req, match, rebuild)
        self.missed_tokens[req.cache_report.stop] += req.cache_report.missed
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

    def _report(self, req: Request, match, rebuild) -> MatchReport:
        """The match's explanation, with what a tail rebuild recovered; a request that takes
        no cached prefix (its prompt's logits are wanted) is the policy's."""
        if not req.cache_hits:
            n = len(req.tokens) - 1
            return MatchReport(n, n, 0, 0, explain.POLICY)
        rebuilt = 0 if rebuild is None else rebuild.start - len(match)
        return dataclasses.replace(match.report, rebuilt=rebuilt)

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
            swa_evict_floor=req.swa_evict_floor,
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
    # Planning ahead (overlap scheduling)

    def plan_ahead(self, prev: StepPlan) -> StepPlan | None:
        """Overlap scheduling (`overlap.py` says why nothing the device may still read is freed
        early): the decode step after `prev` (still running; a plain step or a multi-step
        round), planned before its result is read, or None to take the plain path. It is a
        round when the scheduler would run one."""
        if (
            prev.kind is not StepKind.DECODE
            or prev.round.speculative
            or prev.sampling.return_logits
        ):
            return None
        ahead = set(map(id, prev.requests))
        if self.waiting or any(
            id(r) not in ahead
            or r.suspect
            or not r.decoding
            or r.stale is not None
            or needs_history(r.params)  # its bad words read the token step n samples
            for r in self.running
        ):
            return None
        # After step n each request has n_r more positions and tokens (not known yet).
        taken = (prev.seq_lens - prev.prefix_lens).tolist()
        after = [
            (r, n)
            for r, n in zip(prev.requests, taken)
            if r.status is Status.RUNNING and overlap.left(r, n) > 0
        ]
        if not after:
            return None
        reqs, done = [r for r, _ in after], [n for _, n in after]
        lens = [1] * len(reqs)
        if self._rounds_allowed(reqs):
            lens = [min(self.cfg.decode_steps, overlap.left(r, n)) for r, n in after]
        ps = self.cfg.page_size
        need = overlap.new_pages(prev.prefix_lens, taken, ps)  # step n's, not yet counted
        need += overlap.new_pages((r.kv_len + n for r, n in after), lens, ps)
        if need > min(self.ledger.available()):
            return None  # evicting or retracting to fit: the plain path decides that
        batch = Batch(StepKind.DECODE, reqs, lens)
        self.evict_windows(batch)  # from the confirmed lengths: one step behind, never too far
        releases = self.ledger.take_releases()
        steps = self.cfg.decode_steps if max(lens) > 1 else 1
        plan = overlap.build(reqs, done, lens, steps, prev, releases, self.ledger.taken)
        # An early window release may have copied a window to a host tier.
        memory = dataclasses.replace(plan.memory, transfers=self.ledger.take_transfers())
        return dataclasses.replace(plan, memory=memory)

    # ------------------------------------------------------------------------------------------
    # Taking a step's result

    def postprocess(
        self, plan: StepPlan, result: StepResult, launched: StepPlan | None = None
    ) -> None:
        """Take a step's result: new slots, logits kept, sampled tokens, finishing, caching.
        `launched`: a step launched since (overlap scheduling), whose releases the host counted
        but the device has not applied yet."""
        if result.status != 0:
            raise StepFailed(
                f"allocation failed with status {result.status} after the pools were checked"
            )
        plan, result, extra = self._without_ended(plan, result)
        self.ledger.allocated(result.slots)
        if len(extra):
            self.ledger.allocated(extra)
        in_flight = launched.memory.released if launched is not None else (0, 0)
        self.ledger.check(result.free_full, result.free_swa, in_flight)
        if len(extra):
            self.ledger.free(extra)
        if plan.round.lookahead:
            self._take_round(plan, result)
            return
        start, row, sampled = 0, 0, []
        for req, pre, seq in zip(plan.requests, plan.prefix_lens, plan.seq_lens):
            n = int(seq - pre)
            req.append_slots(result.slots[start : start + n])
            start += n
            if req.keep_logits:
                # A tail rebuild's positions before its end are inexact by design: they count
                # as cached, so their logits are not kept.
                skip = 0 if req.rebuild is None else min(n, max(0, req.rebuild.end - int(pre)))
                req.add_logits(result.logits[row + skip : row + n])
                row += n
            if req.kv_len == req.num_tokens:
                row += not req.keep_logits
                sampled.append(req)
        tops = _top_logprobs(sampled, result)
        for req, token, logprob, top in zip(
            sampled, result.tokens.tolist(), result.logprobs.tolist(), tops
        ):
            self._guarded(req, self._take_token, req, token, logprob, top)
        last_chunk = self.cfg.policy.checkpoint_last_chunk
        for req in plan.requests:
            if req.status is not Status.RUNNING or not self.options.prefix_cache:
                continue
            # A chunk checkpoint between prefill chunks; SGLang also takes one after the last
            # (a retracted request's recomputation included), and so does the first of n
            # samples (the others take the prompt's KV from the cache).
            after_last = (
                req in sampled
                and plan.kind is not StepKind.DECODE
                and (last_chunk or (req.leads and len(req.output) == 1))
            )
            if not req.decoding or after_last:
                self._guarded(req, self._cache_chunk, req)

    def _without_ended(self, plan: StepPlan, result: StepResult):
        """A decode step or round launched ahead may carry requests that ended while it ran (a
        stop token in the step before, an abort): their tokens are dropped, and the new pages
        their positions took, if any, are returned as `extra` (slots inside a page the request
        held went back with the page)."""
        ended = np.asarray([r.status is not Status.RUNNING for r in plan.requests], bool)
        if not ended.any():
            return plan, result, result.slots[:0]
        if plan.kind is not StepKind.DECODE or plan.round.speculative:
            raise StepFailed("only a decode step or round can outlive one of its requests")
        keep = ~ended
        self.dropped_tokens += int((plan.seq_lens - plan.prefix_lens)[ended].sum())
        fresh = plan.fresh_slots(result.slots, self.cfg.page_size)
        extra = [seg for seg, e in zip(fresh, ended) if e]
        slots = [seg for seg, k in zip(plan.new_slots(result.slots), keep) if k]
        plan = dataclasses.replace(
            plan,
            requests=tuple(r for r, k in zip(plan.requests, keep) if k),
            prefix_lens=plan.prefix_lens[keep],
            seq_lens=plan.seq_lens[keep],
        )
        rows = dict(tokens=result.tokens[keep], logprobs=result.logprobs[keep])
        if result.top_ids is not None:
            rows.update(top_ids=result.top_ids[keep], top_logprobs=result.top_logprobs[keep])
        if result.accepted is not None:
            rows.update(accepted=result.accepted[keep])
        empty = result.slots[:0]
        result = dataclasses.replace(result, slots=np.concatenate([empty, *slots]), **rows)
        return plan, result, np.concatenate([empty, *extra])

    def _take_round(self, plan: StepPlan, result: StepResult) -> None:
        """Take a round's result: a speculative verify round, or a multi-step decode round whose
        every step is kept up to a stop.

        The round allocated n positions [p, p + n) per request in both pools (a verify round:
        k + 1); the device returns the target's token at each position and how many of the
        round's tokens after the first it accepted (a). The request keeps a + 1 new tokens
        (fewer if a stop token or its length limit comes first): their KV positions are
        [p, p + m), and the pages holding only rejected positions go back to both pools at
        once. A page shared with a kept position stays with the request; the next allocation
        continues inside it (`last_loc`), so no slot is handed out twice. Nothing rejected is
        ever inserted in the prefix cache: the request's slots and length never include it."""
        ps, n = self.cfg.page_size, plan.seq_lens - plan.prefix_lens  # positions per request
        for i, (req, start) in enumerate(zip(plan.requests, np.cumsum(n) - n)):
            slots = result.slots[start : start + n[i]]
            new = result.tokens[i, : int(result.accepted[i]) + 1].tolist()
            m = kept(req, new)
            p = req.kv_len
            req.append_slots(slots[:m])
            own = round_up(p + m, ps) - p  # positions on pages that hold a kept position
            if own < len(slots):
                self.ledger.free(slots[own:])
            if plan.round.speculative:
                self.accepted_tokens += m - 1
                a = int(result.accepted[i])  # what the draw accepted, before any stop
                req.spec_drafted += plan.round.lookahead
                req.spec_accepted += a
                self.draft_tokens += plan.round.lookahead
                self.acceptance[a] += 1
            if req.keep_logits:
                req.add_logits(result.logits[i, :m])
            tops = [None] * m
            if result.top_ids is not None and req.params.logprobs:
                n_top = req.params.logprobs
                ids = result.top_ids[i, :m, :n_top].tolist()
                lps = result.top_logprobs[i, :m, :n_top].tolist()
                ranks = result.top_ids[i, :m, -1].tolist()  # (the sampled tokens' ranks)
                tops = [TopN.of(a, b, rank) for a, b, rank in zip(ids, lps, ranks)]
            for token, logprob, top in zip(new[:m], result.logprobs[i, :m].tolist(), tops):
                if req.status is Status.RUNNING:  # a round's tokens after a finish are dropped
                    self._guarded(req, self._take_token, req, token, logprob, top)

    def _guarded(self, req: Request, fn, *args) -> None:
        """Run one request's part of a step; if it raises, that request fails, not the step."""
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - reported on the request, never dropped
            if req.status is Status.RUNNING:
                self.abort(req, f"error: {type(error).__name__}: {error}")

    def _take_token(
        self, req: Request, token: int, logprob: float, top: dict | None = None
    ) -> None:
        if math.isnan(logprob):  # NaN logits: the sampled token means nothing
            self.abort(
                req,
                f"error: the model's logits are NaN at position {req.num_tokens} "
                "(non-finite weights or an overflow in the compute dtype)",
            )
            return
        req.take_token(token, logprob, top)
        if _stops(req, token, len(req.output)):
            self.finish(req, "stop")
        elif len(req.output) >= req.params.max_tokens:
            self.finish(req, "length")

    def _cache_chunk(self, req: Request) -> None:
        """Between chunks of a prefill: insert what is computed so far and use the cache's
        slots. Policies: free the out-of-window SWA KV first (eager window free); the cache
        ends the insert at the request's branch point (branch insert)."""
        if not self._before_checkpoint(req):
            return
        if self.cfg.policy.eager_window_free:
            self.evict_request_window(req)
        branching = self._branch_taken(req)
        prefix, handle = self.cache.cache_unfinished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
            swa_branching_seqlen=branching,
        )
        req.checkpointed(prefix, handle)

    def _branch_taken(self, req: Request) -> int | None:
        """The request's branch point for the insert it is about to make, dropped from the
        request if that insert reaches it (`prefix_cache.requests.branch_end`)."""
        branching = req.swa_branching_seqlen
        if (
            branch_end(
                req.kv_len // self.cfg.page_size * self.cfg.page_size,
                req.cache_protected_len,
                branching,
            )
            is not None
        ):
            req.swa_branching_seqlen = None
        return branching

    def step_failed(self, plan: StepPlan, error: Exception) -> None:
        """The step raised before its result was taken (the runner rolled its allocation
        back): retract its requests as suspects, which then run alone; a suspect that fails
        alone is aborted with the error."""
        alone = len(plan.requests) == 1
        for req in plan.requests:
            if req.status is not Status.RUNNING:
                continue
            if alone and req.suspect:
                self.abort(req, f"error: {type(error).__name__}: {error}")
            else:
                self.retract(req, suspect=True)

    # ------------------------------------------------------------------------------------------
    # A tail rebuild's request (`tail_rebuild.py` says what keeps it exact)

    def _settle(self, req: Request) -> None:
        """The request has computed up to L: free its SWA KV below `exact_from` (out of every
        window by now), so what it inserts is exact; it is an ordinary request from here on."""
        rebuild = req.rebuild
        if rebuild is None or req.kv_len < rebuild.end:
            return
        start = max(req.swa_evicted_seqlen, req.cache_protected_len)  # below s0: the tree's
        self.free_window(req, start, rebuild.exact_from)
        req.rebuild_settled()

    def _before_checkpoint(self, req: Request) -> bool:
        """At a chunk checkpoint: whether the request may insert now. A request still
        rebuilding only frees its own out-of-window SWA KV (the tree already has these
        tokens)."""
        if req.rebuild is None:
            return True
        if req.kv_len < req.rebuild.end:
            self.evict_request_window(req)
            return False
        self._settle(req)
        return True

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
            self._settle(req)
        floor = {"swa_evict_floor": req.swa_evict_floor} if self.prefill_floor else {}
        branching = self._branch_taken(req) if insert else None
        self.cache.cache_finished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
            insert=insert,
            swa_branching_seqlen=branching,
            **floor,
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

    def truncate(self, req: Request, m: int) -> None:
        """Keep the first m output tokens of a running request (a stop string ended it inside
        the tokens of its last round or step): what it had after them goes, and the KV of
        positions after its last kept token goes back to both pools, page by page (the page
        holding a kept position stays with it, as after a round). Nothing after the stop is
        ever cached."""
        if m >= len(req.output):
            return
        del req.output[m:], req.logprobs[m:], req.top_logprobs[m:]
        end = req.num_tokens - 1  # the last kept token has no KV
        if req.kv_len > end:
            whole = round_up(end, self.cfg.page_size)  # positions on pages it keeps
            if whole < req.kv_len:
                self.ledger.free(req.slots[whole:].copy())
            if req.keep_logits:
                del req.logits[max(0, len(req.logits) - (req.kv_len - end)) :]
            req.kv_len = end

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


def kept(req: Request, tokens) -> int:
    """How many of a round's new tokens the request keeps: up to and including the first stop
    token, and no more than its length limit allows."""
    room = req.params.max_tokens - len(req.output)
    for i, token in enumerate(tokens[:room]):
        if _stops(req, token, len(req.output) + i + 1):
            return i + 1
    return min(len(tokens), room)


def _stops(req: Request, token: int, length: int) -> bool:
    """Whether `token`, the output's `length`-th, ends the request: a stop token once the
    output has min_tokens (before that the device bans them; a caller's allowed tokens may
    leave nothing else)."""
    return token in req.params.stop_token_ids and length >= req.params.min_tokens


def _top_logprobs(sampled: list[Request], result: StepResult) -> list:
    """Each sampled request's top-N {token: logprob} (N its own), or None if it asked none."""
    if result.top_ids is None:
        return [None] * len(sampled)
    ids, lps = result.top_ids.tolist(), result.top_logprobs.tolist()
    return [  # (the last column: the sampled token's rank, and its logprob)
        TopN.of(ids[i][: r.params.logprobs], lps[i][: r.params.logprobs], ids[i][-1])
        if r.params.logprobs
        else None
        for i, r in enumerate(sampled)
    ]
