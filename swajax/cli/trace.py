"""Trace record and replay of allocator and prefix-cache operations (JSON lines, optionally gzip).

A trace lets another backend be driven with exactly the operations swajax saw, and checked
against swajax's results. Line 1 is `{"op": "init", ...}` (format version, model config, pool
sizes, page size, mode, window, leaf cap, cache policy profile, and the number of operation
lines), the last `{"op": "end", "ops": n}`; `trace_check.py` holds the schema every line is
checked against before replay, `trace_codec.py` the delta encoding that keeps a trace's size
linear in the tokens processed. Every other line is one operation with its arguments and an
`expect` object:

  alloc_extend  prefix_lens, seq_lens, last_loc     -> status, slots
  alloc_decode  seq_lens, last_loc                   -> status, slots
  free / free_swa  slots                             -> available
  match         tokens                               -> length, slots, tail_miss
  insert        tokens, slots, prev_prefix_len, swa_evicted_seqlen -> prefix_len
  lock          node (tokens from the root to the node's end) -> handle
  unlock / release_swa  handle
  evict         full, swa                            -> evicted
  cache_finished    tokens, slots, cache_protected_len, swa_evicted_seqlen, handle, insert
  cache_unfinished  tokens, slots, cache_protected_len, swa_evicted_seqlen, handle
                                                     -> prefix, handle

Every `expect` also carries `available` ([full, SWA] free tokens after the operation) and the
cache's evictable / protected sizes. Handles are numbered in the order locks are taken. Only
outermost calls are recorded: what the cache does inside `insert` is replayed by `insert`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from swajax.cli import trace_codec
from swajax.cli.page_map import SLOT_INPUTS, SLOT_OUTPUTS, Divergence, PageMap
from swajax.cli.trace_check import FORMAT_VERSION, TraceError, check
from swajax.memory.kv_allocator import KVAllocator
from swajax.prefix_cache import RadixCache
from swajax.prefix_cache.policy import policy_of
from swajax.serving.batch import StepKind

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
    """Wraps an engine's ledger and prefix cache (in place) and records their outermost calls.

    A step's allocation happens on device inside `commit_step`; it is recorded when the
    scheduler takes the step's result, as the `alloc_extend` / `alloc_decode` call a standalone
    allocator would have made at that point.
    """

    def __init__(self, engine):
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
        for name in ("free", "free_swa"):
            self._wrap(ledger, name)
        for name in CACHE_OPS:
            self._wrap(cache, name)
        self._wrap_allocation(engine.scheduler, ledger)

    def _wrap_allocation(self, scheduler, ledger):
        postprocess, allocated = scheduler.postprocess, ledger.allocated
        current = []

        def take_result(plan, result):
            current[:] = [plan]
            return postprocess(plan, result)

        def record_allocation(slots):
            allocated(slots)
            plan = current[0]
            if plan.kind is StepKind.DECODE:
                op, args = "alloc_decode", dict(seq_lens=plan.seq_lens, last_loc=plan.last_loc)
            else:
                op = "alloc_extend"
                args = dict(
                    prefix_lens=plan.prefix_lens, seq_lens=plan.seq_lens, last_loc=plan.last_loc
                )
            args = {k: _ints(v) for k, v in args.items()}
            self.lines.append(dict(op=op, **args, expect=self.observe(op, (0, slots))))

        scheduler.postprocess, ledger.allocated = take_result, record_allocation

    def _wrap(self, obj, name):
        inner = getattr(obj, name)

        def call(*args, **kwargs):
            self.depth += 1
            try:
                result = inner(*args, **kwargs)
            finally:
                self.depth -= 1
            if name == "lock":
                result.trace_id = len(self.handles)
                self.handles[result.trace_id] = result
            if self.depth == 0:
                self.lines.append(
                    dict(
                        op=name,
                        **encode_args(name, args, kwargs),
                        expect=self.observe(name, result),
                    )
                )
            return result

        setattr(obj, name, call)

    def observe(self, name, result) -> dict:
        return observe(name, result, self.alloc, self.cache)

    def write(self, path: str | Path) -> None:
        """Format 3; gzip-compressed when `path` ends in .gz."""
        ops = len(self.lines) - 1
        header = dict(self.lines[0], version=FORMAT_VERSION, ops=ops)
        lines = [header, *trace_codec.encode_lines(self.lines[1:]), dict(op="end", ops=ops)]
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


def swajax_backend(init: dict):
    """swajax's own allocator and prefix cache, sized by a trace header."""
    alloc = KVAllocator.create(init["full_size"], init["swa_size"], init["page_size"], init["mode"])
    cache = RadixCache(
        alloc,
        page_size=init["page_size"],
        window=init["window"],
        pool_mode=init["mode"],
        cap_leaf_to_window=init["cap_leaf_to_window"],
        policy=policy_of(init.get("profile", "swajax")),
    )
    return alloc, cache


