"""Overlap scheduling (host code): plan decode step n + 1 while step n still runs on the device.

JAX dispatches asynchronously, so the engine launches step n, plans n + 1 against what the host
already knows, launches it, and only then reads step n's result. What step n will change is
predicted, never read: every decoding request gains one position and one token (a placeholder
the device fills from step n's sampled tokens); its previous slot is read on device
(`LAST_LOC_ON_DEVICE`); both pools must hold step n's and step n + 1's new pages at once.

Why nothing the device may still read is freed early (BUILD_NOTES.md, "Overlap scheduling"):
releases never reach the device before the next program launched after them, and programs run
in launch order, so a slot freed while step n runs is given back by step n + 2's program, after
n + 1 (planned with n in flight) has finished reading it. On the host:
- window eviction for n + 1 uses the confirmed length (one step behind), so it frees nothing
  step n + 1 reads, and only slots the host already knows;
- a request that finishes in step n by its length is left out of n + 1; one that stops on a
  stop token (or is aborted) in between has its extra token discarded when n + 1's result is
  read: the page it took, if new, goes back, and no token, slot or cache insert is kept.
Only a steady decode overlaps: a waiting request, a prefill chunk, a suspect, a step that must
evict to fit, speculative rounds and kept logits all take the plain (synchronous) path.

`Scheduler.plan_ahead` makes those decisions; this module holds what they compute from plans
alone: the pages a step takes, the plan launched ahead and, for a model that runs outside the
fused program, its placeholders filled in.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.memory.step_codes import LAST_LOC_ON_DEVICE
from swajax.serving.batch import (
    ForwardBatch,
    MemoryOps,
    Round,
    SamplingOps,
    StepKind,
    StepPlan,
    sampling_fields,
)
from swajax.serving.planning import round_batch, top_logprobs
from swajax.serving.request import Request
from swajax.serving.token_rules import has_rules


def new_pages(starts, counts, ps: int) -> int:
    """Tokens of the new pages that positions [start, start + count) take, over requests."""
    return sum(ps * (-(-(s + n) // ps) - -(-s // ps)) for s, n in zip(starts, counts))


def left(req: Request, taken: int) -> int:
    """Tokens the request has left after the `taken` step n samples for it."""
    return req.params.max_tokens - len(req.output) - taken


def build(reqs, done, lens, steps, prev, releases, released) -> StepPlan:
    """The plan of a decode step (lens 1) or round (`steps` its N) launched before `prev`'s
    result is read; `done`: the positions each request takes in `prev`."""
    row_in_prev = {id(r): i for i, r in enumerate(prev.requests)}  # one pending token each
    pre = np.asarray([r.kv_len + n for r, n in zip(reqs, done)], np.int32)
    lens = np.asarray(lens, np.int32)
    n = len(reqs)
    params = [r.params for r in reqs]
    pending = np.asarray([-1 - row_in_prev[id(r)] for r in reqs], np.int32)
    if steps > 1:  # a round: each request's pending token, then the places the round fills
        forward = round_batch(reqs, lens.tolist(), pending=pending, positions=pre + 1)
    else:
        index = np.arange(n, dtype=np.int32)
        fields = sampling_fields(reqs, pre + 1)
        forward = ForwardBatch(tokens=pending, logit_index=index, sample_index=index, **fields)
    return StepPlan(
        kind=StepKind.DECODE,
        requests=tuple(reqs),
        rows=np.asarray([r.row for r in reqs], np.int32),
        prefix_lens=pre,
        seq_lens=pre + lens,
        last_loc=np.full(n, LAST_LOC_ON_DEVICE, np.int32),
        forward=forward,
        memory=MemoryOps(releases=releases, released=released),
        round=Round(lookahead=steps - 1),
        sampling=SamplingOps(
            penalize=any(p.penalized for p in params),
            top_logprobs=top_logprobs(reqs) if steps == 1 else 0,
            rules=any(has_rules(p) for p in params),
        ),
    )


def resolved(plan: StepPlan, prev: StepPlan, result) -> StepPlan:
    """`plan` (launched ahead of `prev`) with its placeholders filled from `prev`'s result, as
    the device fills them: for a model that runs outside the fused program (the null model),
    whose step has already run when the next one is launched."""
    row_in_prev = {id(r): i for i, r in enumerate(prev.requests)}
    rows = np.asarray([row_in_prev[id(r)] for r in plan.requests], np.int64)
    on_device = plan.last_loc == LAST_LOC_ON_DEVICE
    last_loc = np.where(on_device, prev.last_slots(result.slots)[rows], plan.last_loc)
    last = last_tokens(prev, result)
    tokens = plan.forward.tokens
    sampled = last[np.clip(-tokens - 1, 0, len(last) - 1)]
    forward = plan.forward._replace(tokens=np.where(tokens < 0, sampled, tokens).astype(np.int32))
    return dataclasses.replace(plan, last_loc=last_loc.astype(np.int32), forward=forward)


def last_tokens(prev: StepPlan, result) -> np.ndarray:
    """The token each of `prev`'s requests sampled last (a round's: at its last step)."""
    tokens = np.asarray(result.tokens)
    if not prev.round.lookahead:
        return tokens
    return tokens[np.arange(len(tokens)), np.asarray(result.accepted)]
