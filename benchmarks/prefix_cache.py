"""Prefix cache benchmark: a multi-turn chat trace over the radix cache and the jitted allocator.

    python benchmarks/prefix_cache.py [--json] [--conversations N]

200 conversations x 4 turns (turn by turn across conversations), a 512-token system prompt shared
by all, user turns of 32-256 tokens, replies of 64-512, W = 128, page size 16, pools of 262,144
full and 65,536 SWA tokens. Each turn matches and locks its prompt, allocates the rest of the
prompt, inserts it (as a chunked prefill would), allocates the reply, frees out-of-window SWA,
inserts the whole sequence and unlocks. Prints the median microseconds of match, insert, evict
and of a whole turn, the prompt-token hit rate and the SWA-tail-miss tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from swajax.memory.host_allocator import HostAllocator
from swajax.prefix_cache import RadixCache, stats
from swajax.serving.window import eviction_frontier

W, PS, FULL, SWA = 128, 16, 262_144, 65_536


class Timer:
    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def __call__(self, name, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.samples.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)
        return out

    def median(self, name) -> float:
        return statistics.median(self.samples.get(name, [0.0]))


def ensure(alloc, cache, timer, tokens: int) -> None:
    full, swa = alloc.available()
    if full < tokens or swa < tokens:
        timer("evict", cache.evict, max(0, tokens - full), max(0, tokens - swa))


def extend(alloc, slots, n_new):
    n = len(slots)
    last = int(slots[-1]) if n else -1
    status, new = alloc.alloc_extend([n], [n + n_new], [last])
    assert status == 0, "the pools should hold one turn after eviction"
    return np.concatenate([slots, new]).astype(np.int32)


def turn(alloc, cache, timer, prompt, reply):
    match = timer("match", cache.match, prompt)
    handle = cache.lock(match.node)
    ensure(alloc, cache, timer, len(prompt) + len(reply) + 2 * PS)
    slots = extend(alloc, match.slots, len(prompt) - len(match))
    prefix, handle = timer(
        "insert",
        cache.cache_unfinished,
        prompt,
        slots,
        cache_protected_len=len(match),
        swa_evicted_seqlen=0,
        handle=handle,
    )
    slots[: len(prefix)] = prefix
    seq = prompt + reply
    slots = extend(alloc, slots, len(reply))
    start, end = eviction_frontier(
        len(seq) - 1, window=W, page_size=PS, cache_protected_len=len(prefix), swa_evicted_seqlen=0
    )
    alloc.free_swa(slots[start:end:PS])  # one slot per page frees the whole page
    timer(
        "insert",
        cache.cache_finished,
        seq,
        slots,
        cache_protected_len=len(prefix),
        swa_evicted_seqlen=max(end, start),
        handle=handle,
    )
    return len(match)


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    args.conversations = 4 if args.smoke else args.conversations
    rng = np.random.default_rng(0)
    alloc = HostAllocator(FULL, SWA, PS)
    cache = RadixCache(alloc, page_size=PS, window=W)
    timer = Timer()
    system = rng.integers(0, 50_000, 512).tolist()
    history = [list(system) for _ in range(args.conversations)]
    hit = total = 0
    extend(alloc, np.zeros(0, np.int32), 16)  # compile the allocator before timing turns
    for _ in range(4):
        for conv in history:
            prompt = conv + rng.integers(0, 50_000, rng.integers(32, 257)).tolist()
            reply = rng.integers(0, 50_000, rng.integers(64, 513)).tolist()
            hit += timer("turn", turn, alloc, cache, timer, prompt, reply)
            total += len(prompt)
            conv[:] = prompt + reply
    result = dict(
        match_us=timer.median("match"),
        insert_us=timer.median("insert"),
        evict_us=timer.median("evict"),
        evict_calls=len(timer.samples.get("evict", [])),
        turn_us=timer.median("turn"),
        prompt_hit_rate=hit / total,
        **stats(cache),
    )
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:22} {value:,.3f}" if isinstance(value, float) else f"{key:22} {value:,}")


if __name__ == "__main__":
    main()
