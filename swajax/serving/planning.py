"""A step's plan from the batch the scheduler chose: the arrays the runner uploads.

Host code. Every request contributes its new tokens, its req_to_token row, prefix and sequence
lengths and last slot; a request whose row no longer matches its slots (an admission's cached
prefix, a chunk's re-pointed prefix) contributes the stale range; the requests that complete
their pending tokens are sampled, the ones that keep logits have all their rows computed.
"""

from __future__ import annotations

import numpy as np

from swajax.serving.batch import ForwardBatch, Releases, Repoint, StepKind, StepPlan
from swajax.serving.request import Request


def build_plan(batch, releases: tuple[Releases, ...], lookahead: int = 0) -> StepPlan:
    """The plan of `batch` (a scheduler `Batch`), carrying the releases queued before it; a
    decode batch with `lookahead` k is a speculative verify round."""
    spec = lookahead if batch.kind is StepKind.DECODE else 0
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
        releases=releases,
        repoint=Repoint(
            np.asarray(rows, np.int32),
            np.asarray(starts, np.int32),
            np.asarray(ends, np.int32),
            np.concatenate(stale).astype(np.int32) if stale else np.zeros(0, np.int32),
        ),
        forward=verify_batch(reqs, spec) if spec else forward_batch(reqs, lens),
        return_logits=any(r.keep_logits for r in reqs),
        full_src=full_sources(reqs, lens),
        lookahead=spec,
    )


def verify_batch(reqs: list[Request], k: int) -> ForwardBatch:
    """A verify round's tokens: each request's pending token, then k places the draft fills."""
    tokens = np.zeros(len(reqs) * (k + 1), np.int32)
    tokens[:: k + 1] = [r.output[-1] for r in reqs]
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return ForwardBatch(tokens, empty_i, empty_i, empty_f, empty_f, np.zeros(0, np.uint32),
                        empty_i)  # fmt: skip


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
