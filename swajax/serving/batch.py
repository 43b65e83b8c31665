"""The contracts of a step: what the scheduler plans, what the runner returns, what is measured.

Host code (numpy only). A step is `plan = scheduler.schedule()`, `result = runner.run(plan)`,
`scheduler.postprocess(plan, result)`; these types are everything that crosses between them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from swajax.serving.token_rules import NO_TOKEN, rule_fields
from swajax.sizing import PoolMode as PoolMode

if TYPE_CHECKING:
    from swajax.serving.request import Request


class StepKind(enum.Enum):
    EXTEND = "extend"  # new requests and prefill chunks
    DECODE = "decode"  # one token for every decoding request


def _i32(values=()) -> np.ndarray:
    return np.asarray(values, np.int32).reshape(-1)


@dataclasses.dataclass
class Batch:
    """The requests a step runs (the scheduler's working set before it becomes a plan)."""

    kind: StepKind
    reqs: list[Request]
    lens: list[int]  # new tokens per request


@dataclasses.dataclass(frozen=True)
class Releases:
    """Deferred releases, applied on device in this order: SWA frees, full frees, then moves."""

    swa: np.ndarray = dataclasses.field(default_factory=_i32)  # full slots: free their SWA
    full: np.ndarray = dataclasses.field(default_factory=_i32)  # full slots: free full + SWA
    move_dst: np.ndarray = dataclasses.field(default_factory=_i32)  # move SWA slots src -> dst
    move_src: np.ndarray = dataclasses.field(default_factory=_i32)

    @property
    def has_moves(self) -> bool:
        return len(self.move_dst) > 0

    @property
    def empty(self) -> bool:
        return not (len(self.swa) or len(self.full) or self.has_moves)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A host-tier copy (prefix_cache/host_tier.py) of whole pages. `save`: the device KV of
    full slots `slots` (pool "full": the full layers' KV there; "swa": the SWA layers' KV at
    their SWA slots) to host pages `host_pages`, read before the step's releases free them.
    `load`: host pages into `slots`, after the releases: for "full" the device takes the pages
    of `slots` (the host chose them from its free mirror), for "swa" it pairs them with fresh
    SWA pages."""

    kind: str  # "save" or "load"
    pool: str  # "full" or "swa"
    slots: np.ndarray  # i32[n]: full slots, whole pages
    host_pages: np.ndarray  # i32[n / page_size]
    # Its place among the plan's releases: it runs after the first `after` segments (a save
    # before the frees of its pages, a load after the frees of the pages it takes; a node may
    # be loaded and evicted again within one plan).
    after: int = 0


@dataclasses.dataclass(frozen=True)
class Repoint:
    """`req_to_token` ranges whose slots changed before this step (an admission's cached
    prefix, or the tree's slots a chunked prefill switched to): row, [start, end), slots."""

    rows: np.ndarray = dataclasses.field(default_factory=_i32)
    starts: np.ndarray = dataclasses.field(default_factory=_i32)
    ends: np.ndarray = dataclasses.field(default_factory=_i32)
    slots: np.ndarray = dataclasses.field(default_factory=_i32)  # range after range

    @property
    def num_tokens(self) -> int:
        return len(self.slots)


class ForwardBatch(NamedTuple):
    """What the model needs for one step, besides the attention metadata (arrays only, so the
    runner uploads it as one pytree).

    The model computes logits for the rows `logit_index` of the flat batch and samples the rows
    `sample_index` of those (one per sampled request).
    """

    tokens: np.ndarray  # i32[T]: new tokens, request after request
    logit_index: np.ndarray  # i32[K]: flat rows whose logits are computed
    sample_index: np.ndarray  # i32[S]: rows of logit_index that are sampled
    temperature: np.ndarray  # f32[S] (a verify round: per request, like every field below)
    top_p: np.ndarray  # f32[S]
    seeds: np.ndarray  # u32[S]
    sample_positions: np.ndarray  # i32[S]: position of the token being drawn (keys the draw)
    top_k: np.ndarray  # i32[S]: 0 = off
    min_p: np.ndarray  # f32[S]
    repetition_penalty: np.ndarray  # f32[S]: 1 = off
    presence_penalty: np.ndarray  # f32[S]
    frequency_penalty: np.ndarray  # f32[S]
    sample_rows: np.ndarray  # i32[S]: req_to_token row of each sampled request (its counts)
    # The token rules (serving/token_rules.py; B = W = 0 when no request has one).
    rule_ids: np.ndarray  # i32[S, B]
    rule_values: np.ndarray  # f32[S, B]
    rule_until: np.ndarray  # i32[S, B]
    rule_allow: np.ndarray  # i32[S, B]
    bad_words: np.ndarray  # i32[S, W, L]
    history: np.ndarray  # i32[S, L - 1]


# The neutral value of each per-sample field: what padding rows carry.
SAMPLE_PADDING = {
    "top_p": 1.0,
    "repetition_penalty": 1.0,
    "sample_rows": 2**30,
    "rule_ids": NO_TOKEN,
    "bad_words": NO_TOKEN,
}
SAMPLE_FIELDS = ForwardBatch._fields[3:]


def sampling_fields(reqs, positions) -> dict[str, np.ndarray]:
    """The per-sample fields of a ForwardBatch for requests `reqs` sampling the tokens at
    `positions` (their `SamplingParams`, `req_to_token` rows and rules)."""
    params = [r.params for r in reqs]
    rows = [r.row for r in reqs]
    f32 = lambda name: np.asarray([getattr(p, name) for p in params], np.float32)  # noqa: E731
    return dict(
        temperature=f32("temperature"),
        top_p=f32("top_p"),
        seeds=np.asarray([p.seed for p in params], np.uint32),
        sample_positions=np.asarray(positions, np.int32),
        top_k=np.asarray([p.top_k for p in params], np.int32),
        min_p=f32("min_p"),
        repetition_penalty=f32("repetition_penalty"),
        presence_penalty=f32("presence_penalty"),
        frequency_penalty=f32("frequency_penalty"),
        sample_rows=np.asarray(rows, np.int32),
        **rule_fields(reqs),
    )


@dataclasses.dataclass(frozen=True)
class PenaltySeeds:
    """Token counts to load for requests whose penalties start this step (admitted, or
    re-admitted after a retraction): their rows are cleared, then every (row, token) counted."""

    reset_rows: np.ndarray  # i32[r]
    rows: np.ndarray  # i32[n]
    tokens: np.ndarray  # i32[n]
    is_output: np.ndarray  # i32[n]: 1 for an output token, 0 for a prompt token


@dataclasses.dataclass(frozen=True)
class MemoryOps:
    """What a step does to the pools and `req_to_token` besides allocating its new tokens."""

    releases: tuple[Releases, ...] = ()  # in order; the runner applies them before allocating
    # Host-tier copies, each in its place among the releases (`Transfer.after`).
    transfers: tuple[Transfer, ...] = ()
    repoint: Repoint = dataclasses.field(default_factory=Repoint)
    # i32[T] or None: per new token, the full slot whose KV full layers store instead of
    # computing it (a tail rebuild copies the prefix cache's KV); 0: compute it.
    full_src: np.ndarray | None = None
    # (full, SWA) tokens its releases give back: counted on the host when it was planned, on
    # the device only when it runs (overlap scheduling checks the previous step against it).
    released: tuple[int, int] = (0, 0)


@dataclasses.dataclass(frozen=True)
class Round:
    """A decode round of `lookahead` + 1 positions per request, allocated as an extend: a
    speculative verify round (k draft tokens) when `speculative`, else multi-step decode
    (N = lookahead + 1 steps in one program); lookahead 0: a plain step."""

    lookahead: int = 0
    speculative: bool = False


@dataclasses.dataclass(frozen=True)
class SamplingOps:
    """How the step samples and what it returns besides its tokens: some sampled request has
    penalties (the device reads and counts its tokens), the counts to load first, N of the
    top-N logprobs (0: none), and whether the full logits of the logit rows come back
    (teacher forcing)."""

    penalize: bool = False
    penalty_seeds: PenaltySeeds | None = None
    top_logprobs: int = 0
    return_logits: bool = False
    rules: bool = False  # some sampled request has token rules (its arrays are read)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One step as the scheduler planned it (host arrays, unpadded): its requests and their
    lengths, the model's inputs, and three records: memory, round, sampling."""

    kind: StepKind
    requests: tuple[Request, ...]
    rows: np.ndarray  # i32[R]: req_to_token row of each request
    prefix_lens: np.ndarray  # i32[R]: tokens with KV before the step
    seq_lens: np.ndarray  # i32[R]: after it
    last_loc: np.ndarray  # i32[R]: full slot of token prefix - 1, or -1
    forward: ForwardBatch
    memory: MemoryOps = MemoryOps()
    round: Round = Round()
    sampling: SamplingOps = SamplingOps()

    @property
    def num_new_tokens(self) -> int:
        return int(np.sum(self.seq_lens - self.prefix_lens))

    @property
    def r2t_tokens_written(self) -> int:
        """Slots this step writes into req_to_token: new tokens plus re-pointed ranges."""
        return self.num_new_tokens + self.memory.repoint.num_tokens

    def new_slots(self, slots: np.ndarray) -> list[np.ndarray]:
        """`slots` (the step's new slots, request after request) split per request."""
        n = self.seq_lens - self.prefix_lens
        return [slots[a : a + m] for a, m in zip((np.cumsum(n) - n).tolist(), n.tolist())]

    def fresh_slots(self, slots: np.ndarray, page_size: int) -> list[np.ndarray]:
        """Per request, its new slots on pages it did not hold before the step (not the tail
        of a page it held): what giving the step's positions back frees."""
        tail = (-self.prefix_lens % page_size).tolist()
        return [seg[t:] for seg, t in zip(self.new_slots(slots), tail)]

    def last_slots(self, slots: np.ndarray) -> np.ndarray:
        """Each request's last new slot (a plain step's one, a round's last position's)."""
        return np.asarray(slots)[np.cumsum(self.seq_lens - self.prefix_lens) - 1]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one step's single device read returns."""

    status: int  # allocator status (0 = OK)
    slots: np.ndarray  # i32[N]: full slots of the new tokens, request after request
    free_full: int  # free tokens of the primary pool after the step
    free_swa: int  # free tokens of the SWA pool (= free_full outside hybrid mode)
    tokens: np.ndarray  # i32[S]: sampled tokens
    logprobs: np.ndarray  # f32[S]
    logits: np.ndarray | None = None  # f32[K, V] if the plan asked for them
    # A verify round: tokens / logprobs are [R, k + 1] (the accepted draft tokens, then the
    # target's own at the first rejection or after the last) and `accepted` [R] counts the
    # leading draft tokens kept; logits [R, k + 1, V] and the top-N [R, k + 1, N] likewise.
    accepted: np.ndarray | None = None
    top_ids: np.ndarray | None = None  # i32[S, N] if the plan asked for top-N logprobs
    top_logprobs: np.ndarray | None = None  # f32[S, N]


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    step: int
    kind: str
    batch_size: int
    new_tokens: int
    running: int
    waiting: int
    full_used: int
    swa_used: int
    full_evictable: int
    swa_evictable: int
    full_protected: int
    swa_protected: int
    hit_tokens: int
    swa_tail_miss_tokens: int
    rebuilt_tokens: int  # recomputed by tail rebuilds (cumulative, like the hit tokens)
    rebuild_saved_tokens: int  # the fallback's recomputation the rebuilds avoided
    retractions: int
    compilations: int
    r2t_tokens_written: int
    # Per request in the step: (rid, KV before, KV after, whether it produced a token); what
    # the step-time model (`simulator/step_time.py`) and latency figures are computed from.
    spans: tuple[tuple[int, int, int, bool], ...] = ()
    # A host tier: (full, SWA) tokens this step loaded back from it, and the tokens it holds.
    host_loaded: tuple[int, int] = (0, 0)
    host_used: tuple[int, int] = (0, 0)


class Model(Protocol):
    """What the engine and its runner need of a model (`swajax.models.HybridLM`, or the null
    model that does no attention math)."""

    needs_kv: bool  # reads and writes KV through the pools (the null model does not)
    vocab_size: int
    # The step body the device runner traces into its own program (one dispatch per step);
    # None: the model runs outside it (a model without KV, on the host runner).
    fused_forward: object | None
    # Where the runner keeps its state and each step's upload: None (the default device) or
    # a `jax.sharding.Sharding` (replicated over the model's mesh).
    state_sharding: object | None

    def init_pools(self, sizes): ...
    def forward_and_sample(
        self, pools, batch: ForwardBatch, meta, *, return_logits=False, penalties=None, mode=None
    ):
        """(pools, penalties, `models.sampling.Sampled`) for the batch's sampled rows; called
        only for a model outside the fused program."""


class Runner(Protocol):
    """The device half of the engine (`swajax.runner.DeviceRunner`; `HostRunner` for a model
    without KV; or a fake in tests).

    The engine's one step path: `dispatch` launches a step (`after`: the step launched
    before, whose sampled tokens the plan's placeholder tokens name), `collect` reads its
    result, `discard` gives back what it allocated when reading failed (a step launched after
    it is discarded first). A `dispatch` that raises leaves the device as if the step had only
    applied its releases. A runner that does not `supports_overlap` may run the whole step in
    `dispatch` and return its result from `collect`; the engine then launches one at a time."""

    supports_overlap: bool
    supports_rounds: bool  # decode rounds (multi-step decode) can run
    default_decode_steps: int  # multi-step decode's N when the options leave it to the runner

    def dispatch(self, plan: StepPlan, after=None): ...
    def collect(self, step) -> StepResult: ...
    def discard(self, step) -> None: ...
    def apply_releases(self, releases: tuple[Releases, ...], transfers=()) -> None: ...
    def compilations(self) -> int: ...
    def reset(self) -> None: ...  # every page free, as made
    def state_lost(self) -> bool: ...  # a program took the state and its outputs never came
