"""The contracts of a step: what the scheduler plans, what the runner returns, what is measured.

Host code (numpy only). A step is `plan = scheduler.schedule()`, `result = runner.run(plan)`,
`scheduler.postprocess(plan, result)`; these types are everything that crosses between them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

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
    temperature: np.ndarray  # f32[S]
    top_p: np.ndarray  # f32[S]
    seeds: np.ndarray  # u32[S]
    sample_positions: np.ndarray  # i32[S]: position of the token being drawn (keys the draw)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One step as the scheduler planned it (host arrays, unpadded)."""

    kind: StepKind
    requests: tuple[Request, ...]
    rows: np.ndarray  # i32[R]: req_to_token row of each request
    prefix_lens: np.ndarray  # i32[R]: tokens with KV before the step
    seq_lens: np.ndarray  # i32[R]: after it
    last_loc: np.ndarray  # i32[R]: full slot of token prefix - 1, or -1
    releases: tuple[Releases, ...]  # in order; the runner applies them before allocating
    repoint: Repoint
    forward: ForwardBatch
    return_logits: bool = False  # full logits of the logit rows come back (teacher forcing)
    # i32[T] or None: per new token, the full slot whose KV full layers store instead of
    # computing it (a tail rebuild copies the prefix cache's KV); 0: compute it.
    full_src: np.ndarray | None = None
    # Speculative decoding: a decode step that verifies `lookahead` draft tokens per request
    # (k + 1 positions each, allocated as an extend); 0: a plain step.
    lookahead: int = 0
    # (full, SWA) tokens its releases give back: counted on the host when it was planned, on
    # the device only when it runs (overlap scheduling checks the previous step against it).
    released: tuple[int, int] = (0, 0)

    @property
    def num_new_tokens(self) -> int:
        return int(np.sum(self.seq_lens - self.prefix_lens))

    @property
    def r2t_tokens_written(self) -> int:
        """Slots this step writes into req_to_token: new tokens plus re-pointed ranges."""
        return self.num_new_tokens + self.repoint.num_tokens


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
    # A verify round: tokens / logprobs are [R, k + 1] (the target's greedy choice at each
    # position) and `accepted` [R] counts the leading draft tokens that matched.
    accepted: np.ndarray | None = None


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


class Model(Protocol):
    """What the engine and its runner need of a model (`swajax.models.HybridLM`, or the null
    model that does no attention math)."""

    needs_kv: bool  # reads and writes KV through the pools (the null model does not)
    vocab_size: int
    # The step body the runner traces into its own program (one dispatch per step); None: the
    # model runs outside it (under a mesh, or without KV), and the runner calls it per step.
    fused_forward: object | None

    def init_pools(self, sizes): ...
    def forward_and_sample(self, pools, batch: ForwardBatch, meta, *, return_logits=False):
        """(pools, (tokens, logprobs, logits or None)) for the batch's sampled rows."""


class Runner(Protocol):
    """The device half of the engine (`swajax.runner.DeviceRunner`, or a fake in tests).

    The engine's one step path: `dispatch` launches a step (`after`: the step launched
    before, whose sampled tokens the plan's placeholder tokens name), `collect` reads its
    result, `discard` gives back what it allocated when reading failed (a step launched after
    it is discarded first). A `dispatch` that raises leaves the device as if the step had only
    applied its releases. A runner that does not `supports_overlap` may run the whole step in
    `dispatch` and return its result from `collect`; the engine then launches one at a time."""

    supports_overlap: bool

    def dispatch(self, plan: StepPlan, after=None): ...
    def collect(self, step) -> StepResult: ...
    def discard(self, step) -> None: ...
    def apply_releases(self, releases: tuple[Releases, ...]) -> None: ...
    def compilations(self) -> int: ...
