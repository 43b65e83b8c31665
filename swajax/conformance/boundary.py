"""Operation cases written at the rules' boundaries, where recorded workloads rarely go.

A workload's trace exercises what its scheduler does; it never asks for an allocation that
cannot succeed (admission checks first), and a match end rarely sits exactly W - 1, W or W + 1
live tokens after a tombstone. These scripts do, op by op, on swajax's own allocator and cache
(the expected answers are theirs, as in every operation case):

- the hit rule with W - 1, W and W + 1 live tokens before the match end (page size 1), and with
  the window straddling a page (page size 4, W not a multiple of it);
- window locks at the same boundaries: a lock pins exactly the last W tokens, so an SWA
  eviction right after takes exactly the tokens above them;
- allocations the pools refuse: the SWA pool short while the full pool has room, and the full
  pool short.

The scripts declare window-capped leaves (`cap_leaf_to_window`), as SGLang's tree always has
them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from swajax.prefix_cache.requests import branch_end
from swajax.trace.recorder import ints, observe
from swajax.trace.replay import _apply, swajax_backend

FORMAT_VERSION = 3


class Script:
    """Operations applied to swajax's allocator and cache and recorded with their answers."""

    def __init__(self, *, full: int, swa: int, ps: int, window: int, profile: str):
        self.header = dict(
            op="init",
            full_size=full,
            swa_size=swa,
            page_size=ps,
            mode="hybrid",
            window=window,
            cap_leaf_to_window=True,
            profile=profile,
            config=dict(model_type="scripted"),
        )
        self.alloc, self.cache = swajax_backend(self.header)
        self.lines: list[dict] = []
        self.handles: dict[int, object] = {}
        self.first_token = 1  # each branch starts with a token of its own
        lock = self.cache.lock

        def numbered(node):  # locks numbered as taken, a checkpoint's nested one too
            handle = lock(node)
            handle.trace_id = len(self.handles)
            self.handles[handle.trace_id] = handle
            return handle

        self.cache.lock = numbered

    def op(self, name: str, **args):
        line = dict(
            op=name,
            **{
                k: ints(v) if isinstance(v, (np.ndarray, list, tuple)) else v
                for k, v in args.items()
            },
        )
        result = _apply(line, self.alloc, self.cache, self.handles)
        line["expect"] = observe(name, result, self.alloc, self.cache, line)
        self.lines.append(line)
        return result

    def tokens(self, n: int) -> list[int]:
        """n tokens no other branch starts with."""
        first, self.first_token = self.first_token, self.first_token + 1
        return [first] + [1000 + i for i in range(n - 1)]

    def branch(self, n: int, live: int) -> list[int]:
        """Cache n tokens whose last `live` have SWA KV (the rest freed before the insert, as a
        request's runtime window eviction does); returns the tokens."""
        tokens = self.tokens(n)
        _, slots = self.op("alloc_extend", prefix_lens=[0], seq_lens=[n], last_loc=[-1])
        if n > live:
            self.op("free_swa", slots=slots[: n - live])
        self.op(
            "insert", tokens=tokens, slots=slots, prev_prefix_len=0, swa_evicted_seqlen=n - live
        )
        return tokens

    def chain(self, lengths) -> list[int]:
        """Cache one branch, all live, as nodes of `lengths` tokens from the root down (each
        prefix inserted after the one before); returns its tokens."""
        tokens = self.tokens(sum(lengths))
        _, slots = self.op("alloc_extend", prefix_lens=[0], seq_lens=[len(tokens)], last_loc=[-1])
        end = 0
        for length in lengths:
            prev, end = end, end + length
            self.op(
                "insert",
                tokens=tokens[:end],
                slots=slots[:end],
                prev_prefix_len=prev,
                swa_evicted_seqlen=0,
            )
        return tokens

    def again(self, tokens) -> None:
        """A request computes `tokens` anew (all live) and finishes: cached nodes keep theirs,
        tombstones on the path are revived, the request's duplicate slots go back."""
        _, slots = self.op("alloc_extend", prefix_lens=[0], seq_lens=[len(tokens)], last_loc=[-1])
        self.op("insert", tokens=tokens, slots=slots, prev_prefix_len=0, swa_evicted_seqlen=0)

    def order(self, steps: int, *, full: bool = False) -> None:
        """Evict the smallest amount `steps` times: each takes the least recent node the pool's
        list allows (whole nodes), and its answer names it by its length."""
        for _ in range(steps):
            self.op("evict", full=int(full), swa=int(not full))

    def drain(self) -> None:
        """Evict everything unlocked: the free counts after it are exact."""
        total = self.header["full_size"] + self.header["swa_size"]
        self.op("evict", full=0, swa=total)
        self.op("evict", full=total, swa=0)

    def write(self, path: Path) -> None:
        header = dict(self.header, version=FORMAT_VERSION, ops=len(self.lines))
        lines = [header, *self.lines, dict(op="end", ops=len(self.lines))]
        path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


