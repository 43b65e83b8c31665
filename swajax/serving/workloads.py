"""Generated workloads for `swajax simulate`: what arrives, and what follows a finished request."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from swajax.serving.request import SamplingParams

WORKLOADS = ("long-context", "multi-turn", "mixed")


@dataclasses.dataclass
class Arrival:
    prompt: list[int]
    params: SamplingParams
    conversation: int | None = None  # multi-turn: the conversation it continues


@dataclasses.dataclass
class Workload:
    initial: list[Arrival]
    # Called with (finished arrival, its output); returns the next turn, if any.
    follow_up: Callable[[Arrival, list[int]], Arrival | None]
    total: int  # requests the workload will have submitted in the end


def _tokens(rng, n: int, vocab: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


def long_context(rng, n: int, vocab: int) -> list[Arrival]:
    """Distinct prompts of 16-32K tokens, replies of 64-256."""
    return [
        Arrival(
            _tokens(rng, int(rng.integers(16_384, 32_769)), vocab),
            SamplingParams(max_new_tokens=int(rng.integers(64, 257))),
        )
        for _ in range(n)
    ]


def make_workload(name: str, n: int, seed: int = 0, vocab: int = 1024) -> Workload:
    """`n` requests: long-context, multi-turn (4-turn chats over a shared 512-token system
    prompt, turns of 32-256 tokens, replies of 64-512) or mixed (half each)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    rng = np.random.default_rng(seed)
    if name == "long-context":
        return Workload(long_context(rng, n, vocab), lambda arrival, output: None, n)
    chats = n if name == "multi-turn" else n // 2
    conversations = max(1, chats // 4)
    system = _tokens(rng, 512, vocab)
    turns_left = {c: 3 for c in range(conversations)}

    def chat_turn(history: list[int], conversation: int) -> Arrival:
        prompt = history + _tokens(rng, int(rng.integers(32, 257)), vocab)
        return Arrival(
            prompt, SamplingParams(max_new_tokens=int(rng.integers(64, 513))), conversation
        )

    def follow_up(arrival: Arrival, output: list[int]) -> Arrival | None:
        c = arrival.conversation
        if c is None or turns_left[c] == 0:
            return None
        turns_left[c] -= 1
        return chat_turn(arrival.prompt + output, c)

    initial = [chat_turn(list(system), c) for c in range(conversations)]
    if name == "mixed":
        initial += long_context(rng, n - chats, vocab)
    return Workload(initial, follow_up, conversations * 4 + (n - chats if name == "mixed" else 0))
