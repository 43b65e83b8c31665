"""How many positions each decoding request takes in a decode step (host code): one, or a
round: a speculative draft's k + 1, or up to N steps of multi-step decode. A function of the
`Scheduler` (see BUILD_NOTES.md, "Multi-step decode")."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swajax.serving.scheduler_view import SchedulerView

from swajax.serving.request import Request


def decode_lens(sched: SchedulerView, decoding: list[Request]) -> list[int]:
    """Each decoding request's positions this step. With a draft, k + 1 (a verify round).
    Multi-step decode: up to N = `SchedulerConfig.decode_steps`, each request no more than it
    has tokens left (the round's program is N's whatever each takes: one program per batch
    size); only when every running request decodes and nothing waits (admission is settled)
    and none asks for what a round does not return (penalties, top-N logprobs, kept logits).
    Otherwise one each."""
    k, one = sched.options.num_speculative_tokens, [1] * len(decoding)
    if k:
        return [1 + k] * len(decoding)
    if len(decoding) != len(sched.running) or not rounds_allowed(sched, decoding):
        return one
    cap = sched.cfg.decode_steps
    return [max(1, min(cap, r.params.max_tokens - len(r.output))) for r in decoding]


def rounds_allowed(sched: SchedulerView, reqs) -> bool:
    """Whether `reqs` (every running request, all decoding) may run a multi-step round: the
    setting allows one, nothing waits, none asks for what a round does not return."""
    if sched.cfg.decode_steps <= 1 or sched.options.num_speculative_tokens or sched.waiting:
        return False
    return not any(r.keep_logits or r.params.penalized or r.params.logprobs for r in reqs)
