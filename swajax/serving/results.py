"""Taking a step's result (host code): new slots, kept logits, sampled tokens, finishing and
caching; and what happens to a step that raised. Functions of the `Scheduler`, which owns every
`Request` mutation and prefix-cache call; kept here so the scheduler file is about choosing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swajax.serving.scheduler_view import SchedulerView

import dataclasses
import math

import numpy as np

from swajax.serving import speculation, tail_rebuild
from swajax.serving.batch import StepKind, StepPlan, StepResult
from swajax.serving.request import Request, Status


class StepFailed(RuntimeError):
    """The device refused a step the host had checked (a bookkeeping bug, never bad input)."""


def take(
    sched: SchedulerView, plan: StepPlan, result: StepResult, launched: StepPlan | None = None
) -> None:
    """Take a step's result: new slots, logits kept, sampled tokens, finishing, caching.
    `launched`: a step launched since (overlap scheduling), whose releases the host counted
    but the device has not applied yet."""
    if result.status != 0:
        raise StepFailed(
            f"allocation failed with status {result.status} after the pools were checked"
        )
    plan, result, extra = _without_ended(sched, plan, result)
    sched.ledger.allocated(result.slots)
    if len(extra):
        sched.ledger.allocated(extra)
    in_flight = launched.released if launched is not None else (0, 0)
    sched.ledger.check(result.free_full, result.free_swa, in_flight)
    if len(extra):
        sched.ledger.free(extra)
    if plan.lookahead:
        speculation.take_round(sched, plan, result, _guarded_token)
        return
    start, row, sampled = 0, 0, []
    for req, pre, seq in zip(plan.requests, plan.prefix_lens, plan.seq_lens):
        n = int(seq - pre)
        req.append_slots(result.slots[start : start + n])
        start += n
        if req.keep_logits:
            # A tail rebuild's positions before its end are inexact by design: they count as
            # cached, so their logits are not kept.
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
        _guarded(sched, req, _take_token, sched, req, token, logprob, top)
    last_chunk = sched.cfg.policy.checkpoint_last_chunk
    for req in plan.requests:
        if req.status is not Status.RUNNING or not sched.options.prefix_cache:
            continue
        # A chunk checkpoint between prefill chunks; SGLang also takes one after the last, and
        # so does the first of n samples (the others take the prompt's KV from the cache).
        after_last = (last_chunk or req.leads) and req in sampled and len(req.output) == 1
        if not req.decoding or after_last:
            _guarded(sched, req, _cache_chunk, sched, req)


def _top_logprobs(sampled: list[Request], result: StepResult) -> list:
    """Each sampled request's top-N {token: logprob} (N its own), or None if it asked none."""
    if result.top_ids is None:
        return [None] * len(sampled)
    ids, lps = result.top_ids.tolist(), result.top_logprobs.tolist()
    return [
        dict(zip(ids[i][: r.params.logprobs], lps[i][: r.params.logprobs]))
        if r.params.logprobs
        else None
        for i, r in enumerate(sampled)
    ]


def _without_ended(sched: SchedulerView, plan: StepPlan, result: StepResult):
    """A decode step or round launched ahead may carry requests that ended while it ran (a stop
    token in the step before, an abort): their tokens are dropped, and the new pages their
    positions took, if any, are returned as `extra` (slots inside a page the request held went
    back with the page)."""
    ended = np.asarray([r.status is not Status.RUNNING for r in plan.requests], bool)
    if not ended.any():
        return plan, result, result.slots[:0]
    if plan.kind is not StepKind.DECODE or plan.speculative:
        raise StepFailed("only a decode step or round can outlive one of its requests")
    keep = ~ended
    sched.dropped_tokens += int((plan.seq_lens - plan.prefix_lens)[ended].sum())
    fresh = plan.fresh_slots(result.slots, sched.cfg.page_size)
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


def _guarded(sched: SchedulerView, req: Request, fn, *args) -> None:
    """Run one request's part of a step; if it raises, that request fails, not the step."""
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - reported on the request, never dropped
        if req.status is Status.RUNNING:
            sched.abort(req, f"error: {type(error).__name__}: {error}")


def failed(sched: SchedulerView, plan: StepPlan, error: Exception) -> None:
    """The step raised before its result was taken (the runner rolled its allocation back):
    retract its requests as suspects, which then run alone; a suspect that fails alone is
    aborted with the error."""
    alone = len(plan.requests) == 1
    for req in plan.requests:
        if req.status is not Status.RUNNING:
            continue
        if alone and req.suspect:
            sched.abort(req, f"error: {type(error).__name__}: {error}")
        else:
            sched.retract(req, suspect=True)


def _guarded_token(sched: SchedulerView, req: Request, token: int, logprob: float) -> None:
    if req.status is Status.RUNNING:  # a round's later tokens after a finish are dropped
        _guarded(sched, req, _take_token, sched, req, token, logprob)


def _take_token(
    sched: SchedulerView, req: Request, token: int, logprob: float, top: dict | None = None
) -> None:
    if math.isnan(logprob):  # NaN logits: the sampled token means nothing
        sched.abort(
            req,
            f"error: the model's logits are NaN at position {req.num_tokens} "
            "(non-finite weights or an overflow in the compute dtype)",
        )
        return
    req.take_token(token, logprob, top)
    if token in req.params.stop_token_ids:
        sched.finish(req, "stop")
    elif len(req.output) >= req.params.max_tokens:
        sched.finish(req, "length")


def _cache_chunk(sched: SchedulerView, req: Request) -> None:
    """Between chunks of a prefill: insert what is computed so far and use the cache's slots.
    Policies: free the out-of-window SWA KV first (eager window free), insert no further than
    the admission's full-KV match reached (branch insert)."""
    policy, end = sched.cfg.policy, req.kv_len
    if not tail_rebuild.before_checkpoint(sched, req):
        return
    if policy.eager_window_free:
        sched.evict_request_window(req)
    if req.swa_branching_seqlen is not None:
        end = min(end, req.swa_branching_seqlen)
    prefix, handle = sched.cache.cache_unfinished(
        req.tokens[:end],
        req.slots,
        cache_protected_len=req.cache_protected_len,
        swa_evicted_seqlen=req.swa_evicted_seqlen,
        handle=req.handle,
    )
    req.checkpointed(prefix, handle)
