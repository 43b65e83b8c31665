"""The device half of the engine: one upload, one dispatch and one read per step.

`DeviceRunner` owns the device state (allocator, `req_to_token`, KV pools). `run(plan)` pads the
scheduler's plan to a few bucket shapes, uploads it with one `device_put`, runs `commit_step`
(releases, allocation, req_to_token tail, metadata) and the model's forward-and-sample as ONE
jitted program (`programs.fused_step`), and reads the step's result (status, new slots, free
counts, sampled tokens and logprobs) with one `device_get`. Under a mesh (tensor parallel, one
process or several) the runner's state and uploads are replicated over it: every device runs
the same bookkeeping beside its share of the model, and the read takes this process's replica.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import jax
import numpy as np

from swajax.attention.metadata import metadata_shape
from swajax.memory import allocator as A
from swajax.memory.compilations import compilation_count
from swajax.memory.padding import bucket, pad
from swajax.memory.req_to_token import ReqToToken
from swajax.models.multi_step import round_shape
from swajax.models.sampling import SampleMode, init_penalties
from swajax.observe import Observer, observed
from swajax.runner.commit import (
    FREE_FULL,
    FREE_SWA,
    OUT_FREE_FULL,
    OUT_FREE_SWA,
    OUT_SLOTS,
    OUT_STATUS,
    REPOINT,
    StepInputs,
    apply_releases,
    commit_step,
)
from swajax.runner.host_kv import HostKV, run_loads
from swajax.runner.packing import pack
from swajax.runner.programs import (
    fill_placeholders,
    fused_round,
    fused_step,
    fused_verify,
)
from swajax.runner.readback import read
from swajax.runner.step_inputs import MIN_TOKENS, offset, pad_forward, seed_arrays
from swajax.serving import overlap
from swajax.serving.batch import Releases, StepKind, StepPlan, StepResult
from swajax.sizing import PoolMode, PoolSizes

MIN_REQS, MIN_EDITS = 8, 64


class Dispatched(NamedTuple):
    """A launched step whose result has not been read: device arrays (JAX runs ahead); or, for
    a model outside the fused program, a step already run and read (`result`)."""

    plan: StepPlan
    out: jax.Array
    sampled: tuple
    result: StepResult | None = None


def _mode(plan: StepPlan) -> SampleMode:
    return SampleMode(plan.penalize, plan.top_logprobs)


class DeviceRunner:
    observer: Observer | None = None  # swajax.observe: a recorder, if any

    def __init__(self, model, sizes: PoolSizes, *, max_running: int, max_context: int, window: int,
                 draft=None):  # fmt: skip
        """`draft` (a `HybridLM` or None) proposes the tokens of each plan's `lookahead`."""
        self.model, self.window, self.draft = model, window, draft
        full = sizes.swa_tokens if sizes.mode is PoolMode.ALL_SWA else sizes.full_tokens
        self.placement = model.state_sharding  # None: the default device
        self.alloc = self._place(
            A.init_allocator(full, sizes.swa_tokens, sizes.page_size, sizes.mode)
        )
        self.r2t = None
        if model.needs_kv:
            self.r2t = self._place(ReqToToken.init(max_running, max_context))
        # Batches pad to MIN_REQS rows (fewer programs as a batch grows) but never past what can
        # run at once: a single-stream engine decodes one row, not eight.
        self.min_reqs = min(MIN_REQS, bucket(max_running, 1))
        self.pools = model.init_pools(sizes) if model.needs_kv else None
        # A prefix cache's host tier: the bytes (None without pools: only pages are counted).
        self.host_kv = None
        if sizes.host_full_tokens and self.pools is not None:
            ps = sizes.page_size
            self.host_kv = HostKV(
                self.pools, sizes.host_full_tokens // ps, sizes.host_swa_tokens // ps
            )
        # The draft's KV sits at the same slots, in buffers of its own layers.
        self.draft_pools = draft.init_pools(sizes) if draft is not None else None
        # Per-row token counts for the penalties: allocated by the first step that needs them.
        self.penalties, self._rows = None, max_running
        self._compiles0 = compilation_count()
        self._edits: dict[bool, int] = {}  # edit bucket high-water marks (see `_inputs`)

    def compilations(self) -> int:
        """XLA compilations since this runner was made (process-wide counter)."""
        return compilation_count() - self._compiles0

    # ------------------------------------------------------------------------------------------

    def apply_releases(self, releases: tuple[Releases, ...], transfers=()) -> None:
        """Apply queued releases now (segments in order), without a step, with a host tier's
        copies each in its place among them."""
        for i, seg in enumerate(releases):
            self._copy([t for t in transfers if t.after == i])
            if seg.empty:
                continue
            f = bucket(max(len(seg.swa), len(seg.full)), MIN_EDITS)
            m = bucket(len(seg.move_dst), MIN_EDITS)
            args = [pad(a, n) for a, n in ((seg.swa, f), (seg.full, f))]
            args += [pad(seg.move_dst, m), pad(seg.move_src, m)]
            self.alloc = apply_releases(self.alloc, *jax.device_put(args, self.placement))
        self._copy([t for t in transfers if t.after >= len(releases)])

    def _copy(self, transfers) -> None:
        """A host tier's copies, in order: runs of saves (a gather whose bytes land on the host
        later) and of loads (one program each)."""
        for kind, run in itertools.groupby(transfers, key=lambda t: t.kind):
            run = list(run)
            if kind == "load":
                if self.host_kv is not None:
                    self.host_kv.settle()  # a load may read what a save just wrote
                self.alloc, self.pools = run_loads(
                    self.alloc, self.pools, self.host_kv, run, self.placement
                )
            elif self.host_kv is not None:
                self.host_kv.save(self.alloc, self.pools, run)

    def _inputs(self, plan: StepPlan, last: Releases) -> dict[str, np.ndarray]:
        r = bucket(len(plan.requests), self.min_reqs)
        rp = plan.repoint
        n = rp.ends - rp.starts
        kinds = np.concatenate(
            [
                np.full(len(last.swa), FREE_SWA),
                np.full(len(last.full), FREE_FULL),
                np.full(rp.num_tokens, REPOINT),
            ]
        )
        pos = [np.arange(a, b) for a, b in zip(rp.starts, rp.ends)]
        # The edit bucket only grows, per step kind: runtime eviction releases a few pages more
        # or fewer per round as windows cross page boundaries, and a bucket that followed each
        # round would flap between two programs. Decode steps keep their own mark, so a long
        # prefix hit's re-pointed tokens (an extend step) do not pad every later decode step.
        key = plan.kind is StepKind.DECODE
        e = self._edits[key] = max(self._edits.get(key, MIN_EDITS), bucket(len(kinds), MIN_EDITS))
        no_slot = np.zeros(len(last.swa) + len(last.full), np.int32)
        inputs = StepInputs(
            rows=pad(plan.rows, r),
            prefix_lens=pad(plan.prefix_lens, r),
            seq_lens=pad(plan.seq_lens, r),
            last_loc=pad(plan.last_loc, r, -1),
            num_reqs=np.int32(len(plan.requests)),
            edit_kind=pad(kinds, e),
            edit_slot=pad(np.concatenate([last.swa, last.full, rp.slots]), e),
            edit_row=pad(np.concatenate([no_slot, np.repeat(rp.rows, n)]), e),
            edit_pos=pad(np.concatenate([no_slot, *pos]), e),
        )
        return inputs._asdict()

    @property
    def supports_overlap(self) -> bool:
        """Whether a step can be launched before the previous one's result is read: a fused
        model's, or the null model's when asked to emulate it (what the allocator sees is the
        same; `serving.overlap.resolved` fills the placeholders on the host)."""
        if self.model.fused_forward is None:
            return not self.model.needs_kv and self.model.overlap
        return self.model.needs_kv

    @property
    def supports_rounds(self) -> bool:
        """Whether a decode round (N positions per request) can run: in the fused program, or
        emulated by a model without KV (the null model)."""
        return self.model.fused_forward is not None or not self.model.needs_kv

    def run(self, plan: StepPlan) -> StepResult:
        """One step, launched and read. If it raises, the device state is as if the step had
        only applied its releases (the host counted those): the new pages are given back."""
        step = self.dispatch(plan)
        try:
            return self.collect(step)
        except Exception:
            self.discard(step)
            raise

    @observed
    def collect(self, step: Dispatched) -> StepResult:
        """Read a launched step's result: the step's one read."""
        if step.result is not None:  # run in `dispatch` (a model outside the fused program)
            return step.result
        out, sampled = read((step.out, step.sampled))
        if self.host_kv is not None:
            self.host_kv.settle()  # the saves ran before the step: their bytes are there
        return self._result(step.plan, out, sampled)

    @observed
    def discard(self, step: Dispatched) -> None:
        """A launched step whose result will not be taken (reading it failed): give back the
        pages it took, so the device state is as if it had only applied its releases (which
        the host counted). Steps launched after it are discarded first."""
        self._roll_back(step.plan, step.out)

    def _split_releases(self, plan: StepPlan) -> Releases:
        """Apply what must run before the step's program: a host tier's copies (with loads,
        every release first), and releases a move orders; returns the releases left for the
        step's own commit."""
        if plan.transfers:  # (rare: a step that evicts to or loads from the host)
            self.apply_releases(plan.releases, plan.transfers)
            return Releases()
        releases = list(plan.releases)
        last = releases.pop() if releases and not releases[-1].has_moves else Releases()
        self.apply_releases(tuple(releases))  # only when a move forces an order (rare)
        return last

    @observed
    def dispatch(self, plan: StepPlan, after: Dispatched | None = None) -> Dispatched:
        """Upload and launch one step of a fused model without waiting for it; `after`: the
        step launched before, whose sampled tokens this plan's placeholders name. If it raises,
        the step never ran: its releases are applied on their own. A model outside the fused
        program runs the whole step here (`collect` then hands its result back)."""
        fused = self.model.fused_forward
        if fused is None:
            if after is not None:
                plan = overlap.resolved(plan, after.plan, after.result)
            return self._run_unfused(plan)
        last = self._split_releases(plan)
        try:
            packed, commit = self._prepare(plan, last)
            draft = self.draft.fused_forward if self.draft is not None else None
            d_state = self.draft.params if self.draft is not None else None
            pen = self._penalties(plan)
            state = (self.alloc, self.r2t, self.pools, self.draft_pools, pen)
            if plan.lookahead and not plan.speculative:  # multi-step decode
                shape = round_shape(plan.prefix_lens, plan.seq_lens,
                                    page_size=self.alloc.page_size, window=self.window,
                                    min_tokens=self.min_reqs)  # fmt: skip
                step = functools.partial(fused_round, steps=plan.lookahead + 1, shape=shape)
            elif plan.lookahead:
                step = functools.partial(
                    fused_verify, k=plan.lookahead, draft_shapes=self._draft_shapes(plan)
                )
            else:
                step = functools.partial(fused_step, return_logits=plan.return_logits)
            if after is not None:
                start, size = offset(commit["layout"], "tokens")
                packed = fill_placeholders(packed, after.sampled[0], start=start, size=size)
            *state, out, sampled = step(
                *state, packed, self.model.params, d_state, forward=fused, draft=draft,
                mode=_mode(plan), **commit,
            )  # fmt: skip
            self.alloc, self.r2t, self.pools, self.draft_pools, pen = state
            if pen is not None:
                self.penalties = pen
        except Exception:  # raised before the program ran: the device state is untouched
            self.apply_releases((last,))
            raise
        return Dispatched(plan, out, sampled)

    def _penalties(self, plan: StepPlan):
        """The token counts if this step penalizes (made on first use), else None."""
        if not plan.penalize or self.model.vocab_size is None:
            return None
        if self.penalties is None:
            self.penalties = self._place(init_penalties(self._rows, self.model.vocab_size))
        return self.penalties

    def _run_unfused(self, plan: StepPlan) -> Dispatched:
        """A model outside the fused program (without KV: the null model)."""
        last = self._split_releases(plan)
        if self.draft is not None:
            raise ValueError("a speculative draft needs a model in the fused step")
        try:
            out = self._commit(plan, last)
        except Exception:
            self.apply_releases((last,))
            raise
        try:
            out = jax.device_get(out)
            if plan.lookahead:  # the model emulates the round
                sampled = self.model.verify(plan, plan.lookahead)
            else:
                fwd = pad_forward(plan.forward, len(plan.forward.tokens))
                sampled = self.model.forward_and_sample(None, fwd, None, return_logits=False)[2]
        except Exception:
            self._roll_back(plan, out)
            raise
        return Dispatched(plan, out, sampled, self._result(plan, out, sampled))

    def _place(self, tree):
        """`tree` where the runner keeps its state: as made (the default device), or
        replicated over the model's mesh (through the host: across processes a device array
        cannot be copied to another process's device, while every process holds the same
        host values)."""
        if self.placement is None:
            return tree
        return jax.device_put(jax.device_get(tree), self.placement)

    def _draft_shapes(self, plan: StepPlan):
        """The metadata shapes of a round's k + 1 single-token draft forwards."""
        ps = self.alloc.page_size
        return tuple(
            metadata_shape(
                plan.prefix_lens + j, plan.prefix_lens + j + 1, page_size=ps, window=self.window
            )  # fmt: skip
            for j in range(plan.lookahead + 1)
        )

    def _result(self, plan: StepPlan, out, sampled) -> StepResult:
        new = plan.num_new_tokens
        if plan.lookahead:  # a verify round: every row of every request, and the accepted counts
            n = len(plan.requests)
            tokens, logprobs, accepted = (np.asarray(x)[:n] for x in sampled)
            return StepResult(
                status=int(out[OUT_STATUS]), slots=out[OUT_SLOTS : OUT_SLOTS + new],
                free_full=int(out[OUT_FREE_FULL]), free_swa=int(out[OUT_FREE_SWA]),
                tokens=tokens, logprobs=logprobs, accepted=accepted,
            )  # fmt: skip
        tokens, logprobs, logits, top_ids, top_lp = sampled
        s, k = len(plan.forward.sample_index), len(plan.forward.logit_index)
        return StepResult(
            status=int(out[OUT_STATUS]),
            slots=out[OUT_SLOTS : OUT_SLOTS + new],
            free_full=int(out[OUT_FREE_FULL]),
            free_swa=int(out[OUT_FREE_SWA]),
            tokens=np.asarray(tokens)[:s],
            logprobs=np.asarray(logprobs)[:s],
            logits=None if logits is None else np.asarray(logits)[:k],
            top_ids=None if top_ids is None else np.asarray(top_ids)[:s],
            top_logprobs=None if top_lp is None else np.asarray(top_lp)[:s],
        )

    def _prepare(self, plan: StepPlan, last: Releases):
        """The step's one upload (every input packed in one int32 buffer) and the static
        arguments of `commit_step`."""
        decode = plan.kind is StepKind.DECODE and not plan.lookahead  # a round extends
        num_tokens = 0 if decode else bucket(plan.num_new_tokens, MIN_TOKENS)  # static
        shape = None
        if self.model.needs_kv:
            # A decode step's rows pad like its requests: a batch one request larger or smaller
            # (a request that ended while an overlapped step ran) keeps the program, and so
            # every other row's numerics.
            shape = metadata_shape(
                plan.prefix_lens, plan.seq_lens, page_size=self.alloc.page_size,
                window=self.window, min_tokens=self.min_reqs if decode else 1,
            )  # fmt: skip
        fwd = pad_forward(
            plan.forward,
            shape.num_tokens if shape else len(plan.forward.tokens),
            self.min_reqs if decode or plan.lookahead else 1,  # a round: one row per request
        )
        arrays = self._inputs(plan, last)
        if self.model.needs_kv:  # the model's inputs ride in the same buffer
            arrays.update(fwd._asdict())
            if plan.full_src is not None:
                arrays["full_src"] = pad(plan.full_src, shape.num_tokens)
            if plan.lookahead:
                arrays["verify_rows"] = pad(plan.rows, len(arrays["rows"]))
            arrays.update(seed_arrays(plan))
        packed, layout = pack(arrays)
        commit = dict(layout=layout, decode=decode, num_tokens=num_tokens, meta_shape=shape)
        return jax.device_put(packed, self.placement), commit

    def _commit(self, plan: StepPlan, last: Releases):
        """The bookkeeping half of a step alone (a model outside the fused program)."""
        packed, commit = self._prepare(plan, last)
        self.alloc, self.r2t, out, _, _ = commit_step(self.alloc, self.r2t, packed, **commit)
        return out

    def _roll_back(self, plan: StepPlan, out) -> None:
        """Free the pages the step took (not the tail of a page a request already held)."""
        out = read(out)
        if int(out[OUT_STATUS]) != A.OK:
            return  # nothing was taken
        slots, ps, start, fresh = out[OUT_SLOTS:], self.alloc.page_size, 0, []
        for pre, seq in zip(plan.prefix_lens, plan.seq_lens):
            n, tail = int(seq - pre), int(-pre % ps)
            fresh.append(slots[start + min(tail, n) : start + n])
            start += n
        self.apply_releases((Releases(full=np.concatenate(fresh).astype(np.int32)),))
