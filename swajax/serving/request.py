"""Per-request state on the host: tokens, its KV slots, prefix-cache and eviction bookkeeping."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from swajax.serving.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # not admitted, or retracted and requeued
    RUNNING = "running"  # holds a req_to_token row and KV (prefilling or decoding)
    FINISHED = "finished"
    ABORTED = "aborted"


class TopN(dict):
    """One position's top-N {token: logprob}, with `rank`: the sampled token's rank in the
    whole distribution (1: the likeliest; vLLM's `Logprob.rank`), None where unknown."""

    rank: int | None = None

    @classmethod
    def of(cls, ids, logprobs, rank: int | None) -> TopN:
        top = cls(zip(ids, logprobs))
        top.rank = rank
        return top


@dataclasses.dataclass(eq=False)
class Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    output: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    row: int | None = None  # req_to_token row while running
    # Full slot of every computed position: a buffer that grows by doubling, so a decode step
    # appends in O(1) instead of copying the whole context.
    _buf: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(16, np.int32))
    kv_len: int = 0  # positions whose KV is computed (and whose slots the request holds)
    # Positions [start, end) of the req_to_token row that no longer match `slots` (a cached
    # prefix taken at admission, or the tree's slots after a chunk was inserted).
    stale: tuple[int, int] | None = None
    cache_protected_len: int = 0  # leading positions owned (and locked) by the prefix cache
    swa_evicted_seqlen: int = 0  # positions [0, this) have had their SWA KV released
    # The prefill-floor rule (all-SWA pools, prefix_cache/policy.py): where its last prefill
    # chunk ended; its window frees nothing below it, and it caches nothing above it.
    swa_evict_floor: int = 0
    # Branch-insert policy: how far the admission match had full KV beyond the SWA-valid hit;
    # the request's chunk checkpoints insert no further (None: no limit).
    swa_branching_seqlen: int | None = None
    handle: object = None  # prefix-cache lock
    rebuild: object = None  # a `tail_rebuild.TailRebuild` until the request has passed its end
    retractions: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied at its last admission
    # Why the prefix cache gave what it gave at its last admission (prefix_cache/explain.py).
    cache_report: object = None
    suspect: bool = False  # its batch raised: it runs alone until it finishes
    keep_logits: bool = False  # record the logits of every computed position (teacher forcing)
    penalties_seeded: bool = False  # its row's device token counts hold its tokens
    cache_hits: bool = True  # False: compute every prompt position (their logits are wanted)
    # Per generated token, the N most likely tokens and their logprobs (if params.logprobs).
    top_logprobs: list[dict[int, float]] = dataclasses.field(default_factory=list)
    # n > 1: the first sample of the same prompt, whose prefill this one waits for (to take
    # the prompt's KV from the prefix cache); `leads` is set on that first one.
    follows: Request | None = None
    leads: bool = False
    logits: list = dataclasses.field(default_factory=list)  # per computed position, if kept
    # Speculative decoding: draft tokens proposed for it, and accepted by the verify rounds.
    spec_drafted: int = 0
    spec_accepted: int = 0

    @property
    def tokens(self) -> list[int]:
        """Prompt and output so far. A step computes KV up to len(tokens), then samples."""
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token_slice(self, start: int, end: int) -> list[int]:
        """tokens[start:end] without building the whole list (a decode step reads one)."""
        p = len(self.prompt)
        if start >= p:
            return self.output[start - p : end - p]
        return self.prompt[start:end] + self.output[: max(0, end - p)]

    @property
    def slots(self) -> np.ndarray:
        """Full slots of positions [0, kv_len): a read-only view (copy it to keep it)."""
        view = self._buf[: self.kv_len]
        view.flags.writeable = False
        return view

    def append_slots(self, new) -> None:
        n = self.kv_len + len(new)
        if n > len(self._buf):
            buf = np.zeros(max(n, 2 * len(self._buf)), np.int32)
            buf[: self.kv_len] = self._buf[: self.kv_len]
            self._buf = buf
        self._buf[self.kv_len : n] = new
        self.kv_len = n

    def repoint(self, start: int, slots) -> None:
        """Use `slots` for positions [start, start + len) (the prefix cache's own slots)."""
        end = start + len(slots)
        changed = np.nonzero(self._buf[start:end] != slots)[0]
        if not len(changed):
            return
        lo, hi = start + int(changed[0]), start + int(changed[-1]) + 1
        self._buf[lo:hi] = slots[lo - start : hi - start]
        if self.stale is not None:
            lo, hi = min(lo, self.stale[0]), max(hi, self.stale[1])
        self.stale = (lo, hi)

    @property
    def pending(self) -> int:
        """Tokens whose KV is still to compute before the next sample."""
        return self.num_tokens - self.kv_len

    @property
    def decoding(self) -> bool:
        """In the decode phase: only the newest sampled token lacks its KV."""
        return bool(self.output) and self.pending == 1

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    def take_token(self, token: int, logprob: float, top: dict[int, float] | None = None) -> None:
        """A sampled token and its logprob (and the top-N, if asked) join the output."""
        self.output.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            self.top_logprobs.append(top)

    @property
    def startable(self) -> bool:
        """Whether it may be admitted: a sample that follows another waits until that one's
        prompt is computed (and in the prefix cache) or it has ended."""
        lead = self.follows
        return lead is None or bool(lead.output) or lead.done

    def add_logits(self, rows) -> None:
        self.logits += list(rows)

    def checkpointed(self, prefix, handle) -> None:
        """The prefix cache holds [0, len(prefix)) (its own slots) and locks it by `handle`."""
        self.repoint(0, prefix)
        self.handle = handle
        self.cache_protected_len = max(self.cache_protected_len, len(prefix))

    def rebuild_settled(self) -> None:
        """A tail rebuild reached its end: an ordinary request from here on."""
        self.rebuild = None

    def reset_kv(self) -> None:
        """Forget every slot (after they were given back): the request starts over."""
        self.row, self.handle, self.stale, self.rebuild = None, None, None, None
        self.penalties_seeded = False
        self.logits = []
        self.kv_len = 0
        self.cache_protected_len = self.swa_evicted_seqlen = self.swa_evict_floor = 0

    def abandon(self, reason: str) -> None:
        """Ended with `reason` while its KV is lost with the pools (the engine's recovery):
        nothing to give back."""
        self.reset_kv()
        self.status, self.finish_reason = Status.ABORTED, reason
