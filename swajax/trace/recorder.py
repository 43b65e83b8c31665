"""The recorder: `Tracer` observes an engine's ledger, prefix cache and scheduler (as their
`observer`, `swajax.observe`) and writes what they did as a trace (format in `swajax.trace`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from swajax.memory.step_codes import LAST_LOC_ON_DEVICE
from swajax.serving.batch import StepKind
from swajax.trace import codec
from swajax.trace.check import FORMAT_VERSION, OPTIONAL

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


def ints(x) -> list[int]:
    """A slot or token list (any array-like) as plain ints, as a trace writes it."""
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _node_tokens(node) -> list[int]:
    keys = [n.key for n in node.path_to_root()] if node is not None else []
    return [t for key in reversed(keys) for t in key]


class Tracer:
    """Observes an engine's ledger, prefix cache and runner and records their outermost calls.

    A step's allocation happens on device, in the step's program, after the releases queued
    before it was launched; so it is recorded where the step is launched (`dispatch`), as the
    `alloc_extend` / `alloc_decode` call a standalone allocator would have made there, and
    filled in when its result is read. With overlap scheduling a step is launched before the
    previous one's result is read: its `last_loc` (read on device) comes from that result, and
    lines recorded while a step was in flight count its pages as taken (the ledger learns them
    only when the result is taken). A speculative round allocates k + 1 positions per request
    as an extend; its rejected pages come back as `free` lines.
    """

    def __init__(self, engine, *, drain_every: int = 0):
        """`drain_every` N > 0: after every N-th step, evict everything unlocked (an `evict`
        line whose expected free counts are then exact: what outputs alone do not show, a
        leaked or twice-freed slot, surfaces there)."""
        ledger, cache = engine.ledger, engine.cache
        self.engine, self.alloc, self.cache, self.lines, self.depth = engine, ledger, cache, [], 0
        self.handles: dict[int, object] = {}  # trace id -> LockHandle
        self.launched: dict[int, tuple[int, object]] = {}  # id(step) -> (line number, plan)
        self.taking: int | None = None  # line number of the step whose result is being taken
        self.last_slot: dict[int, int] = {}  # id(request) -> its slot in the last decode step
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
        # The ledger, the cache and the runner report their calls (swajax.observe).
        ledger.observer = cache.observer = engine.runner.observer = self
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

    def ran(self) -> dict:
        """What ran: overlap scheduling (and how many steps were launched ahead), speculative
        decoding (draft tokens per round, accepted tokens)."""
        e = self.engine
        return dict(
            overlap=bool(e.overlap),
            launched_ahead=int(e.launched_ahead),
            speculative_tokens=int(e.options.num_speculative_tokens),
            accepted_tokens=int(e.scheduler.accepted_tokens),
        )

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
        if name == "dispatch":
            self._launch(args[0], result)
        elif name == "collect":
            self._read(args[0], result)
        elif name == "discard":  # rolled back: as if never launched
            self.lines[self.launched.pop(id(args[0]))[0]]["dropped"] = True
        elif name == "allocated":  # the ledger learns what a step took: lines since its launch
            for line in self.lines[self.taking :]:
                free = line["expect"]["available"]
                line["expect"]["available"] = [a - b for a, b in zip(free, result)]
        else:
            encoded = encode_args(name, args, kwargs)
            expect = observe(name, result, self.alloc, self.cache, encoded)
            self.lines.append(dict(op=name, **encoded, expect=expect))

    def _launch(self, plan, step) -> None:
        if plan.kind is StepKind.DECODE and not plan.round.lookahead:
            op, args = "alloc_decode", dict(seq_lens=plan.seq_lens)
        else:  # a prefill, or a speculative round's k + 1 positions per request
            op, args = "alloc_extend", dict(prefix_lens=plan.prefix_lens, seq_lens=plan.seq_lens)
        line = dict(op=op, **{k: ints(v) for k, v in args.items()}, last_loc=ints(plan.last_loc))
        line["expect"] = self.observe(op, (0, []))
        self.launched[id(step)] = (len(self.lines), plan)
        self.lines.append(line)

    def _read(self, step, result) -> None:
        number, plan = self.launched.pop(id(step))
        line = self.lines[number]
        line["expect"].update(status=int(result.status), slots=ints(result.slots))
        on_device = plan.last_loc == LAST_LOC_ON_DEVICE  # overlap: the previous step's slot
        line["last_loc"] = [
            self.last_slot[id(req)] if ahead else loc
            for req, ahead, loc in zip(plan.requests, on_device, line["last_loc"])
        ]
        if plan.kind is StepKind.DECODE:  # a plain step or a round: each request's last slot
            last = plan.last_slots(result.slots).tolist()
            self.last_slot = {id(r): s for r, s in zip(plan.requests, last)}
        self.taking = number

    def observe(self, name, result) -> dict:
        return observe(name, result, self.alloc, self.cache)

    def _operations(self) -> list[dict]:
        return [line for line in self.lines[1:] if not line.get("dropped")]

    @property
    def ops(self) -> int:
        """Operation lines so far (a rolled-back step's allocation is not one)."""
        return len(self._operations())

    def write(self, path: str | Path, *, plain: bool = False) -> None:
        """Format 3; gzip-compressed when `path` ends in .gz; `plain`: no delta encoding (what
        another language reads without swajax's codec)."""
        ops_lines = self._operations()
        ops = len(ops_lines)
        header = dict(self.lines[0], version=FORMAT_VERSION, ops=ops, ran=self.ran())
        body = ops_lines if plain else codec.encode_lines(ops_lines)
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
    optional = OPTIONAL.get(name, ())
    out.update({k: v for k, v in kwargs.items() if not (v is None and k in optional)})
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
            out[key] = ints(value)
    return out


def observe(name, result, alloc, cache, args: dict | None = None) -> dict:
    """What a call's line expects (or what a backend answered): the free counts and the
    cache's sizes after it, and the call's own answer. `args`: the call's arguments (in the
    backend's numbering), which a free's answer reads."""
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
        ok = int(result[0]) == 0  # a refused allocation hands out nothing, whatever it returns
        out.update(status=int(result[0]), slots=ints(result[1]) if ok else [])
    elif name == "match":
        out.update(length=len(result), slots=ints(result.slots), tail_miss=int(result.tail_miss))
    elif name == "insert":
        out.update(prefix_len=int(result))
    elif name == "lock":
        out.update(handle=result.trace_id)
    elif name == "evict":
        out.update(evicted=[int(result[0]), int(result[1])])
    elif name == "cache_unfinished":
        out.update(prefix=ints(result[0]), handle=getattr(result[1], "trace_id", None))
    elif name in ("free", "free_swa") and args is not None and str(alloc.mode) == "hybrid":
        out.update(mapped=mapped(alloc, args["slots"]))
    return out


def mapped(alloc, slots) -> int:
    """Full slots on the pages of `slots` that still map to an SWA slot: after a free or an
    SWA free, none (a free releases whole pages, and with them every slot's mapping). Read
    through the allocator's `translate`, or, for the engine's ledger, its paired pages."""
    ps = int(alloc.page_size)
    pages = np.unique(np.asarray(slots, np.int64) // ps)
    pages = pages[pages > 0]
    if not hasattr(alloc, "translate"):
        return int(np.count_nonzero(alloc.paired[pages])) * ps
    full = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
    return int(np.count_nonzero(np.asarray(alloc.translate(full)) > 0))