def replay(path: str | Path, backend=swajax_backend) -> dict:
    """Replay a trace against `backend(header) -> (allocator, prefix cache)` (swajax's by
    default; another backend may number its pages differently: slots are compared through a
    page bijection, `page_map.py`). {"ok": True, "ops": n} or the first divergence."""
    lines = read_lines(path)
    check(lines, str(path))
    alloc, cache = backend(lines[0])
    pages = PageMap(lines[0]["page_size"])
    handles: dict[int, object] = {}
    counter = [0]
    inner_lock = cache.lock

    def lock(node):  # number handles the way the recorder did, nested locks included
        handle = inner_lock(node)
        handle.trace_id, counter[0] = counter[0], counter[0] + 1
        handles[handle.trace_id] = handle
        return handle

    cache.lock = lock
    for number, line in enumerate(lines[1:], 1):
        expected = line["expect"]
        try:
            op = dict(line)
            for name in SLOT_INPUTS.get(line["op"], ()):
                op[name] = pages.to_backend(line[name])
            actual = observe(line["op"], _apply(op, alloc, cache, handles), alloc, cache)
            if "slots" in actual and line["op"].startswith("alloc") and actual["status"] == 0:
                pages.pair(expected.get("slots", []), actual["slots"])
        except Divergence as e:
            return dict(ok=False, op_number=number, op=line["op"], fields=["slots"],
                        expected=None, actual=None, reason=str(e))  # fmt: skip
        keys = [
            k for k in expected
            if not (pages.same(expected[k], actual.get(k)) if k in SLOT_OUTPUTS
                    else expected[k] == actual.get(k))
        ]  # fmt: skip
        if keys:
            return dict(
                ok=False,
                op_number=number,
                op=line["op"],
                fields=keys,
                expected={k: expected[k] for k in keys},
                actual={k: actual.get(k) for k in keys},
            )
    return dict(ok=True, ops=len(lines) - 1)


def read_lines(path: str | Path) -> list[dict]:
    """The header and operation lines of a trace of any readable version (gzip or not), lists
    decoded; a version-3 trace without its footer is refused as truncated."""
    try:
        data = Path(path).read_bytes()
        text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read the trace {path}: {e} (truncated?)") from e
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}:{number}: not JSON ({e.msg})") from e
    if not lines or not isinstance(lines[0], dict) or lines[0].get("version") != 3:
        return lines  # version 2 (or garbage, which check() names)
    end = lines[-1]
    if len(lines) < 2 or not isinstance(end, dict) or end.get("op") != "end":
        raise TraceError(
            f"{path}: truncated: no 'end' line after {len(lines) - 1} of "
            f"{lines[0].get('ops')!r} operations"
        )
    if end.get("ops") != lines[0].get("ops"):
        raise TraceError(f"{path}: the footer counts {end.get('ops')!r} operations, the header "
                         f"{lines[0].get('ops')!r}")  # fmt: skip
    return [lines[0], *trace_codec.decode_lines(lines[1:-1], str(path))]


def _apply(line, alloc, cache, handles):
    op = line["op"]
    if op in ("alloc_extend", "alloc_decode"):
        names = (
            ("prefix_lens", "seq_lens", "last_loc")
            if op == "alloc_extend"
            else ("seq_lens", "last_loc")
        )
        return getattr(alloc, op)(*(line[n] for n in names))
    if op in ("free", "free_swa"):
        return getattr(alloc, op)(np.asarray(line["slots"], np.int32))
    if op == "match":
        return cache.match(line["tokens"])
    if op == "insert":
        return cache.insert(
            line["tokens"],
            np.asarray(line["slots"], np.int32),
            line.get("prev_prefix_len", 0),
            line.get("swa_evicted_seqlen", 0),
            line.get("keep_tombstone_leaf", False),
        )
    if op == "lock":
        node = cache.walk(tuple(line["node"]))[-1] if line["node"] else cache.root
        return cache.lock(node)
    if op in ("unlock", "release_swa"):
        return getattr(cache, op)(handles.get(line["handle"]))
    if op == "evict":
        return cache.evict(line["full"], line["swa"])
    kwargs = dict(
        cache_protected_len=line["cache_protected_len"],
        swa_evicted_seqlen=line["swa_evicted_seqlen"],
        handle=handles.get(line["handle"]),
    )
    slots = np.asarray(line["slots"], np.int32)
    if op == "cache_finished":
        return cache.cache_finished(
            line["tokens"], slots, insert=line.get("insert", True), **kwargs
        )
    return cache.cache_unfinished(line["tokens"], slots, **kwargs)
