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

import itertools

import jax
import numpy as np

from swajax.arith import bucket
from swajax.attention.metadata import metadata_shape
from swajax.memory import allocator as A
from swajax.memory.compilations import compilation_count
from swajax.memory.padding import pad
from swajax.memory.req_to_token import ReqToToken
from swajax.models.multi_step import round_shape
from swajax.models.sampling import SampleMode, init_penalties
from swajax.observe import Observer, observed
from swajax.runner.commit import FREE_FULL, FREE_SWA, REPOINT, StepInputs, apply_releases
from swajax.runner.host_kv import HostKV, run_loads
from swajax.runner.packing import pack
from swajax.runner.program_store import ProgramStore, recording_now, store_folder
from swajax.runner.programs import (
    fill_placeholders,
    fused_round,
    fused_step,
    fused_verify,
)
from swajax.runner.readback import read
from swajax.runner.step_inputs import MIN_TOKENS, offset, pad_forward, seed_arrays
from swajax.runner.step_result import OUT_STATUS, Dispatched, fresh_slots, step_result
from swajax.serving.batch import Releases, StepKind, StepPlan, StepResult
from swajax.sizing import PoolMode, PoolSizes

MIN_REQS, MIN_EDITS = 8, 64


def _mode(plan: StepPlan) -> SampleMode:
    """The step's static sampling: an all-greedy batch compiles no drawing at all."""
    draw = bool(np.any(plan.forward.temperature > 0))
    s = plan.sampling
    return SampleMode(s.penalize, s.top_logprobs, draw, s.rules)


