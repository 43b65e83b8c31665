"""The engine's runner for a model that reads no KV (the null model): every step's bookkeeping on
the host, with `memory.host_allocator`, and no device program at all.

It fulfils the same `Runner` contract as `DeviceRunner` and hands out the same slots (the host
allocator is the device one page for page), so an engine over the null model plans, evicts and
records traces exactly as one over the device allocator would, without compiling a program per
pool size or dispatching one per step: what lets `simulate` and `plan` sweep pool sizes and run
long workloads quickly.
"""

from __future__ import annotations

import itertools

import numpy as np

from swajax.memory.allocator import OK
from swajax.memory.host_allocator import HostAllocator
from swajax.observe import Observer, observed
from swajax.runner.step_result import OUT_STATUS, Dispatched, fresh_slots, step_result
from swajax.serving import overlap
from swajax.serving.batch import Releases, StepKind, StepPlan, StepResult
from swajax.sizing import PoolMode, PoolSizes


class HostRunner:
    observer: Observer | None = None  # swajax.observe: a recorder, if any
    supports_rounds = True  # the model emulates a decode round (`verify`)
    # Plain steps unless asked: the null model stands for an accelerator's steps, with no host
    # part to amortize, and its traces follow SGLang's one decode allocation per token.
    default_decode_steps = 1

    def __init__(self, model, sizes: PoolSizes, *, draft=None):
        if model.needs_kv:
            raise ValueError("HostRunner runs models that read no KV; use DeviceRunner")
        if draft is not None:
            raise ValueError("a speculative draft needs a model in the fused step")
        self.model, self.sizes = model, sizes
        self.reset()

    def state_lost(self) -> bool:
        """Never: the host allocator takes no donated inputs."""
        return False

    def reset(self) -> None:
        """Every page free, as made (the engine's recovery from an interrupted step)."""
        sizes = self.sizes
        full = sizes.swa_tokens if sizes.mode is PoolMode.ALL_SWA else sizes.full_tokens
        self.alloc = HostAllocator(full, sizes.swa_tokens, sizes.page_size, sizes.mode)

    @property
    def supports_overlap(self) -> bool:
        """Overlap emulated when the model asks for it: the allocator sees what a fused model's
        would (`serving.overlap.resolved` fills the placeholders from the previous result)."""
        return bool(self.model.overlap)

    def compilations(self) -> int:
        return 0  # no device program runs here

    def apply_releases(self, releases: tuple[Releases, ...], transfers=()) -> None:
        """Release segments in order (frees, then moves, as one device release does), with a
        host tier's loads each in its place among them (saves copy nothing: there is no KV)."""
        for i, seg in enumerate(releases):
            self._load([t for t in transfers if t.after == i])
            self.alloc.release(seg.swa, seg.full)
            if seg.has_moves:
                self.alloc.move_swa(seg.move_dst, seg.move_src)
        self._load([t for t in transfers if t.after >= len(releases)])

    def _load(self, transfers) -> None:
        """A load takes the full pages the host chose, then pairs SWA pages: run by run, as
        `memory.host_copy.load_pages` does."""
        ps = self.alloc.page_size
        for kind, run in itertools.groupby(transfers, key=lambda t: t.kind):
            if kind != "load":
                continue
            pages = {"full": [], "swa": []}
            for t in run:
                pages[t.pool].append(np.asarray(t.slots[::ps]) // ps)
            self.alloc.claim(np.concatenate(pages["full"] or [np.zeros(0, np.int64)]))
            self.alloc.pair(np.concatenate(pages["swa"] or [np.zeros(0, np.int64)]))

    def run(self, plan: StepPlan) -> StepResult:
        """One step, launched and read (as `DeviceRunner.run`)."""
        return self.collect(self.dispatch(plan))

    @observed
    def dispatch(self, plan: StepPlan, after: Dispatched | None = None) -> Dispatched:
        """Run the whole step now (`collect` hands its result back). `after`: the step launched
        before, whose sampled tokens and slots fill this plan's placeholders."""
        if after is not None:
            plan = overlap.resolved(plan, after.plan, after.result)
        self.apply_releases(plan.memory.releases, plan.memory.transfers)
        if plan.kind is StepKind.DECODE and not plan.round.lookahead:  # a round extends
            status, slots = self.alloc.alloc_decode(plan.seq_lens, plan.last_loc)
        else:
            status, slots = self.alloc.alloc_extend(plan.prefix_lens, plan.seq_lens, plan.last_loc)
        out = np.concatenate([[status, *self.alloc.available()], slots]).astype(np.int32)
        try:
            if plan.round.lookahead:  # the model emulates the round
                sampled = self.model.verify(plan, plan.round.lookahead)
            else:
                sampled = self.model.forward_and_sample(None, plan.forward, None)[2]
        except Exception:
            self._roll_back(plan, out)
            raise
        return Dispatched(plan, out, sampled, step_result(plan, out, sampled))

    @observed
    def collect(self, step: Dispatched) -> StepResult:
        return step.result

    @observed
    def discard(self, step: Dispatched) -> None:
        """A step whose result will not be taken: give back the pages it took."""
        self._roll_back(step.plan, step.out)

    def _roll_back(self, plan: StepPlan, out: np.ndarray) -> None:
        if int(out[OUT_STATUS]) == OK:
            self.alloc.free(fresh_slots(plan, out, self.alloc.page_size))
