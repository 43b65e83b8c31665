"""Scheduling with two budgets: admission, chunked prefill, decode memory, retraction, abort.

Host code (no JAX). A step is either an extend batch (new requests and prefill chunks) or a
decode batch (every decoding request). Admission checks the full budget (`rem_total`: free +
evictable full tokens, less what running requests will still generate) and the SWA budget
(`rem_swa`: free + evictable SWA tokens) as in spec §9; see BUILD_NOTES.md for where we depart.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from swajax import window as win
from swajax.request import Request, Status

CLIP_MAX_NEW_TOKENS = 4096


@dataclasses.dataclass
class Budget:
    rem_total: int
    rem_swa: int | None  # None: no separate SWA pool
    rem_chunk: int | None  # None: chunked prefill off


@dataclasses.dataclass
class Batch:
    kind: str  # "extend" | "decode"
    reqs: list[Request]
    lens: list[int]  # new tokens per request


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    window: int  # memory window W (0 without local layers)
    pool_mode: str  # hybrid | single | all_swa
    max_running: int
    max_context: int
    chunk_size: int | None = None  # chunked prefill; None = off
    eviction_interval: int = 128
    decode_reserve_ratio: float = 0.5  # share of a running request's remaining tokens reserved
    radix: bool = True


def _ceil_page(n: int, ps: int) -> int:
    return -(-n // ps) * ps


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, cache, allocator):
        self.cfg, self.cache, self.alloc = cfg, cache, allocator
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_rows = list(range(cfg.max_running - 1, -1, -1))
        self.retractions = 0
        self.swa_freed_tokens = 0  # out-of-window SWA KV given back by runtime eviction
        # Per admission (a refused attempt's match does not count): cached / all tokens.
        self.hit_tokens = self.admitted_tokens = self.tail_miss_tokens = 0

    @property
    def separate_swa(self) -> bool:
        return self.cfg.pool_mode == "hybrid" and self.cfg.window > 0

    # ------------------------------------------------------------------------------------------
    # Budgets

    def budget(self) -> Budget:
        full, swa = self.alloc.available()
        reserve = sum(
            min(r.params.max_new_tokens - len(r.output), CLIP_MAX_NEW_TOKENS) for r in self.running
        )
        if self.cfg.pool_mode == "all_swa":
            full_budget = swa + self.cache.swa_evictable
        else:
            full_budget = full + self.cache.full_evictable
        rem_total = full_budget - int(reserve * self.cfg.decode_reserve_ratio)
        rem_swa = None
        if self.separate_swa:
            # Unlike SGLang (spec §9.1), also reserve the SWA a running request will still take
            # before its next eviction: up to interval + page_size tokens. Without it, SWA-bound
            # workloads admit too much and then retract in storms.
            grow = self.cfg.eviction_interval + self.cfg.page_size
            swa_reserve = sum(
                min(r.params.max_new_tokens - len(r.output), grow) for r in self.running
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

    def schedule(self) -> Batch | None:
        """Prefill work first (chunks in flight, then new requests in order), else decode."""
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
            return Batch("extend", reqs, lens)
        decode = self._decode_batch()
        return decode if decode.reqs else None

    def _decode_batch(self) -> Batch:
        decoding = [r for r in self.running if r.decoding]
        return Batch("decode", decoding, [1] * len(decoding))

    def next_batch(self) -> Batch | None:
        """Schedule, evict and allocate. If no prefill work fits, decode instead (finishing
        requests frees memory); if nothing can run, retract the newest prefill."""
        batch = self.schedule()
        if batch is None:
            return None
        self.evict_windows(batch)
        batch = self.allocate(batch)
        if batch.reqs or batch.kind == "decode":
            return batch
        decode = self._decode_batch()
        if decode.reqs:
            self.evict_windows(decode)
            return self.allocate(decode)
        stuck = [r for r in self.running if not r.decoding]
        if len(stuck) > 1:
            self.retract(max(stuck, key=lambda r: r.rid))
        elif stuck:
            self.abort(stuck[0], "out of memory: the pools cannot hold this request")
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
        req.slots = np.asarray(match.slots, np.int32)
        req.prefix_len = req.cache_protected_len = len(match)
        self._charge(budget, n, max_new if n == extend else 0)
        return n

    # ------------------------------------------------------------------------------------------
    # Memory for a batch

    def evict_windows(self, batch: Batch) -> None:
        """Runtime SWA eviction before a batch (decode: once enough has piled up)."""
        if not self.cfg.window or self.cfg.pool_mode == "single":
            return
        for req in batch.reqs:
            if req.kv_len == 0:
                continue
            start, end = win.eviction_frontier(
                req.kv_len,
                window=self.cfg.window,
                page_size=self.cfg.page_size,
                cache_protected_len=req.cache_protected_len,
                swa_evicted_seqlen=req.swa_evicted_seqlen,
                chunk_cache=not self.cfg.radix,
            )
            if batch.kind == "decode" and not win.decode_eviction_due(
                start, end, self.cfg.eviction_interval
            ):
                continue
            if batch.kind == "extend" and self.cfg.radix:
                continue  # the tree owns inserted chunks; only decode evicts with a radix cache
            if end > start:
                self.alloc.free_swa(req.slots[start : end : self.cfg.page_size])
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
        full, swa = self.alloc.available()
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
        full, swa = self.alloc.available()
        if full >= tokens and swa >= tokens:
            return True
        self.cache.evict(max(0, tokens - full), max(0, tokens - swa))
        full, swa = self.alloc.available()
        return full >= tokens and swa >= tokens

    def allocate(self, batch: Batch) -> Batch:
        """Allocate the batch's new tokens; retract (decode) or shrink (extend) what can't fit."""
        if batch.kind == "extend" and not self._fits(self._pages_needed(batch)):
            self._shrink_to_fit(batch)
        while batch.kind == "decode" and batch.reqs and not self._fits(self._pages_needed(batch)):
            if len(self.running) > 1:
                victim = min(self.running, key=lambda r: (len(r.output), -len(r.prompt), -r.rid))
                self.retract(victim)
                if victim in batch.reqs:
                    i = batch.reqs.index(victim)
                    del batch.reqs[i], batch.lens[i]
            else:
                self.abort(batch.reqs[0], "out of memory: the pools cannot hold this request")
                batch.reqs, batch.lens = [], []
        if not batch.reqs:
            return batch
        pre = [r.kv_len for r in batch.reqs]
        last = [int(r.slots[-1]) if r.kv_len else -1 for r in batch.reqs]
        seq = [p + n for p, n in zip(pre, batch.lens)]
        alloc = self.alloc.alloc_decode if batch.kind == "decode" else self.alloc.alloc_extend
        status, slots = alloc(seq, last) if batch.kind == "decode" else alloc(pre, seq, last)
        if status != 0:
            raise RuntimeError(
                f"allocation failed with status {status} after the pools were checked"
            )
        start = 0
        for req, n in zip(batch.reqs, batch.lens):
            req.slots = np.concatenate([req.slots, slots[start : start + n]]).astype(np.int32)
            start += n
        return batch

    # ------------------------------------------------------------------------------------------
    # Leaving

    def _release_row(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        if req.row is not None:
            self.free_rows.append(req.row)

    def _requeue(self, req: Request) -> None:
        self.cache.unlock(req.handle)
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
