"""Driving an engine to the end: `generate` (prompts in, finished requests and a memory summary
out) and `teacher_forced_logits` (every position's logits, for comparing backends)."""

from __future__ import annotations

import jax
import numpy as np

from swajax.errors import RequestFailed
from swajax.memory.compilations import cache_hits, compilation_count
from swajax.serving.engine import Engine
from swajax.serving.sampling_params import SamplingParams


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams):
    """Run all prompts together; returns the finished requests (in order) and a summary."""
    rids = [engine.add_request(p, params) for p in prompts]
    engine.run()
    return [engine.requests[r] for r in rids], summary(engine)


def summary(engine: Engine) -> dict:
    """What an engine's run did to memory: peak occupancy of both pools, prefix hits, SWA KV
    freed, retractions, speculative decoding's draft tokens (proposed, kept, acceptance per
    round), this process's compilations, and the bytes of the model's parameters on the
    device."""
    m = engine.metrics
    return dict(
        steps=len(m),
        peak_full_used=max((x.full_used for x in m), default=0),
        peak_swa_used=max((x.swa_used for x in m), default=0),
        full_tokens=engine.sizes.full_tokens,
        swa_tokens=engine.sizes.swa_tokens,
        prefix_hit_tokens=engine.scheduler.hit_tokens,
        swa_freed_tokens=engine.scheduler.swa_freed_tokens,
        retractions=engine.scheduler.retractions,
        draft_tokens_accepted=engine.scheduler.accepted_tokens,
        **speculative(engine.scheduler),
        compilations=compilation_count(),  # this process, persistent-cache hits excluded
        compile_cache_hits=cache_hits(),
        # Step programs read ready-compiled from disk, not traced (runner/program_store.py).
        programs_loaded=getattr(getattr(engine.runner, "programs", None), "loaded", 0),
        weight_bytes=weight_bytes(engine.model),
    )


def speculative(scheduler) -> dict:
    """Speculative decoding's counts: draft tokens proposed, request-rounds by how many of
    their proposals the verify accepted, and the mean tokens a request gains per round (the
    accepted proposals and the target's own token)."""
    rounds = sum(scheduler.acceptance.values())
    accepted = sum(a * c for a, c in scheduler.acceptance.items())
    return dict(
        draft_tokens_proposed=scheduler.draft_tokens,
        acceptance_lengths=dict(sorted(scheduler.acceptance.items())),
        mean_acceptance_length=1 + accepted / rounds if rounds else None,
    )


def weight_bytes(model) -> int:
    """Bytes the model's parameters hold on the device (0 for a model without weights)."""
    state = getattr(model, "state", None)
    return sum(int(x.nbytes) for x in jax.tree.leaves(state)) if state is not None else 0


def teacher_forced_logits(engine: Engine, prompt: list[int]) -> np.ndarray:
    """Logits [len(prompt), vocab]: position i predicts token i + 1 (paged, hybrid memory on)."""
    rid = engine.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=1), keep_logits=True, cache_hits=False
    )
    engine.run()
    req = engine.requests[rid]
    if req.finish_reason not in ("stop", "length") or len(req.logits) < len(prompt):
        raise RequestFailed(
            f"teacher-forced logits of a {len(prompt)}-token prompt: the request ended with "
            f"{req.finish_reason!r} after {len(req.logits)} positions"
        )
    return np.stack(req.logits[: len(prompt)])
