"""What a runner hands back for a launched step, and how a step's output vector becomes a
`StepResult` (host code, shared by the device runner and the host runner)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from swajax.serving.batch import StepPlan, StepResult

# A step's output is one int32 vector: [status, free_full, free_swa, slot of each new token].
OUT_STATUS, OUT_FREE_FULL, OUT_FREE_SWA, OUT_SLOTS = 0, 1, 2, 3


class Dispatched(NamedTuple):
    """A launched step whose result has not been read: device arrays (JAX runs ahead); or, for
    a model outside the fused program, a step already run and read (`result`)."""

    plan: StepPlan
    out: Any  # the output vector (a device array until read)
    sampled: tuple
    result: StepResult | None = None


def step_result(plan: StepPlan, out: np.ndarray, sampled) -> StepResult:
    """The host's view of a step from its output vector and sampled arrays (both read)."""
    new = plan.num_new_tokens
    head = dict(
        status=int(out[OUT_STATUS]),
        slots=out[OUT_SLOTS : OUT_SLOTS + new],
        free_full=int(out[OUT_FREE_FULL]),
        free_swa=int(out[OUT_FREE_SWA]),
    )
    if plan.round.lookahead:  # a round: every row of every request, and the accepted counts
        n = len(plan.requests)
        tokens, logprobs, accepted, *more = sampled
        logits, top_ids, top_lp = (*more, None, None, None)[:3]
        return StepResult(
            **head,
            tokens=np.asarray(tokens)[:n],
            logprobs=np.asarray(logprobs)[:n],
            accepted=np.asarray(accepted)[:n],
            logits=None if logits is None else np.asarray(logits)[:n],
            top_ids=None if top_ids is None else np.asarray(top_ids)[:n],
            top_logprobs=None if top_lp is None else np.asarray(top_lp)[:n],
        )
    tokens, logprobs, logits, top_ids, top_lp = sampled
    s, k = len(plan.forward.sample_index), len(plan.forward.logit_index)
    return StepResult(
        **head,
        tokens=np.asarray(tokens)[:s],
        logprobs=np.asarray(logprobs)[:s],
        logits=None if logits is None else np.asarray(logits)[:k],
        top_ids=None if top_ids is None else np.asarray(top_ids)[:s],
        top_logprobs=None if top_lp is None else np.asarray(top_lp)[:s],
    )


def fresh_slots(plan: StepPlan, out: np.ndarray, page_size: int) -> np.ndarray:
    """The slots a successful step took on new pages (not the tail of a page a request already
    held): what rolling the step back frees."""
    fresh = plan.fresh_slots(out[OUT_SLOTS:], page_size)
    return np.concatenate([np.zeros(0, np.int32), *fresh]).astype(np.int32)
