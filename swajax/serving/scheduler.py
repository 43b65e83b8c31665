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

import dataclasses
from collections import deque

import numpy as np

from swajax.serving import window as win
from swajax.serving.batch import ForwardBatch, PoolMode, Repoint, StepKind, StepPlan, StepResult
from swajax.serving.ledger import PoolLedger
from swajax.serving.request import Request, Status

CLIP_MAX_NEW_TOKENS = 4096


@dataclasses.dataclass
class Budget:
    rem_total: int
    rem_swa: int | None  # None: no separate SWA pool
    rem_chunk: int | None  # None: chunked prefill off


@dataclasses.dataclass
class Batch:
    kind: StepKind
    reqs: list[Request]
    lens: list[int]  # new tokens per request


class StepFailed(RuntimeError):
    """The device refused a step the host had checked (a bookkeeping bug, never bad input)."""


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    window: int  # memory window W (0 without local layers)
    pool_mode: PoolMode
    max_running: int
    max_context: int
    chunk_size: int | None = None  # chunked prefill; None = off
    eviction_interval: int = 128
    decode_reserve_ratio: float = 0.5  # share of a running request's remaining tokens reserved
    radix: bool = True


def _ceil_page(n: int, ps: int) -> int:
    return -(-n // ps) * ps


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, cache, ledger: PoolLedger):
        self.cfg, self.cache, self.ledger = cfg, cache, ledger
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_rows = list(range(cfg.max_running - 1, -1, -1))
        self.retractions = 0
        self.swa_freed_tokens = 0  # out-of-window SWA KV given back by runtime eviction
        # Per admission (a refused attempt's match does not count): cached / all tokens.
        self.hit_tokens = self.admitted_tokens = self.tail_miss_tokens = 0

    @property
    def separate_swa(self) -> bool:
        return self.cfg.pool_mode is PoolMode.HYBRID and self.cfg.window > 0

    # ------------------------------------------------------------------------------------------
    # Budgets

    def budget(self) -> Budget:
        full, swa = self.ledger.available()
        reserve = sum(
            min(r.params.max_new_tokens - len(r.output), CLIP_MAX_NEW_TOKENS) for r in self.running
        )
        if self.cfg.pool_mode is PoolMode.ALL_SWA:
            full_budget = swa + self.cache.swa_evictable
        else:
            full_budget = full + self.cache.full_evictable
        rem_total = full_budget - int(reserve * self.cfg.decode_reserve_ratio)
        rem_swa = None
        if self.separate_swa:
            # Unlike SGLang (spec §9.1), also reserve the SWA a running request will still take
            # before its next eviction: up to interval + page_size tokens. Without it, SWA-bound
            # workloads admit too much and then retract in storms.
            # Only decoding requests reserve: a prefilling request's own future decode must not
            # park its next chunk (which once parked every chunk, and the engine stalled).
            grow = self.cfg.eviction_interval + self.cfg.page_size
            swa_reserve = sum(
                min(r.params.max_new_tokens - len(r.output), grow)
                for r in self.running
                if r.decoding
            )
            rem_swa = (
                swa + self.cache.swa_evictable - int(swa_reserve * self.cfg.decode_reserve_ratio)
            )
        return Budget(rem_total, rem_swa, self.cfg.chunk_size)

    def _charge(self, budget: Budget, n: int, max_new: int) -> None:
        ps = self.cfg.page_size
        budget.rem_total -= _ceil_page(n, ps) + max_new + ps
        if budget.rem_swa is not None:
            budget.rem_swa -= win.swa_budget_for_req(
                _ceil_page(n, ps), window=self.cfg.window, page_size=ps, rem_chunk=budget.rem_chunk
            )
        if budget.rem_chunk is not None:
            budget.rem_chunk -= n

    # ------------------------------------------------------------------------------------------
    # Building a batch

    def _build(self) -> Batch | None:
        """Prefill work first (chunks in flight, then new requests in order), else decode; an
        empty extend batch if nothing fits the budgets; None only if nothing is in flight.

        A *suspect* (a request whose batch raised) runs alone until it finishes, so a request
        that keeps failing is found and aborted without taking the others with it."""
        if not self.running and not self.waiting:
            return None
        suspect = self._suspect()
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
        while self.waiting and len(self.running) < self.cfg.max_running:
            n = self._admit(self.waiting[0], budget)
            if not n:
                break
            req = self.waiting.popleft()
            req.status, req.row = Status.RUNNING, self.free_rows.pop()
            self.running.append(req)
            reqs.append(req)
            lens.append(n)
        if reqs:
            return Batch(StepKind.EXTEND, reqs, lens)
        decode = self._decode_batch()
        return decode if decode.reqs else Batch(StepKind.EXTEND, [], [])

    def _decode_batch(self) -> Batch:
        decoding = [r for r in self.running if r.decoding and not r.suspect]
        return Batch(StepKind.DECODE, decoding, [1] * len(decoding))

    def _suspect(self) -> Batch | None:
        """The oldest suspect's next step, alone (None when there is no suspect to run)."""
        running = [r for r in self.running if r.suspect]
        if running:
            req = min(running, key=lambda r: r.rid)
            if req.decoding:
                return Batch(StepKind.DECODE, [req], [1])
            return Batch(StepKind.EXTEND, [req], [self._chunk_len(req)])
        if self.waiting and self.waiting[0].suspect and len(self.running) < self.cfg.max_running:
            return self._force_admit()
        return None

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
        return self._plan(batch)

    # ------------------------------------------------------------------------------------------
    # The progress guarantee: nothing fits the budgets and nothing decodes

    def _chunk_len(self, req: Request) -> int:
        chunk = self.cfg.chunk_size
        return req.pending if chunk is None else min(req.pending, chunk)

    def _force_admit(self) -> Batch:
        """Admit the head of the queue whatever the budgets say (the pools decide in `fit`)."""
        unlimited = Budget(2**62, 2**62 if self.separate_swa else None, self.cfg.chunk_size)
        req = self.waiting[0]
        n = self._admit(req, unlimited)
        self.waiting.popleft()
        req.status, req.row = Status.RUNNING, self.free_rows.pop()
        self.running.append(req)
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
        elif self.waiting and len(self.running) < self.cfg.max_running:
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
        if n:
            last = n == req.pending
            self._charge(budget, n, self._max_new(req) if last else 0)
        return n

    def _max_new(self, req: Request) -> int:
        return min(req.params.max_new_tokens - len(req.output), CLIP_MAX_NEW_TOKENS)

    def _admit(self, req: Request, budget: Budget) -> int:
        """Match, check both budgets, lock; the first chunk's length, or 0 to stop admitting."""
        ps, tokens = self.cfg.page_size, req.tokens
        match = self.cache.match(tokens[: len(tokens) - 1])  # compute at least one token
        extend, max_new = len(tokens) - len(match), self._max_new(req)
        if _ceil_page(extend, ps) + max_new + ps >= budget.rem_total and self.running:
            return 0
        limit = budget.rem_chunk
        if budget.rem_swa is not None:
            need = win.swa_budget_for_req(
                _ceil_page(extend, ps), window=self.cfg.window, page_size=ps, rem_chunk=limit
            )
            if need >= budget.rem_swa:
                cap = (budget.rem_swa - self.cfg.window - ps) // ps * ps
                if limit is None or cap <= 0:
                    return 0
                limit = min(limit, cap)
        n = (
            extend
            if limit is None or extend <= limit
            else (len(match) + limit) // ps * ps - len(match)
        )
        if n <= 0:
            return 0
        req.handle = self.cache.lock(match.node)
        self.hit_tokens += len(match)
        self.tail_miss_tokens += match.tail_miss
        self.admitted_tokens += len(tokens)
        req.append_slots(match.slots)
        req.stale = (0, len(match)) if len(match) else None
        req.cache_protected_len = len(match)
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
            start, end = win.eviction_frontier(
                req.kv_len,
                window=self.cfg.window,
                page_size=self.cfg.page_size,
                cache_protected_len=req.cache_protected_len,
                swa_evicted_seqlen=req.swa_evicted_seqlen,
                chunk_cache=not self.cfg.radix,
            )
            if (
                batch.kind is StepKind.DECODE
                and not due
                and not win.decode_eviction_due(start, end, self.cfg.eviction_interval)
            ):
                continue
            if batch.kind is StepKind.EXTEND and self.cfg.radix:
                continue  # the tree owns inserted chunks; only decode evicts with a radix cache
            if end > start:
                self.ledger.free_swa(req.slots[start : end : self.cfg.page_size])
                self.swa_freed_tokens += end - start
            req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, end)

    def _pages_needed(self, batch: Batch) -> int:
        ps = self.cfg.page_size
        return sum(
            (-(-(r.kv_len + n) // ps) - -(-r.kv_len // ps)) * ps
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
            tail = -(-req.kv_len // ps) * ps - req.kv_len  # free slots on its last page
            pages = -(-max(n - tail, 0) // ps) * ps
            if pages > room:
                n = min(n, tail + room) if self.cfg.chunk_size is not None else 0
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

    def _plan(self, batch: Batch) -> StepPlan:
        reqs, lens = batch.reqs, batch.lens
        pre = np.asarray([r.kv_len for r in reqs], np.int32)
        seq = pre + np.asarray(lens, np.int32)
        rows, starts, ends, stale = [], [], [], []
        for req in reqs:
            if req.stale is not None:
                (lo, hi), req.stale = req.stale, None
                rows.append(req.row)
                starts.append(lo)
                ends.append(hi)
                stale.append(req.slots[lo:hi])
        return StepPlan(
            kind=batch.kind,
            requests=tuple(reqs),
            rows=np.asarray([r.row for r in reqs], np.int32),
            prefix_lens=pre,
            seq_lens=seq,
            last_loc=np.asarray([r.slots[-1] if r.kv_len else -1 for r in reqs], np.int32),
            releases=self.ledger.take_releases(),
            repoint=Repoint(
                np.asarray(rows, np.int32),
                np.asarray(starts, np.int32),
                np.asarray(ends, np.int32),
                np.concatenate(stale).astype(np.int32) if stale else np.zeros(0, np.int32),
            ),
            forward=self._forward_batch(reqs, lens),
            return_logits=any(r.keep_logits for r in reqs),
        )

    @staticmethod
    def _forward_batch(reqs: list[Request], lens: list[int]) -> ForwardBatch:
        tokens, logit_index, sample_index, sampled = [], [], [], []
        for req, n in zip(reqs, lens):
            start, end = req.kv_len, req.kv_len + n
            tokens += req.tokens[start:end]
            if req.keep_logits:  # every row; the last one also serves sampling
                logit_index += range(len(tokens) - n, len(tokens))
            if end == len(req.tokens):  # the prompt (or the pending token) is complete: sample
                if not req.keep_logits:
                    logit_index.append(len(tokens) - 1)
                sample_index.append(len(logit_index) - 1)
                sampled.append((req, end))
        p = [r.params for r, _ in sampled]
        return ForwardBatch(
            tokens=np.asarray(tokens, np.int32),
            logit_index=np.asarray(logit_index, np.int32),
            sample_index=np.asarray(sample_index, np.int32),
            temperature=np.asarray([x.temperature for x in p], np.float32),
            top_p=np.asarray([x.top_p for x in p], np.float32),
            seeds=np.asarray([x.seed for x in p], np.uint32),
            sample_positions=np.asarray([end for _, end in sampled], np.int32),
        )

    def postprocess(self, plan: StepPlan, result: StepResult) -> None:
        """Take a step's result: new slots, logits kept, sampled tokens, finishing, caching."""
        if result.status != 0:
            raise StepFailed(
                f"allocation failed with status {result.status} after the pools were checked"
            )
        self.ledger.allocated(result.slots)
        self.ledger.check(result.free_full, result.free_swa)
        start, row, sampled = 0, 0, []
        for req, pre, seq in zip(plan.requests, plan.prefix_lens, plan.seq_lens):
            n = int(seq - pre)
            req.append_slots(result.slots[start : start + n])
            start += n
            if req.keep_logits:
                req.logits += list(result.logits[row : row + n])
                row += n
            if req.kv_len == len(req.tokens):
                row += not req.keep_logits
                sampled.append(req)
        for req, token, logprob in zip(sampled, result.tokens.tolist(), result.logprobs.tolist()):
            self._guarded(req, self._take_token, req, token, logprob)
        for req in plan.requests:
            if req.status is Status.RUNNING and not req.decoding and self.cfg.radix:
                self._guarded(req, self._cache_chunk, req)

    def _guarded(self, req: Request, fn, *args) -> None:
        """Run one request's part of a step; if it raises, that request fails, not the step."""
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - reported on the request, never dropped
            if req.status is Status.RUNNING:
                self.abort(req, f"error: {type(error).__name__}: {error}")

    def step_failed(self, plan: StepPlan, error: Exception) -> None:
        """The step raised before its result was taken (the runner rolled its allocation back):
        retract its requests as suspects, which then run alone; a suspect that fails alone is
        aborted with the error."""
        alone = len(plan.requests) == 1
        for req in plan.requests:
            if req.status is not Status.RUNNING:
                continue
            if alone and req.suspect:
                self.abort(req, f"error: {type(error).__name__}: {error}")
            else:
                self.retract(req)
                req.suspect = True

    def _take_token(self, req: Request, token: int, logprob: float) -> None:
        req.output.append(token)
        req.logprobs.append(logprob)
        if token in req.params.stop_token_ids:
            self.finish(req, "stop")
        elif len(req.output) >= req.params.max_new_tokens:
            self.finish(req, "length")

    def _cache_chunk(self, req: Request) -> None:
        """Between chunks of a prefill: insert what is computed so far and use the cache's slots."""
        prefix, req.handle = self.cache.cache_unfinished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
        )
        req.repoint(0, prefix)
        req.cache_protected_len = max(req.cache_protected_len, len(prefix))

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
        self.cache.cache_finished(
            req.tokens[: req.kv_len],
            req.slots,
            cache_protected_len=req.cache_protected_len,
            swa_evicted_seqlen=req.swa_evicted_seqlen,
            handle=req.handle,
            insert=insert,
        )
        req.handle = None

    def retract(self, req: Request) -> None:
        """Give back all of a running request's KV and requeue it at the front; it recomputes
        its prompt and output later and goes on exactly where it stopped."""
        self._hand_over(req, insert=False)
        self._requeue(req)
        req.retractions += 1
        self.retractions += 1

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
