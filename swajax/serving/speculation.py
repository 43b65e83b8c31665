"""Speculative decoding's host half: taking a round's result (host code, no JAX); a multi-step
decode round is taken the same way, every step of it kept up to a stop.

A round allocated n positions [p, p + n) per request in both pools (a verify round: k + 1); the
device returns the target's token at each position and how many of the round's tokens after the
first it accepted (a). The request
keeps a + 1 new tokens (fewer if a stop token or its length limit comes first): their KV
positions are [p, p + m), and the pages holding only rejected positions go back to both pools
at once. A page shared with a kept position stays with the request; the next allocation
continues inside it (`last_loc`), so no slot is handed out twice. Nothing rejected is ever
inserted in the prefix cache: the request's slots and length never include it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swajax.serving.scheduler_view import SchedulerView

import numpy as np

from swajax.arith import round_up
from swajax.serving.batch import StepPlan, StepResult
from swajax.serving.request import Request


def kept(req: Request, tokens) -> int:
    """How many of a round's new tokens the request keeps: up to and including the first stop
    token, and no more than its length limit allows."""
    room = req.params.max_tokens - len(req.output)
    for i, token in enumerate(tokens[:room]):
        if token in req.params.stop_token_ids:
            return i + 1
    return min(len(tokens), room)


def take_round(sched: SchedulerView, plan: StepPlan, result: StepResult, take_token) -> None:
    """Take a verify round's result; `take_token(sched, req, token, logprob)` appends one token
    (finishing the request on a stop token or at its length limit)."""
    ps, n = sched.cfg.page_size, plan.seq_lens - plan.prefix_lens  # positions per request
    for i, (req, start) in enumerate(zip(plan.requests, np.cumsum(n) - n)):
        slots = result.slots[start : start + n[i]]
        new = result.tokens[i, : int(result.accepted[i]) + 1].tolist()
        m = kept(req, new)
        p = req.kv_len
        req.append_slots(slots[:m])
        own = round_up(p + m, ps) - p  # positions on pages that hold a kept position
        if own < len(slots):
            sched.ledger.free(slots[own:])
        if plan.speculative:
            sched.accepted_tokens += m - 1
        for token, logprob in zip(new[:m], result.logprobs[i, :m].tolist()):
            take_token(sched, req, token, logprob)
