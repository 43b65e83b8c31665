"""The two admission budgets of a step (spec §9): full and SWA tokens a new chunk may take.

`rem_total` is free + evictable full tokens less a share of what running requests will still
generate; `rem_swa` is free + evictable SWA tokens less a share of what decoding requests will
still take before their next eviction (our departure, BUILD_NOTES.md). Host code; the free
counts come from the ledger's mirror, so no device value is read.
"""

from __future__ import annotations

import dataclasses

from swajax.arith import round_up
from swajax.serving import window as win
from swajax.sizing import PoolMode, swa_residency

CLIP_MAX_NEW_TOKENS = 4096


@dataclasses.dataclass
class Budget:
    rem_total: int
    rem_swa: int | None  # None: no separate SWA pool
    rem_chunk: int | None  # None: chunked prefill off

    def charge(self, n: int, max_new: int, *, page_size: int, window: int) -> None:
        """Take an extend of n tokens (and, for a last chunk, its future output) off both."""
        ps = page_size
        self.rem_total -= round_up(n, ps) + max_new + ps
        if self.rem_swa is not None:
            self.rem_swa -= win.swa_budget_for_req(
                round_up(n, ps), window=window, page_size=ps, rem_chunk=self.rem_chunk
            )
        if self.rem_chunk is not None:
            self.rem_chunk -= n

    def take_loaded(self, full: int, swa: int) -> None:
        """A match brought KV back from a host tier into free pages: no longer free."""
        self.rem_total -= full
        if self.rem_swa is not None:
            self.rem_swa -= swa


def make_budget(cfg, options, ledger, cache, running, separate_swa: bool) -> Budget:
    """This step's budgets (`cfg`, `options`: the scheduler's; `running`: its running
    requests)."""
    full, swa = ledger.available()
    # Speculative decoding: a decode step holds k lookahead positions beyond what it keeps.
    reserve = sum(
        min(r.params.max_tokens - len(r.output), CLIP_MAX_NEW_TOKENS)
        + options.num_speculative_tokens
        for r in running
    )
    if cfg.pool_mode is PoolMode.ALL_SWA:
        full_budget = swa + cache.swa_evictable
    else:
        full_budget = full + cache.full_evictable
    rem_total = full_budget - int(reserve * cfg.decode_reserve_ratio)
    rem_swa = None
    if separate_swa:
        # Unlike SGLang (spec §9.1), also reserve the SWA a running request will still take
        # before its next eviction: up to interval + page_size tokens. Without it, SWA-bound
        # workloads admit too much and then retract in storms. Only decoding requests reserve:
        # a prefilling request's own future decode must not park its next chunk (which once
        # parked every chunk, and the engine stalled).
        grow = swa_residency(0, options.eviction_interval, cfg.page_size)  # beyond the window
        swa_reserve = sum(
            min(r.params.max_tokens - len(r.output), grow) + options.num_speculative_tokens
            for r in running
            if r.decoding
        )
        rem_swa = swa + cache.swa_evictable - int(swa_reserve * cfg.decode_reserve_ratio)
    return Budget(rem_total, rem_swa, options.chunk_size)
