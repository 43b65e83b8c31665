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
from swajax.attention.metadata import full_pages_bucket, metadata_shape
from swajax.memory import allocator as A
from swajax.memory.compilations import compilation_count
from swajax.memory.padding import pad
from swajax.memory.req_to_token import ReqToToken
from swajax.models.multi_step import round_shape
from swajax.models.sampling import SampleMode, init_penalties
from swajax.observe import Observer, observed
from swajax.runner.commit import (
    FREE_FULL,
    FREE_SWA,
    REPOINT,
    StepInputs,
    apply_releases,
    repoint,
)
from swajax.runner.host_kv import HostKV, run_loads
from swajax.runner.packing import pack
from swajax.runner.program_store import ProgramStore, recording_now, store_folder
from swajax.runner.programs import (
    fill_placeholders,
    fused_round,
    fused_step,
    fused_verify,
    seed_only,
)
from swajax.runner.readback import read
from swajax.runner.step_inputs import (
    DROP,
    MIN_TOKENS,
    offset,
    pad_forward,
    seed_arrays,
    seed_chunks,
)
from swajax.runner.step_result import OUT_STATUS, Dispatched, fresh_slots, step_result
from swajax.runner.step_shapes import RULE_WIDTH, SEED_CHUNK, FixedShapes
from swajax.serving.batch import (
    ForwardBatch,
    Releases,
    Round,
    SamplingOps,
    StepKind,
    StepPlan,
    StepResult,
    sampling_fields,
)
from swajax.sizing import PoolMode, PoolSizes

