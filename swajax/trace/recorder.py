"""The recorder: `Tracer` observes an engine's ledger, prefix cache and scheduler (as their
`observer`, `swajax.observe`) and writes what they did as a trace (format in `swajax.trace`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from swajax.serving.batch import StepKind
from swajax.trace import codec
from swajax.trace.check import FORMAT_VERSION

CACHE_OPS = (
    "match",
    "insert",
    "lock",
    "unlock",
    "release_swa",
    "evict",
    "cache_finished",
    "cache_unfinished",
)


def _ints(x) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _node_tokens(node) -> list[int]:
    keys = [n.key for n in node.path_to_root()] if node is not None else []
    return [t for key in reversed(keys) for t in key]


class Tracer:
    """Observes an engine's ledger and prefix cache and records their outermost calls.

    A step's allocation happens on device inside `commit_step`; it is recorded when the
    scheduler takes the step's result, as the `alloc_extend` / `alloc_decode` call a standalone
    allocator would have made at that point.
    """

    def __init__(self, engine, *, drain_every: int = 0):
        """`drain_every` N > 0: after every N-th step, evict everything unlocked (an `evict`
        line whose expected free counts are then exact: what outputs alone do not show, a
        leaked or twice-freed slot, surfaces there)."""
        # A trace lists each allocation with its `last_loc`; a step planned ahead reads it on
        # device, so a recorded engine runs its steps one at a time.
        engine.overlap = False
        ledger, cache = engine.ledger, engine.cache
        self.alloc, self.cache, self.lines, self.depth = ledger, cache, [], 0
        self.handles: dict[int, object] = {}  # trace id -> LockHandle
        ps = ledger.page_size
        self.lines.append(
            dict(
                op="init",
                full_size=ledger.primary_pages * ps,
                swa_size=(ledger.swa_pages or ledger.primary_pages) * ps,
                page_size=ps,
                mode=ledger.mode.value,
                window=cache.window,
                cap_leaf_to_window=cache.cap_leaf,
                profile=cache.policy.name,
                config=dict(model_type=engine.cfg.model_type, kinds=engine.cfg.kinds),
            )
        )
        # The ledger, the cache and the scheduler report their calls (swajax.observe).
        ledger.observer = cache.observer = engine.scheduler.observer = self
        self.sizes = (self.lines[0]["full_size"], self.lines[0]["swa_size"])
        if drain_every > 0:
            step, count = engine.step, [0]

            def drained_step(*args, **kwargs):
                out = step(*args, **kwargs)
                count[0] += 1
                if count[0] % drain_every == 0:
                    self.drain()
                return out

            engine.step = drained_step

    def drain(self) -> tuple[int, int]:
        """Evict everything the cache holds unlocked, SWA first (tombstones, and unlocked
        leaves deleted whole), then full; returns the free (full, SWA) tokens."""
        self.cache.evict(0, sum(self.sizes))
        self.cache.evict(sum(self.sizes), 0)
        return tuple(int(x) for x in self.alloc.available())

    def finish(self) -> None:
        """End of a run (no request holds anything): drain, and require both pools exactly
        free, so a trace's last line says what an empty system holds."""
        free = self.drain()
        if free != self.sizes:
            raise AssertionError(f"pools not free after the run: {free} of {self.sizes}")

    def called(self, name, args, kwargs, result, *, outermost: bool) -> None:
        if name == "lock":  # handles are numbered in the order locks are taken, nested ones too
            result.trace_id = len(self.handles)
            self.handles[result.trace_id] = result
        if not outermost:
            return
        if name == "allocated":
            self._allocation(*args)
            return
        line = dict(op=name, **encode_args(name, args, kwargs), expect=self.observe(name, result))
        self.lines.append(line)

    def _allocation(self, plan, slots) -> None:
        if plan.kind is StepKind.DECODE:
            op, args = "alloc_decode", dict(seq_lens=plan.seq_lens, last_loc=plan.last_loc)
        else:
            op = "alloc_extend"
            args = dict(prefix_lens=plan.prefix_lens, seq_lens=plan.seq_lens,
                        last_loc=plan.last_loc)  # fmt: skip
        args = {k: _ints(v) for k, v in args.items()}
        self.lines.append(dict(op=op, **args, expect=self.observe(op, (0, slots))))

    def observe(self, name, result) -> dict:
        return observe(name, result, self.alloc, self.cache)

    def write(self, path: str | Path, *, plain: bool = False) -> None:
        """Format 3; gzip-compressed when `path` ends in .gz; `plain`: no delta encoding (what
        another language reads without swajax's codec)."""
        ops = len(self.lines) - 1
        header = dict(self.lines[0], version=FORMAT_VERSION, ops=ops)
        body = self.lines[1:] if plain else codec.encode_lines(self.lines[1:])
        lines = [header, *body, dict(op="end", ops=ops)]
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        Path(path).write_bytes(gzip.compress(data, mtime=0) if str(path).endswith(".gz") else data)


def encode_args(name, args, kwargs) -> dict:
    names = {
        "alloc_extend": ("prefix_lens", "seq_lens", "last_loc"),
        "alloc_decode": ("seq_lens", "last_loc"),
        "free": ("slots",),
        "free_swa": ("slots",),
        "match": ("tokens",),
        "insert": (
            "tokens",
            "slots",
            "prev_prefix_len",
            "swa_evicted_seqlen",
            "keep_tombstone_leaf",
        ),
        "lock": ("node",),
        "unlock": ("handle",),
        "release_swa": ("handle",),
        "evict": ("full", "swa"),
        "cache_finished": ("tokens", "slots"),
        "cache_unfinished": ("tokens", "slots"),
    }[name]
    out = dict(zip(names, args))
    out.update({k: v for k, v in kwargs.items()})
    for key, value in list(out.items()):
        if key == "node":
            out[key] = _node_tokens(value)
        elif key == "handle":
            out[key] = getattr(value, "trace_id", None)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, (int, np.integer)):
            out[key] = int(value)
        else:
            out[key] = _ints(value)
    return out


def observe(name, result, alloc, cache) -> dict:
    out = dict(
        available=list(alloc.available()),
        sizes=[
            cache.full_evictable,
            cache.full_protected,
            cache.swa_evictable,
            cache.swa_protected,
        ],
    )
    if name in ("alloc_extend", "alloc_decode"):
        out.update(status=int(result[0]), slots=_ints(result[1]))
    elif name == "match":
        out.update(length=len(result), slots=_ints(result.slots), tail_miss=int(result.tail_miss))
    elif name == "insert":
        out.update(prefix_len=int(result))
    elif name == "lock":
        out.update(handle=result.trace_id)
    elif name == "evict":
        out.update(evicted=[int(result[0]), int(result[1])])
    elif name == "cache_unfinished":
        out.update(prefix=_ints(result[0]), handle=getattr(result[1], "trace_id", None))
    return out
