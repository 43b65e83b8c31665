"""A step's plan from the batch the scheduler chose: the arrays the runner uploads.

Host code. Every request contributes its new tokens, its req_to_token row, prefix and sequence
lengths and last slot; a request whose row no longer matches its slots (an admission's cached
prefix, a chunk's re-pointed prefix) contributes the stale range; the requests that complete
their pending tokens are sampled, the ones that keep logits have all their rows computed.
"""

from __future__ import annotations

import numpy as np

from swajax.serving.batch import (
    ForwardBatch,
    MemoryOps,
    PenaltySeeds,
    Releases,
    Repoint,
    Round,
    SamplingOps,
    StepKind,
    StepPlan,
    sampling_fields,
)
from swajax.serving.request import Request
from swajax.serving.token_rules import has_rules


def build_plan(
    batch,
    releases: tuple[Releases, ...],
    speculative: bool = False,
    transfers=(),
    round_steps: int = 1,
) -> StepPlan:
    """The plan of `batch` (a scheduler `Batch`), carrying the releases queued before it; a
    decode batch of n > 1 positions per request is a round: a speculative verify round of
    n - 1 draft tokens (`speculative`), else multi-step decode, each request its own number
    of steps in a program sized for `round_steps` (N)."""
    spec = max(batch.lens) - 1 if batch.kind is StepKind.DECODE and batch.reqs else 0
    if spec and not speculative:  # the round's program runs N steps' worth, each request its own
        spec = max(spec, round_steps - 1)
    reqs, lens = batch.reqs, batch.lens
    pre = np.asarray([r.kv_len for r in reqs], np.int32)
    seq = pre + np.asarray(lens, np.int32)
    rows, starts, ends, stale = [], [], [], []
    for req in reqs:
        if req.stale is not None:
            lo, hi = req.stale
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
        forward=round_batch(reqs, lens) if spec else forward_batch(reqs, lens),
        memory=MemoryOps(
            releases=releases,
            transfers=transfers,
            repoint=Repoint(
                np.asarray(rows, np.int32),
                np.asarray(starts, np.int32),
                np.asarray(ends, np.int32),
                np.concatenate(stale).astype(np.int32) if stale else np.zeros(0, np.int32),
            ),
            full_src=full_sources(reqs, lens),
        ),
        round=Round(spec, speculative and spec > 0),
        sampling=SamplingOps(
            penalize=any(r.params.penalized for r in reqs),
            penalty_seeds=penalty_seeds(reqs),
            top_logprobs=top_logprobs(reqs),
            return_logits=any(r.keep_logits for r in reqs),
            rules=any(has_rules(r.params) for r in reqs),
        ),
    )


def top_logprobs(reqs) -> int:
    """N of the top-N logprobs a step returns: the most any of its requests asks for, as a
    power of two (fewer programs); 0 when none asks."""
    n = max((r.params.logprobs for r in reqs), default=0)
    return 1 << (n - 1).bit_length() if n else 0


def penalty_seeds(reqs: list[Request]) -> PenaltySeeds | None:
    """The counts of penalized requests that start in this step's rows (not yet seeded)."""
    fresh = [r for r in reqs if r.params.penalized and not r.penalties_seeded]
    if not fresh:
        return None
    rows = np.concatenate([np.full(r.num_tokens, r.row, np.int32) for r in fresh])
    tokens = np.concatenate([np.asarray(r.tokens, np.int32) for r in fresh])
    out = np.concatenate([np.arange(r.num_tokens) >= len(r.prompt) for r in fresh])
    reset = np.asarray([r.row for r in fresh], np.int32)
    return PenaltySeeds(reset, rows, tokens, out.astype(np.int32))


def round_batch(
    reqs: list[Request], lens: list[int], *, pending=None, positions=None
) -> ForwardBatch:
    """A round's tokens: each request's pending token, then the places the round fills (a
    verify round's draft tokens, a multi-step round's own samples): lens[i] per request. A
    round planned ahead (serving/overlap.py) passes its `pending` placeholders and the
    `positions` its requests will have reached."""
    tokens = np.zeros(sum(lens), np.int32)
    tokens[np.cumsum(lens) - lens] = [r.output[-1] for r in reqs] if pending is None else pending
    empty = np.zeros(0, np.int32)
    # Per request: its sampling fields, keyed from the position of its pending token's successor.
    if positions is None:
        positions = [r.num_tokens for r in reqs]
    fields = sampling_fields(reqs, positions)
    return ForwardBatch(tokens=tokens, logit_index=empty, sample_index=empty, **fields)


def full_sources(reqs: list[Request], lens: list[int]) -> np.ndarray | None:
    """Where full layers copy KV from instead of computing it (tail rebuilds), or None."""
    if not any(r.rebuild is not None and r.kv_len < r.rebuild.end for r in reqs):
        return None
    parts = [
        r.rebuild.sources(r.kv_len, r.kv_len + n)
        if r.rebuild is not None
        else np.zeros(n, np.int32)
        for r, n in zip(reqs, lens)
    ]
    return np.concatenate(parts)


def forward_batch(reqs: list[Request], lens: list[int]) -> ForwardBatch:
    tokens, logit_index, sample_index, sampled = [], [], [], []
    for req, n in zip(reqs, lens):
        start, end = req.kv_len, req.kv_len + n
        tokens += req.token_slice(start, end)
        if req.keep_logits:  # every row; the last one also serves sampling
            logit_index += range(len(tokens) - n, len(tokens))
        if end == req.num_tokens:  # the prompt (or the pending token) is complete: sample
            if not req.keep_logits:
                logit_index.append(len(tokens) - 1)
            sample_index.append(len(logit_index) - 1)
            sampled.append((req, end))
    return ForwardBatch(
        tokens=np.asarray(tokens, np.int32),
        logit_index=np.asarray(logit_index, np.int32),
        sample_index=np.asarray(sample_index, np.int32),
        **sampling_fields([r for r, _ in sampled], [end for _, end in sampled]),
    )
