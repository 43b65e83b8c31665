"""Per-request state on the host: tokens, its KV slots, prefix-cache and eviction bookkeeping."""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np

from swajax.errors import InputError


class RequestError(InputError):
    """A request that cannot be served; the message names the value and the limit."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request samples and stops: `max_new_tokens`, `temperature` (0: greedy),
    `top_p`, `seed` (with the position, the sample is reproducible), `stop_token_ids`."""

    max_new_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or (self.max_new_tokens < 1)
        ):
            raise RequestError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}"
            )
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
                raise RequestError(f"{name} must be a number, got {value!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not (0 <= self.seed < 2**32)
        ):
            raise RequestError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        if isinstance(self.stop_token_ids, str | bytes) or not hasattr(
            self.stop_token_ids, "__iter__"
        ):
            raise RequestError(f"stop_token_ids must be token ids, got {self.stop_token_ids!r}")
        stops = tuple(self.stop_token_ids)
        bad = [t for t in stops if isinstance(t, bool) or not isinstance(t, int | np.integer)]
        bad += [t for t in stops if not bad and t < 0]
        if bad:
            raise RequestError(f"stop_token_ids must be integers >= 0, got {bad[0]!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))


class Status(enum.Enum):
    WAITING = "waiting"  # not admitted, or retracted and requeued
    RUNNING = "running"  # holds a req_to_token row and KV (prefilling or decoding)
    FINISHED = "finished"
    ABORTED = "aborted"


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
    # Branch-insert policy: how far the admission match had full KV beyond the SWA-valid hit;
    # the request's chunk checkpoints insert no further (None: no limit).
    swa_branching_seqlen: int | None = None
    handle: object = None  # prefix-cache lock
    rebuild: object = None  # a `tail_rebuild.TailRebuild` until the request has passed its end
    retractions: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied at its last admission
    suspect: bool = False  # its batch raised: it runs alone until it finishes
    keep_logits: bool = False  # record the logits of every computed position (teacher forcing)
    logits: list = dataclasses.field(default_factory=list)  # per computed position, if kept

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

    def take_token(self, token: int, logprob: float) -> None:
        """A sampled token and its logprob become part of the output."""
        self.output.append(token)
        self.logprobs.append(logprob)

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
        self.logits = []
        self.kv_len = 0
        self.cache_protected_len = self.swa_evicted_seqlen = 0