MIN_REQS, MIN_EDITS = 8, 64


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
        self.fixed: FixedShapes | None = None  # a server's step shapes (`fix_shapes`)

    def fix_shapes(
        self, *, chunk_tokens: int, max_logprobs: int, decode_steps: int, draft_tokens: int
    ) -> None:
        """Take a server's fixed step shapes (runner/step_shapes.py) from now on: the programs
        a step can need are then `self.fixed.keys()`, which `warm_up` compiles. The store keeps
        them all alive (a dropped one would be read back, and JAX's small programs traced
        again, in the serving loop)."""
        self.fixed = shapes = FixedShapes(
            page_size=self.sizes.page_size,
            window=self.window,
            min_reqs=self.min_reqs,
            max_running=self._rows,
            max_context=self._context,
            chunk_tokens=chunk_tokens,
            max_logprobs=max_logprobs,
            decode_steps=decode_steps,
            draft_tokens=draft_tokens,
            vocab=self.model.vocab_size is not None,
        )
        self.programs.max_live = max(self.programs.max_live, len(list(shapes.keys())) + 8)

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
            if self.fixed is not None:
                self._release_fixed(seg)
                continue
            f = bucket(max(len(seg.swa), len(seg.full)), MIN_EDITS)
            m = bucket(len(seg.move_dst), MIN_EDITS)
            args = [pad(a, n) for a, n in ((seg.swa, f), (seg.full, f))]
            args += [pad(seg.move_dst, m), pad(seg.move_src, m)]
            self.alloc = apply_releases(self.alloc, *self._upload(args))
        self._copy([t for t in transfers if t.after >= len(releases)])

    def _release_fixed(self, seg: Releases) -> None:
        """One segment in calls of the fixed edit size: its SWA frees, then its full frees,
        then its moves (the order one call keeps), each in chunks."""
        e, none = self.fixed.edits, np.zeros(0, np.int32)
        parts = [(x, none, none, none) for x in _chunks(seg.swa, e)]
        parts += [(none, x, none, none) for x in _chunks(seg.full, e)]
        parts += [
            (none, none, d, s) for d, s in zip(_chunks(seg.move_dst, e), _chunks(seg.move_src, e))
        ]
        for part in parts:
            self.alloc = apply_releases(self.alloc, *self._upload([pad(x, e) for x in part]))

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
        r = self._request_rows(plan)
        rows, pos, slots = _repointed(plan)
        if self.fixed is not None:  # what the step cannot carry is written first
            e = self.fixed.edits
            head = len(slots) - (e - len(last.swa) - len(last.full))
            for lo in range(0, max(head, 0), e):
                hi = min(lo + e, head)
                args = [pad(rows[lo:hi], e, DROP), pad(pos[lo:hi], e), pad(slots[lo:hi], e)]
                self.r2t = repoint(self.r2t, *self._upload(args))
            rows, pos, slots = (x[max(head, 0) :] for x in (rows, pos, slots))
        kinds = np.concatenate(
            [
                np.full(len(last.swa), FREE_SWA),
                np.full(len(last.full), FREE_FULL),
                np.full(len(slots), REPOINT),
            ]
        )
        if self.fixed is None:
            # The edit bucket only grows, per step kind: runtime eviction releases a few pages
            # more or fewer per round as windows cross page boundaries, and a bucket that
            # followed each round would flap between two programs. Decode steps keep their own
            # mark, so a long prefix hit's re-pointed tokens (an extend step) do not pad every
            # later decode step.
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
            edit_slot=pad(np.concatenate([last.swa, last.full, slots]), e),
            edit_row=pad(np.concatenate([no_slot, rows]), e),
            edit_pos=pad(np.concatenate([no_slot, pos]), e),
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
        if self.fixed is not None and len(last.swa) + len(last.full) > self.fixed.edits:
            releases.append(last)  # more than a step carries: applied first
            last = Releases()
        self.apply_releases(tuple(releases))  # only when a move forces an order (rare)
        return last

    @observed
    def dispatch(self, plan: StepPlan, after: Dispatched | None = None) -> Dispatched:
        """Upload and launch one step of a fused model without waiting for it; `after`: the
        step launched before, whose sampled tokens this plan's placeholders name. If it raises,
        the step never ran: its releases are applied on their own."""
        last = self._split_releases(plan)
        try:
            step, args, statics = self._launch(plan, last)
            if after is not None:
                start, size = offset(statics["layout"], "tokens")
                accepted = after.sampled[2] if after.plan.round.lookahead else None  # a round's
                packed = fill_placeholders(
                    args[5], after.sampled[0], accepted, start=start, size=size
                )
                args = (*args[:5], packed, *args[6:])
            *state, out, sampled = self.programs.call(step, args, statics)
            self.alloc, self.r2t, self.pools, self.draft_pools, pen = state
            if pen is not None:
                self.penalties = pen
        except Exception:
            if not self.state_lost():  # raised before the program ran: the state is untouched
                self.apply_releases((last,))
            raise
        return Dispatched(plan, out, sampled)

    def _mode(self, plan: StepPlan) -> SampleMode:
        """The step's static sampling: an all-greedy batch compiles no drawing at all; with
        fixed shapes, every feature is compiled in (a feature a row does not use is an identity
        on its logits: a penalty of 1 or 0, no rule entry, an unread top-N)."""
        if self.fixed is not None:
            if plan.round.lookahead and not plan.round.speculative:  # (returns neither)
                return SampleMode(False, 0, True, True)
            return SampleMode(self.fixed.vocab, self.fixed.top_logprobs, True, True)
        draw = bool(np.any(plan.forward.temperature > 0))
        s = plan.sampling
        return SampleMode(s.penalize, s.top_logprobs, draw, s.rules)

    def _launch(self, plan: StepPlan, last: Releases):
        """(the step's program, its arguments, its static arguments)."""
        packed, commit = self._prepare(plan, last)
        draft = self.draft.fused_forward if self.draft is not None else None
        d_state = self.draft.params if self.draft is not None else None
        pen = self._penalties(plan)
        state = (self.alloc, self.r2t, self.pools, self.draft_pools, pen)
        if plan.round.lookahead and not plan.round.speculative:  # multi-step decode
            shape = self._decode_shape(plan)
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
        statics = dict(forward=self.model.fused_forward, draft=draft, mode=self._mode(plan))
        statics.update(**extra, **commit)
        return step, (*state, packed, self.model.params, d_state), statics

    def _decode_shape(self, plan: StepPlan):
        """The metadata shape of a round's single-token forwards."""
        if self.fixed is not None:
            return self.fixed.decode(self._request_rows(plan), self._full_pages(plan))
        return round_shape(
            plan.prefix_lens,
            plan.seq_lens,
            page_size=self.alloc.page_size,
            window=self.window,
            min_tokens=self.min_reqs,
        )

    def _request_rows(self, plan: StepPlan) -> int:
        """The rows a step's per-request arrays pad to; with fixed shapes an extend pads to
        the most running requests (one row count: the extends' programs are then one per
        token and page bucket)."""
        if self.fixed is not None and plan.kind is StepKind.EXTEND:
            return self.fixed.request_rows(self.fixed.max_running)
        return bucket(len(plan.requests), self.min_reqs)

    def _full_pages(self, plan: StepPlan) -> int:
        return full_pages_bucket(int(np.max(plan.seq_lens)), self.alloc.page_size)

    def state_lost(self) -> bool:
        """Whether a program took the device state (its inputs are donated) and its outputs
        never reached the runner: only `reset` brings the state back."""
        state = (self.alloc, self.r2t, self.pools, self.draft_pools, self.penalties)
        return any(x.is_deleted() for x in jax.tree.leaves(state) if isinstance(x, jax.Array))

    def _penalties(self, plan: StepPlan):
        """The token counts if this step penalizes (made on first use), else None; with fixed
        shapes every step reads them, and a step's seeds are loaded here, ahead of it."""
        if self.model.vocab_size is None:
            return None
        if self.fixed is not None:
            if self.penalties is None:
                self.allocate_penalties()
            rows = bucket(self._rows, 8)
            for args in seed_chunks(plan, rows, SEED_CHUNK):
                self.penalties = seed_only(self.penalties, *self._upload(args))
            return self.penalties
        if not plan.sampling.penalize:
            return None
        if self.penalties is None:
            self.allocate_penalties()
        return self.penalties

    def allocate_penalties(self) -> None:
        """The per-row token counts the penalties read, all zero."""
        self.penalties = self._place(init_penalties(self._rows, self.model.vocab_size))

    def _place(self, tree):
        """`tree` where the runner keeps its state: on the default device, committed there as a
        program's outputs are (jit keys its programs by that too: the small programs a server
        warms up would compile again at their first call on a step's outputs), or replicated
        over the model's mesh (through the host: across processes a device array cannot be
        copied to another process's device, while every process holds the same host values)."""
        if recording_now():
            return tree
        if self.placement is None:
            return jax.device_put(tree, jax.devices()[0])
        return jax.device_put(jax.device_get(tree), self.placement)

    def _upload(self, tree):
        """Host values to where the runner's programs read them; left on the host while the
        programs are only recorded (their devices may be another machine's: `swajax.tpu`)."""
        return tree if recording_now() else jax.device_put(tree, self.placement)

    def _draft_shapes(self, plan: StepPlan):
        """The metadata shapes of a round's k + 1 single-token draft forwards."""
        if self.fixed is not None:
            return (self._decode_shape(plan),) * (plan.round.lookahead + 1)
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
        if self.fixed is not None:
            shape, fwd = self._fixed_forward(plan, decode)
            num_tokens = 0 if decode else shape.num_tokens
        else:
            num_tokens = 0 if decode else bucket(plan.num_new_tokens, MIN_TOKENS)  # static
            # A decode step's rows pad like its requests: a batch one request larger or smaller
            # (a request that ended while an overlapped step ran) keeps the program, and so
            # every other row's numerics.
            shape = metadata_shape(
                plan.prefix_lens,
                plan.seq_lens,
                page_size=self.alloc.page_size,
                window=self.window,
                min_tokens=self.min_reqs if decode else 1,
            )
            rows = self.min_reqs if decode or plan.round.lookahead else 1  # a round: per request
            fwd = pad_forward(plan.forward, shape.num_tokens, rows)
        arrays = self._inputs(plan, last)
        arrays.update(fwd._asdict())  # the model's inputs ride in the same buffer
        if plan.memory.full_src is not None or self.fixed is not None:
            src = plan.memory.full_src if plan.memory.full_src is not None else ()
            arrays["full_src"] = pad(src, shape.num_tokens)  # 0: computed
        if plan.round.lookahead or self.draft is not None:
            arrays["request_rows"] = pad(plan.rows, len(arrays["rows"]))
        if self.fixed is None:
            arrays.update(seed_arrays(plan))  # (fixed shapes load them ahead: `_penalties`)
        packed, layout = pack(arrays)
        commit = dict(layout=layout, decode=decode, num_tokens=num_tokens, meta_shape=shape)
        return self._upload(packed), commit

    def warm_up(self) -> tuple[int, int]:
        """Compile (or load from the store) every step program fixed shapes can reach, and
        run the small programs beside them once on inputs that change nothing (they compile
        at their first call): no compile is left for the serving loop. Returns (step
        programs made ready, of which compiled here)."""
        if self.fixed is None:
            raise ValueError("warm_up needs fixed shapes (fix_shapes)")
        ready = compiled = 0
        after = {}  # the sampled outputs' shapes a decode step's placeholders are filled from
        decode_layouts = []
        for kind, r, t, f, logits in self.fixed.keys():
            plan = _synthetic_plan(self.fixed, kind, r, t, f, logits)
            if plan is None:
                continue  # no batch has these sizes
            step, args, statics = self._launch(plan, Releases())
            compiled += self.programs.prepare(step, args, statics)
            ready += 1
            if kind != "extend" and not logits:
                # (a compiled program's; none while recording: nothing is compiled)
                program = self.programs.programs.get(self.programs.key(step, args, statics))
                sampled = getattr(program, "out_info", None)
                if sampled is not None:
                    sampled = sampled[-1]
                    after[kind, r] = (sampled[0], sampled[2] if kind == "round" else None)
                decode_layouts.append((args[5], statics["layout"]))
        for packed, layout in decode_layouts:  # overlap: any decode step after any other
            start, size = offset(layout, "tokens")
            for prev, accepted in after.values():
                prev = self._place(np.zeros(prev.shape, prev.dtype))  # (as a step's outputs are)
                accepted = (
                    None if accepted is None else self._place(np.zeros(accepted.shape, np.int32))
                )
                fill_placeholders(packed, prev, accepted, start=start, size=size)
        e = self.fixed.edits
        self.alloc = apply_releases(self.alloc, *self._upload([np.zeros(e, np.int32)] * 4))
        self.r2t = repoint(self.r2t, *self._upload([pad((), e, DROP), pad((), e), pad((), e)]))
        if self.penalties is not None:
            rows = bucket(self._rows, 8)
            nothing = [pad((), rows, DROP), pad((), SEED_CHUNK, DROP), *[pad((), SEED_CHUNK)] * 2]
            self.penalties = seed_only(self.penalties, *self._upload(nothing))
        return ready, compiled

    def _fixed_forward(self, plan: StepPlan, decode: bool):
        """(metadata shape, padded forward inputs) of a step under fixed shapes: every size
        from the request rows r, an extend's tokens t and the full pages f."""
        fixed, r, f = self.fixed, self._request_rows(plan), self._full_pages(plan)
        if decode:
            shape = fixed.decode(r, f)
        elif plan.round.lookahead:
            shape = fixed.round(r, f)
        else:
            shape = fixed.extend(r, fixed.extend_tokens(plan.num_new_tokens), f)
        logits = shape.num_tokens if plan.sampling.return_logits else r
        fwd = pad_forward(
            plan.forward, shape.num_tokens, r, min_logits=logits, rule_width=RULE_WIDTH
        )
        return shape, fwd

    def _roll_back(self, plan: StepPlan, out) -> None:
        """Free the pages the step took (not the tail of a page a request already held)."""
        out = read(out)
        if int(out[OUT_STATUS]) != A.OK:
            return  # nothing was taken
        self.apply_releases((Releases(full=fresh_slots(plan, out, self.alloc.page_size)),))