def window_edges(profile: str, ps: int, window: int) -> Script:
    """Branches with live runs just below, at and above the window (whole pages), each matched
    one token past its end, then locked and SWA-evicted: the lock keeps exactly W."""
    s = Script(full=512, swa=512, ps=ps, window=window, profile=profile)
    runs = sorted({max(ps, (window + d) // ps * ps) for d in (-ps, -1, 0, 1, ps)})
    for live in runs:
        n = live + 2 * ps
        tokens = s.branch(n, live)
        s.op("match", tokens=tokens + [7])
        handle = s.op("lock", node=tokens)
        s.op("evict", full=0, swa=n)  # whatever the lock does not pin
        s.op("unlock", handle=handle.trace_id)
        s.drain()
    return s


def refusals(profile: str) -> Script:
    """Allocations the pools refuse: the SWA pool short while the full pool has room, and the
    full pool short. (Continuing a page whose SWA slot was freed is the caller's bug: swajax
    refuses it with its own status, SGLang 0.5.23 does not check, so it is no case.)"""
    s = Script(full=64, swa=32, ps=4, window=4, profile=profile)
    _, held = s.op("alloc_extend", prefix_lens=[0], seq_lens=[24], last_loc=[-1])
    s.op("alloc_extend", prefix_lens=[0], seq_lens=[16], last_loc=[-1])  # SWA short: 8 free
    s.op("free_swa", slots=held)
    s.op("alloc_extend", prefix_lens=[0], seq_lens=[48], last_loc=[-1])  # full short: 40 free
    _, slots = s.op("alloc_extend", prefix_lens=[0], seq_lens=[6], last_loc=[-1])
    s.op("alloc_decode", seq_lens=[7], last_loc=[int(slots[5])])
    s.op("free", slots=list(held) + list(slots) + [int(slots[5]) + 1])
    return s


def lock_extent(profile: str, ps: int, window: int) -> Script:
    """A window lock's extent where node boundaries sit one page or token below, at and above
    W from the lock's end: a parent longer than the window with a last node of t tokens, locked
    at its end; the sizes after the lock say what it pins, an SWA eviction what it leaves, the
    early release and the unlock what they give back. (A lock that counts one token too few or
    too many moves a node across the boundary.)"""
    s = Script(full=1024, swa=1024, ps=ps, window=window, profile=profile)
    head = -(-2 * window // ps) * ps
    for t in sorted({max(ps, (window + d) // ps * ps) for d in (-ps, -1, 0, 1, ps)}):
        tokens = s.chain([head, t])
        handle = s.op("lock", node=tokens)
        s.op("evict", full=0, swa=4 * head)
        s.op("release_swa", handle=handle.trace_id)
        s.op("evict", full=0, swa=4 * head)
        s.op("unlock", handle=handle.trace_id)
        s.drain()
    return s


def lru_order(profile: str, ps: int, window: int) -> Script:
    """Both recency lists' order after inserts, a tombstone's revival, a hit and a split of a
    live node, read by evicting one node at a time (node lengths all differ, so each answer
    names its node). The revived node and the split's upper part lie more than W + page tokens
    above their insert's end, where a window-bounded refresh does not reach: their place in the
    SWA list is the revival's and the split's own."""
    s = Script(full=2048, swa=2048, ps=ps, window=window, profile=profile)
    far = -(-(window + ps) // ps) * ps + ps  # longer than what a window-bounded refresh renews
    x = s.chain([2 * ps, far])
    s.chain([3 * ps, 4 * ps])
    z = s.chain([5 * ps, 6 * ps])
    s.order(1)  # X's top node, the oldest: tombstoned (its child is live)
    s.again(x)  # revived: where it lands decides what goes next
    s.order(1)
    s.op("match", tokens=z + [7])  # a hit: Z is the most recent now
    s.order(1)
    w = s.chain([9 * ps, 8 * ps])  # its top is capped to [9 pages - cap, cap]
    cut = 9 * ps - -(-window // ps) * ps + ps  # a page into the capped part: a live node
    s.again(w[:cut] + [9_000 + i for i in range(2 * far)])  # splits it there
    s.order(16)  # every node, one at a time
    s.order(4, full=True)
    s.drain()
    return s


def recency_on_hit(profile: str, ps: int, window: int) -> Script:
    """What a hit refreshes: a path of five nodes of different lengths, then a younger leaf,
    then a hit on the whole path; SWA and full evictions one node at a time say which of the
    path's nodes the hit made younger than the leaf (the whole path, or its last W + page
    tokens, or only its last node)."""
    s = Script(full=1024, swa=1024, ps=ps, window=window, profile=profile)
    path = s.chain([n * ps for n in (5, 3, 2, 4, 1)])
    s.chain([7 * ps])
    s.op("match", tokens=path + [7])
    s.order(6)
    s.again(path)
    s.op("match", tokens=path + [7])
    s.order(3, full=True)
    s.drain()
    return s


def branch_points(profile: str, ps: int, window: int) -> Script:
    """The branch-insert rule at its edges: a request checkpointed at 4 pages, then finished
    at 6, holding a branch point 2 pages in (below the checkpoint's end), at 4 (its end), at 5
    (past it: the checkpoint goes in whole, the finish stops there and frees the rest) and
    none. The window is longer than the request, so nothing slides out: what differs is
    where each insert stops, seen in the sizes, the free counts and a match after."""
    s = Script(full=512, swa=512, ps=ps, window=window, profile=profile)
    for point in (2 * ps, 4 * ps, 5 * ps, None):
        tokens = s.tokens(6 * ps)
        _, slots = s.op("alloc_extend", prefix_lens=[0], seq_lens=[6 * ps], last_loc=[-1])
        held = {} if point is None else {"swa_branching_seqlen": point}
        prefix, handle = s.op(
            "cache_unfinished",
            tokens=tokens[: 4 * ps],
            slots=slots,
            cache_protected_len=0,
            swa_evicted_seqlen=0,
            handle=None,
            **held,
        )
        if branch_end(4 * ps, 0, point) is not None:
            held = {}  # the checkpoint reached it: the request drops it
        s.op(
            "cache_finished",
            tokens=tokens,
            slots=list(prefix) + list(slots[len(prefix) :]),
            cache_protected_len=len(prefix),
            swa_evicted_seqlen=0,
            handle=getattr(handle, "trace_id", None),
            insert=True,
            **held,
        )
        s.op("match", tokens=tokens + [7])
    s.drain()
    return s


SCRIPTS = {
    "boundary_window_ps1": lambda profile: window_edges(profile, 1, 6),
    "boundary_window_ps4": lambda profile: window_edges(profile, 4, 6),
    "boundary_refusals": refusals,
    "boundary_lock_ps1": lambda profile: lock_extent(profile, 1, 6),
    "boundary_lock_ps4_w8": lambda profile: lock_extent(profile, 4, 8),
    "boundary_lock_ps4_w9": lambda profile: lock_extent(profile, 4, 9),
    "boundary_lru_ps1": lambda profile: lru_order(profile, 1, 6),
    "boundary_lru_ps4": lambda profile: lru_order(profile, 4, 6),
    "boundary_recency_ps1": lambda profile: recency_on_hit(profile, 1, 3),
    "boundary_recency_ps4": lambda profile: recency_on_hit(profile, 4, 6),
    "boundary_branch_ps1": lambda profile: branch_points(profile, 1, 16),
    "boundary_branch_ps4": lambda profile: branch_points(profile, 4, 32),
}


def scripts(profile: str) -> dict[str, Script]:
    return {name: make(profile) for name, make in SCRIPTS.items()}
