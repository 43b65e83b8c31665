"""Workloads for `swajax simulate` and `swajax plan`: what arrives (and when, in modeled
seconds), and what follows a finished request. Generated ones, or a JSON-lines file."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from swajax.json_lines import read_json_lines
from swajax.serving.sampling_params import SamplingParams

WORKLOADS = ("long-context", "multi-turn", "mixed", "shared-prefix", "reasoning")


@dataclasses.dataclass
class Arrival:
    prompt: list[int]
    params: SamplingParams
    conversation: int | None = None  # multi-turn: the conversation it continues
    at: float = 0.0  # arrival, modeled seconds from the start


@dataclasses.dataclass
class Workload:
    initial: list[Arrival]
    # Called with (finished arrival, its output); returns the next turn, if any.
    follow_up: Callable[[Arrival, list[int]], Arrival | None]
    total: int  # requests the workload will have submitted in the end
    # Called with an arrival the engine refused (too long for the pools); returns what its
    # sender sends instead, if anything (a closed loop's client goes on with the next request).
    after_rejection: Callable[[Arrival], Arrival | None] = lambda arrival: None


def _tokens(rng, n: int, vocab: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


def long_context(rng, n: int, vocab: int) -> list[Arrival]:
    """Distinct prompts of 16-32K tokens, replies of 64-256."""
    return [
        Arrival(
            _tokens(rng, int(rng.integers(16_384, 32_769)), vocab),
            SamplingParams(temperature=0.0, seed=0, max_tokens=int(rng.integers(64, 257))),
        )
        for _ in range(n)
    ]


def reasoning(rng, n: int, vocab: int) -> list[Arrival]:
    """Long generations: prompts of 128-1K tokens, replies of 8-32K (a reasoning model's
    thinking), where how many requests fit at once decides decode throughput."""
    return [
        Arrival(
            _tokens(rng, int(rng.integers(128, 1025)), vocab),
            SamplingParams(temperature=0.0, seed=0, max_tokens=int(rng.integers(8_192, 32_769))),
        )
        for _ in range(n)
    ]


def shared_prefix(rng, n: int, vocab: int) -> list[Arrival]:
    """`n` one-shot questions over max(2, n // 6) shared prefixes of 128-384 tokens (questions
    of 16-96 tokens, replies of 16-128): many short-lived leaves on a few shared paths, so
    eviction has a choice to make (which leaf is least recently used)."""
    prefixes = [_tokens(rng, int(rng.integers(128, 385)), vocab) for _ in range(max(2, n // 6))]
    return [
        Arrival(
            prefixes[int(rng.integers(len(prefixes)))]
            + _tokens(rng, int(rng.integers(16, 97)), vocab),
            SamplingParams(temperature=0.0, seed=0, max_tokens=int(rng.integers(16, 129))),
        )
        for _ in range(n)
    ]


def make_workload(name: str, n: int, seed: int = 0, vocab: int = 1024) -> Workload:
    """`n` requests: long-context, multi-turn (4-turn chats over a shared 512-token system
    prompt, turns of 32-256 tokens, replies of 64-512), mixed (half each), shared-prefix or
    reasoning."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    rng = np.random.default_rng(seed)
    if name == "long-context":
        return Workload(long_context(rng, n, vocab), lambda arrival, output: None, n)
    if name == "shared-prefix":
        return Workload(shared_prefix(rng, n, vocab), lambda arrival, output: None, n)
    if name == "reasoning":
        return Workload(reasoning(rng, n, vocab), lambda arrival, output: None, n)
    chats = n if name == "multi-turn" else n // 2
    conversations = max(1, chats // 4)
    system = _tokens(rng, 512, vocab)
    turns_left = {c: 3 for c in range(conversations)}

    def chat_turn(history: list[int], conversation: int) -> Arrival:
        prompt = history + _tokens(rng, int(rng.integers(32, 257)), vocab)
        return Arrival(
            prompt,
            SamplingParams(temperature=0.0, seed=0, max_tokens=int(rng.integers(64, 513))),
            conversation,
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


def document_chats(documents: int, conversations: int, turns: int, doc: int, seed=0, vocab=1024):
    """Chats about shared documents: `documents` documents of `doc` tokens, `conversations`
    chats about each, `turns` turns each (user turns of 32-256 tokens, replies of 64-512); the
    chats of all documents interleaved, so a document's KV ages between its chats."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, doc).tolist() for _ in range(documents)]
    left = {}

    def turn(history, chat):
        prompt = history + rng.integers(0, vocab, int(rng.integers(32, 257))).tolist()
        params = SamplingParams(temperature=0.0, seed=0, max_tokens=int(rng.integers(64, 513)))
        return Arrival(prompt, params, chat)

    initial = []
    for c in range(conversations):  # chat c of every document, then chat c + 1
        for d in range(documents):
            chat = c * documents + d
            left[chat] = turns - 1
            initial.append(turn(list(docs[d]), chat))

    def follow_up(arrival, output):
        if left[arrival.conversation] == 0:
            return None
        left[arrival.conversation] -= 1
        return turn(arrival.prompt + output, arrival.conversation)

    return Workload(initial, follow_up, documents * conversations * turns)


FILE_KEYS = {"prompt_len", "output_len", "prefix_id", "arrival"}


def _length(item: dict, key: str, where: str, low: int) -> int:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1 << 20:
        raise ValueError(
            f"{where}: {key!r} must be an integer in [{low}, {1 << 20}], got {value!r}"
        )
    return value


def from_file(path: str | Path, vocab: int = 1024, seed: int = 0) -> Workload:
    """JSON lines of {"prompt_len", "output_len", "prefix_id"?, "arrival"?}. Requests with the
    same prefix_id take their prompts from one token stream (so two of them share their common
    length, as the turns of a chat do); `arrival` is in seconds (default 0). Errors name the
    line."""
    rng = np.random.default_rng(seed)
    streams: dict[object, list[int]] = {}
    arrivals = []
    for where, item in read_json_lines(path, "workload file"):
        if not isinstance(item, dict) or set(item) - FILE_KEYS:
            raise ValueError(f"{where}: expected an object with keys from {sorted(FILE_KEYS)}")
        prompt_len = _length(item, "prompt_len", where, 1)
        output_len = _length(item, "output_len", where, 1)
        at = item.get("arrival", 0.0)
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < 1e9:
            raise ValueError(f"{where}: 'arrival' must be seconds >= 0, got {at!r}")
        group = item.get("prefix_id", ("unique", where))
        stream = streams.setdefault(group, [])
        if len(stream) < prompt_len:
            stream += _tokens(rng, prompt_len - len(stream), vocab)
        arrivals.append(
            Arrival(
                stream[:prompt_len],
                SamplingParams(temperature=0.0, seed=0, max_tokens=output_len),
                at=float(at),
            )
        )
    if not arrivals:
        raise ValueError(f"the workload file {path} holds no request")
    arrivals.sort(key=lambda a: a.at)
    return Workload(arrivals, lambda arrival, output: None, len(arrivals))


def closed_loop(workload: Workload, clients: int) -> Workload:
    """The same requests sent by `clients` clients, each waiting for its reply before it sends
    the next (a load generator's maximum concurrency): the first `clients` arrive at once and
    each finished one is followed by its own follow-up (the next turn of its chat) if it has
    one, else by the next request not yet sent (as is a request the engine refuses). The load
    stays at `clients` outstanding requests until the last one is sent, so a run measures
    throughput at that concurrency rather than a batch draining. Arrival times in the workload
    are ignored."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    queue = list(workload.initial)
    initial, queue = queue[:clients], queue[clients:]
    for arrival in initial:
        arrival.at = 0.0

    def follow_up(arrival: Arrival, output: list[int]) -> Arrival | None:
        nxt = workload.follow_up(arrival, output)
        if nxt is None and queue:
            nxt = queue.pop(0)
        return nxt

    def after_rejection(arrival: Arrival) -> Arrival | None:  # the client is free again
        return queue.pop(0) if queue else None

    return Workload(initial, follow_up, workload.total, after_rejection)


def workload_of(
    name_or_path: str, n: int, seed: int = 0, vocab: int = 1024, clients: int | None = None
) -> Workload:
    """A built-in workload by name (`n` requests), else a JSON-lines file; with `clients`, sent
    in a closed loop (`closed_loop`)."""
    if name_or_path in WORKLOADS:
        workload = make_workload(name_or_path, n, seed, vocab)
    else:
        workload = from_file(name_or_path, vocab, seed)
    return workload if clients is None else closed_loop(workload, clients)
