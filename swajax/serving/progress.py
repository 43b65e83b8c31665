"""The progress guarantee (host code): what the scheduler runs when the budgets stop everything,
and how a suspect (a request whose step raised) runs alone. Functions of the `Scheduler`; see
BUILD_NOTES.md ("Progress guarantee and atomic steps").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swajax.serving.scheduler_view import SchedulerView

from swajax.serving.batch import Batch, StepKind
from swajax.serving.budget import Budget
from swajax.serving.request import Request


def suspect_batch(sched: SchedulerView) -> Batch | None:
    """The oldest suspect's next step, alone (None when there is no suspect to run)."""
    running = [r for r in sched.running if r.suspect]
    if running:
        req = min(running, key=lambda r: r.rid)
        if req.decoding:
            return Batch(StepKind.DECODE, [req], [1 + sched.options.num_speculative_tokens])
        return Batch(StepKind.EXTEND, [req], [chunk_len(sched, req)])
    if (
        sched.waiting
        and sched.waiting[0].suspect
        and len(sched.running) < sched.options.max_running
    ):
        return force_admit(sched)
    return None


def chunk_len(sched: SchedulerView, req: Request) -> int:
    chunk = sched.options.chunk_size
    return req.pending if chunk is None else min(req.pending, chunk)


def force_admit(sched: SchedulerView) -> Batch:
    """Admit the head of the queue whatever the budgets say (the pools decide in `fit`)."""
    unlimited = Budget(2**62, 2**62 if sched.separate_swa else None, sched.options.chunk_size)
    req = sched.waiting[0]
    n = sched.admit(req, unlimited)
    sched.start(req)
    return Batch(StepKind.EXTEND, [req], [n])


def force(sched: SchedulerView) -> Batch:
    """The budgets are estimates; when they park every prefill and nothing decodes, the
    oldest prefill (or, with none running, the head of the queue) gets a chunk of what the
    pools physically hold. If not one page fits, the newest other request is retracted; a
    request alone that still cannot fit is aborted with the numbers."""
    prefills = [r for r in sched.running if r.pending > 0]
    if prefills:
        req = min(prefills, key=lambda r: r.rid)
        batch = Batch(StepKind.EXTEND, [req], [chunk_len(sched, req)])
    elif sched.waiting and len(sched.running) < sched.options.max_running:
        batch = force_admit(sched)
        req = batch.reqs[0]
    else:
        raise RuntimeError(
            f"no progress possible: {len(sched.running)} running, {len(sched.waiting)} waiting"
        )
    need = batch.lens[0]
    sched.evict_windows(batch)
    batch = sched.fit(batch)
    if batch.reqs:
        return batch
    others = [r for r in sched.running if r is not req]
    if others:
        sched.retract(max(others, key=lambda r: r.rid))
    else:
        full, swa = sched.ledger.available()
        sched.abort(
            req,
            f"out of memory: {need} more tokens do not fit in the free pools "
            f"(full {full}, SWA {swa} tokens free after evicting the prefix cache)",
        )
    return batch