class DeviceRunner:
    observer: Observer | None = None  # swajax.observe: a recorder, if any

    def __init__(
        self,
        model,
        sizes: PoolSizes,
        *,
        max_running: int,
        max_context: int,
        window: int,
        draft=None,
    ):
        """`model`: one that runs inside the fused step (a `HybridLM`; the null model runs on
        `HostRunner`). `draft` (a `HybridLM` or None) proposes the tokens of each plan's
        `lookahead`."""
        if model.fused_forward is None:
            raise ValueError("DeviceRunner needs a model with a fused forward; use HostRunner")
        self.model, self.window, self.draft = model, window, draft
        self.sizes, self._rows, self._context = sizes, max_running, max_context
        self.placement = model.state_sharding  # None: the default device
        # Batches pad to MIN_REQS rows (fewer programs as a batch grows) but never past what can
        # run at once: a single-stream engine decodes one row, not eight.
        self.min_reqs = min(MIN_REQS, bucket(max_running, 1))
        self.reset()
        self._compiles0 = compilation_count()
        # Compiled step programs kept on disk beside the compilation cache (a warm start does
        # not trace them); a split model's programs compile through jit as usual.
        folder = store_folder() if self.placement is None else None
        self.programs = ProgramStore(folder, jax.devices()[0])
        # Edit bucket high-water marks (see `_inputs`); a snapshot keeps them.
        self.edit_buckets: dict[bool, int] = {}

    def reset(self) -> None:
        """The device state as made: every page free, empty pools, no token counts. What the
        engine rebuilds from when a step was interrupted (its inputs may have been donated to
        a program whose outputs were never taken)."""
        sizes = self.sizes
        full = sizes.swa_tokens if sizes.mode is PoolMode.ALL_SWA else sizes.full_tokens
        self.alloc = self._place(
            A.init_allocator(full, sizes.swa_tokens, sizes.page_size, sizes.mode)
        )
        self.r2t = self._place(ReqToToken.init(self._rows, self._context))
        self.pools = None  # the old pools go first: two sets may not fit
        self.pools = self.model.init_pools(sizes)
        # A prefix cache's host tier: the bytes.
        self.host_kv = None
        if sizes.host_full_tokens:
            ps = sizes.page_size
            self.host_kv = HostKV(
                self.pools, sizes.host_full_tokens // ps, sizes.host_swa_tokens // ps
            )
        # The draft's KV sits at the same slots, in buffers of its own layers.
        self.draft_pools = None
        if self.draft is not None:
            self.draft_pools = self.draft.draft_state(sizes, self._rows)
        # Per-row token counts for the penalties: allocated by the first step that needs them.
        self.penalties = None

    def device_state(self, *, penalties: bool | None = None) -> dict:
        """What a snapshot saves of the device (`swajax.api.state`): the allocator, the request
        table, the KV pools (the draft's too) and the penalties' token counts once a step made
        them (`penalties=True`: made now, the shape a snapshot with them restores into)."""
        if penalties and self.penalties is None:
            self.allocate_penalties()
        state = dict(alloc=self.alloc, r2t=self.r2t, pools=self.pools)
        if self.draft_pools is not None:
            state["draft_pools"] = self.draft_pools
        if self.penalties is not None and penalties is not False:
            state["penalties"] = self.penalties
        return state

    def load_device_state(self, state: dict) -> None:
        """Take a snapshot's device state (the same pytrees, shapes and placements)."""
        self.alloc, self.r2t, self.pools = state["alloc"], state["r2t"], state["pools"]
        if self.draft_pools is not None:
            self.draft_pools = state["draft_pools"]
        self.penalties = state.get("penalties", self.penalties)

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
            self.alloc = apply_releases(self.alloc, *self._upload(args))
        self._copy([t for t in transfers if t.after >= len(releases)])

    def _copy(self, transfers) -> None:
        """A host tier's copies, in order: runs of saves (a gather whose bytes land on the host
        later) and of loads (one program each)."""
        for kind, run in itertools.groupby(transfers, key=lambda t: t.kind):
            run = list(run)
            if kind == "load":
                self.host_kv.settle()  # a load may read what a save just wrote
                self.alloc, self.pools = run_loads(
                    self.alloc, self.pools, self.host_kv, run, self.placement
                )
            else:
                self.host_kv.save(self.alloc, self.pools, run)

    def _inputs(self, plan: StepPlan, last: Releases) -> dict[str, np.ndarray]:
        r = bucket(len(plan.requests), self.min_reqs)
        rp = plan.memory.repoint
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
        e = self.edit_buckets[key] = max(
            self.edit_buckets.get(key, MIN_EDITS), bucket(len(kinds), MIN_EDITS)
        )
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

    # A fused model's step can be launched before the previous one's result is read, and a
    # decode round (N positions per request) runs inside its program.
    supports_overlap = supports_rounds = True
    # Rounds of 8 by default: a plain step's host part (plan, pack, upload, read) is paid once
    # per round (BUILD_NOTES.md, "Multi-step decode").
    default_decode_steps = 8

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
        out, sampled = read((step.out, step.sampled))
        if self.host_kv is not None:
            self.host_kv.settle()  # the saves ran before the step: their bytes are there
        return step_result(step.plan, out, sampled)

    @observed
    def discard(self, step: Dispatched) -> None:
        """A launched step whose result will not be taken (reading it failed): give back the
        pages it took, so the device state is as if it had only applied its releases (which
        the host counted). Steps launched after it are discarded first."""
        if not self.state_lost():  # else nothing to give back: the engine resets the state
            self._roll_back(step.plan, step.out)

    def _split_releases(self, plan: StepPlan) -> Releases:
        """Apply what must run before the step's program: a host tier's copies (with loads,
        every release first), and releases a move orders; returns the releases left for the
        step's own commit."""
        if plan.memory.transfers:  # (rare: a step that evicts to or loads from the host)
            self.apply_releases(plan.memory.releases, plan.memory.transfers)
            return Releases()
        releases = list(plan.memory.releases)
        last = releases.pop() if releases and not releases[-1].has_moves else Releases()
        self.apply_releases(tuple(releases))  # only when a move forces an order (rare)
        return last

    @observed
    def dispatch(self, plan: StepPlan, after: Dispatched | None = None) -> Dispatched:
        """Upload and launch one step of a fused model without waiting for it; `after`: the
        step launched before, whose sampled tokens this plan's placeholders name. If it raises,
        the step never ran: its releases are applied on their own."""
        fused = self.model.fused_forward
        last = self._split_releases(plan)
        try:
            packed, commit = self._prepare(plan, last)
            draft = self.draft.fused_forward if self.draft is not None else None
            d_state = self.draft.params if self.draft is not None else None
            pen = self._penalties(plan)
            state = (self.alloc, self.r2t, self.pools, self.draft_pools, pen)
            if plan.round.lookahead and not plan.round.speculative:  # multi-step decode
                shape = round_shape(
                    plan.prefix_lens,
                    plan.seq_lens,
                    page_size=self.alloc.page_size,
                    window=self.window,
                    min_tokens=self.min_reqs,
                )
                step, extra = fused_round, dict(steps=plan.round.lookahead + 1, shape=shape)
            elif plan.round.lookahead:
                step = fused_verify
                extra = dict(
                    k=plan.round.lookahead,
                    draft_shapes=self._draft_shapes(plan),
                    return_logits=plan.sampling.return_logits,
                )
            else:
                step, extra = fused_step, dict(return_logits=plan.sampling.return_logits)
            if after is not None:
                start, size = offset(commit["layout"], "tokens")
                accepted = after.sampled[2] if after.plan.round.lookahead else None  # a round's
                packed = fill_placeholders(
                    packed, after.sampled[0], accepted, start=start, size=size
                )
            statics = dict(forward=fused, draft=draft, mode=_mode(plan), **extra, **commit)
            args = (*state, packed, self.model.params, d_state)
            *state, out, sampled = self.programs.call(step, args, statics)
            self.alloc, self.r2t, self.pools, self.draft_pools, pen = state
            if pen is not None:
                self.penalties = pen
        except Exception:
            if not self.state_lost():  # raised before the program ran: the state is untouched
                self.apply_releases((last,))
            raise
        return Dispatched(plan, out, sampled)

    def state_lost(self) -> bool:
        """Whether a program took the device state (its inputs are donated) and its outputs
        never reached the runner: only `reset` brings the state back."""
        state = (self.alloc, self.r2t, self.pools, self.draft_pools, self.penalties)
        return any(x.is_deleted() for x in jax.tree.leaves(state) if isinstance(x, jax.Array))

    def _penalties(self, plan: StepPlan):
        """The token counts if this step penalizes (made on first use), else None."""
        if not plan.sampling.penalize or self.model.vocab_size is None:
            return None
        if self.penalties is None:
            self.allocate_penalties()
        return self.penalties

    def allocate_penalties(self) -> None:
        """The per-row token counts the penalties read, all zero."""
        self.penalties = self._place(init_penalties(self._rows, self.model.vocab_size))

    def _place(self, tree):
        """`tree` where the runner keeps its state: as made (the default device), or
        replicated over the model's mesh (through the host: across processes a device array
        cannot be copied to another process's device, while every process holds the same
        host values)."""
        if self.placement is None or recording_now():
            return tree
        return jax.device_put(jax.device_get(tree), self.placement)

    def _upload(self, tree):
        """Host values to where the runner's programs read them; left on the host while the
        programs are only recorded (their devices may be another machine's: `swajax.tpu`)."""
        return tree if recording_now() else jax.device_put(tree, self.placement)

    def _draft_shapes(self, plan: StepPlan):
        """The metadata shapes of a round's k + 1 single-token draft forwards."""
        ps = self.alloc.page_size
        return tuple(
            metadata_shape(
                plan.prefix_lens + j, plan.prefix_lens + j + 1, page_size=ps, window=self.window
            )
            for j in range(plan.round.lookahead + 1)
        )

    def _prepare(self, plan: StepPlan, last: Releases):
        """The step's one upload (every input packed in one int32 buffer) and the static
        arguments of `commit_step`."""
        decode = plan.kind is StepKind.DECODE and not plan.round.lookahead  # a round extends
        num_tokens = 0 if decode else bucket(plan.num_new_tokens, MIN_TOKENS)  # static
        # A decode step's rows pad like its requests: a batch one request larger or smaller (a
        # request that ended while an overlapped step ran) keeps the program, and so every
        # other row's numerics.
        shape = metadata_shape(
            plan.prefix_lens,
            plan.seq_lens,
            page_size=self.alloc.page_size,
            window=self.window,
            min_tokens=self.min_reqs if decode else 1,
        )
        fwd = pad_forward(
            plan.forward,
            shape.num_tokens,
            self.min_reqs if decode or plan.round.lookahead else 1,  # a round: one row per request
        )
        arrays = self._inputs(plan, last)
        arrays.update(fwd._asdict())  # the model's inputs ride in the same buffer
        if plan.memory.full_src is not None:
            arrays["full_src"] = pad(plan.memory.full_src, shape.num_tokens)
        if plan.round.lookahead or self.draft is not None:
            arrays["request_rows"] = pad(plan.rows, len(arrays["rows"]))
        arrays.update(seed_arrays(plan))
        packed, layout = pack(arrays)
        commit = dict(layout=layout, decode=decode, num_tokens=num_tokens, meta_shape=shape)
        return self._upload(packed), commit

    def _roll_back(self, plan: StepPlan, out) -> None:
        """Free the pages the step took (not the tail of a page a request already held)."""
        out = read(out)
        if int(out[OUT_STATUS]) != A.OK:
            return  # nothing was taken
        self.apply_releases((Releases(full=fresh_slots(plan, out, self.alloc.page_size)),))