def _synthetic_plan(fixed: FixedShapes, kind: str, r: int, t: int, f: int, logits: bool):
    """A plan whose shapes are the key's (its requests, lengths and inputs stand-ins: only
    their sizes reach the program), or None when no batch has them: sequences as long as the
    pages allow, a decode step's requests more than half the rows (one at the fewest rows),
    an extend's as few as hold its tokens."""
    longest = min(f * fixed.page_size, fixed.max_context)
    if kind == "extend":  # (its rows are the most whatever its requests: as few as hold t)
        n = -(-t // longest)
        if n > r:
            return None
        lens = [longest] * (n - 1) + [t - longest * (n - 1)]
        seq = np.full(n, longest, np.int32)
    else:
        n = 1 if r == fixed.min_reqs else r // 2 + 1
        lens = [fixed.round_len if kind == "round" else 1] * n
        seq = np.full(n, longest, np.int32)
    prefix = seq - np.asarray(lens, np.int32)
    if np.any(prefix < 0):
        return None
    empty = {name: np.zeros((0, *x.shape[1:]), x.dtype) for name, x in _EMPTY.items()}
    speculative = kind == "round" and fixed.draft_tokens > 0
    return StepPlan(
        kind=StepKind.EXTEND if kind == "extend" else StepKind.DECODE,
        requests=(None,) * n,
        rows=np.arange(n, dtype=np.int32),
        prefix_lens=prefix,
        seq_lens=seq,
        last_loc=np.full(n, -1, np.int32),
        forward=ForwardBatch(tokens=np.zeros(int(sum(lens)), np.int32), **empty),
        round=Round(fixed.round_len - 1 if kind == "round" else 0, speculative),
        sampling=SamplingOps(return_logits=bool(logits)),
    )


_EMPTY = {
    name: value
    for name, value in ForwardBatch(
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        **sampling_fields([], []),
    )
    ._asdict()
    .items()
    if name != "tokens"
}


def _chunks(x: np.ndarray, size: int) -> list[np.ndarray]:
    return [x[i : i + size] for i in range(0, len(x), size)]


def _repointed(plan: StepPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step's re-pointed `req_to_token` entries, one per token: (row, position, slot)."""
    rp = plan.memory.repoint
    rows = np.repeat(rp.rows, rp.ends - rp.starts).astype(np.int32)
    pos = [np.arange(a, b, dtype=np.int32) for a, b in zip(rp.starts, rp.ends)]
    return rows, np.concatenate([np.zeros(0, np.int32), *pos]), np.asarray(rp.slots, np.int32)
