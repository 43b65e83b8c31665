"""Per-request state on the host: tokens, its KV slots, prefix-cache and eviction bookkeeping."""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np


class RequestError(ValueError):
    """A request that cannot be served; the message names the value and the limit."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
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
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")


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
    slots: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    prefix_len: int = 0  # tokens reused from the prefix cache at admission
    cache_protected_len: int = 0  # leading positions owned (and locked) by the prefix cache
    swa_evicted_seqlen: int = 0  # positions [0, this) have had their SWA KV released
    handle: object = None  # prefix-cache lock
    retractions: int = 0
    keep_logits: bool = False  # record the logits of every computed position (teacher forcing)
    logits: list = dataclasses.field(default_factory=list)  # per computed position, if kept

    @property
    def tokens(self) -> list[int]:
        """Prompt and output so far. A step computes KV up to len(tokens), then samples."""
        return self.prompt + self.output

    @property
    def kv_len(self) -> int:
        """Positions whose KV is computed (and whose slots the request holds)."""
        return len(self.slots)

    @property
    def pending(self) -> int:
        """Tokens whose KV is still to compute before the next sample."""
        return len(self.prompt) + len(self.output) - self.kv_len

    @property
    def decoding(self) -> bool:
        """In the decode phase: only the newest sampled token lacks its KV."""
        return bool(self.output) and self.pending == 1

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    def reset_kv(self) -> None:
        """Forget every slot (after they were given back): the request starts over."""
        self.row, self.handle = None, None
        self.logits = []
        self.slots = np.zeros(0, np.int32)
        self.prefix_len = self.cache_protected_len = self.swa_evicted_seqlen = 0
