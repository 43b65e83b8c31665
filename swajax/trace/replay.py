"""Replay: drive a backend's allocator and prefix cache with a trace's operations and report the
first divergence (format in `swajax.trace`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from swajax import json_lines
from swajax.prefix_cache import RadixCache
from swajax.prefix_cache.policy import policy_of
from swajax.trace import codec
from swajax.trace.check import TraceError, check
from swajax.trace.page_map import SLOT_INPUTS, SLOT_OUTPUTS, Divergence, PageMap
from swajax.trace.recorder import observe


def swajax_backend(init: dict):
    """swajax's own allocator (its numpy twin, page for page the device's) and prefix cache,
    sized by a trace header."""
    # Imported here: replaying against another backend (a peer's own environment, which has
    # no JAX) needs only the host code of this module.
    from swajax.memory.host_allocator import HostAllocator

    alloc = HostAllocator(init["full_size"], init["swa_size"], init["page_size"], init["mode"])
    cache = RadixCache(
        alloc,
        page_size=init["page_size"],
        window=init["window"],
        pool_mode=init["mode"],
        cap_leaf_to_window=init["cap_leaf_to_window"],
        policy=policy_of(init.get("profile", "swajax")),
    )
    return alloc, cache


def replay(path: str | Path, backend=swajax_backend, answers: list | None = None) -> dict:
    """Replay a trace against `backend(header) -> (allocator, prefix cache)` (swajax's by
    default; another backend may number its pages differently: slots are compared through a
    page bijection, `page_map.py`). {"ok": True, "ops": n} or the first divergence.
    `answers`, a list: each operation's answer is appended to it, in the backend's numbering
    (what `examples/kit_checker.py` reads)."""
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
            actual = observe(line["op"], _apply(op, alloc, cache, handles), alloc, cache, op)
            if answers is not None:
                answers.append(actual)
            if "slots" in actual and line["op"].startswith("alloc") and actual["status"] == 0:
                pages.pair(expected.get("slots", []), actual["slots"])
        except Divergence as e:
            return dict(
                ok=False,
                op_number=number,
                op=line["op"],
                fields=["slots"],
                expected=None,
                actual=None,
                reason=str(e),
            )
        keys = [
            k
            for k in expected
            if not (
                pages.same(expected[k], actual.get(k))
                if k in SLOT_OUTPUTS
                else expected[k] == actual.get(k)
            )
        ]
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
    lines = []
    try:
        for number, raw in json_lines.lines(path, "trace", gzipped=None):
            if raw.strip():
                lines.append(json_lines.parse(raw, f"{path}:{number}"))
    except ValueError as e:
        raise TraceError(str(e)) from e
    if not lines or not isinstance(lines[0], dict) or lines[0].get("version") != 3:
        return lines  # version 2 (or garbage, which check() names)
    end = lines[-1]
    if len(lines) < 2 or not isinstance(end, dict) or end.get("op") != "end":
        raise TraceError(
            f"{path}: truncated: no 'end' line after {len(lines) - 1} of "
            f"{lines[0].get('ops')!r} operations"
        )
    if end.get("ops") != lines[0].get("ops"):
        raise TraceError(
            f"{path}: the footer counts {end.get('ops')!r} operations, the header "
            f"{lines[0].get('ops')!r}"
        )
    return [lines[0], *codec.decode_lines(lines[1:-1], str(path))]


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
        return getattr(cache, op)(_handle(line, handles))
    if op == "evict":
        return cache.evict(line["full"], line["swa"])
    kwargs = dict(
        cache_protected_len=line["cache_protected_len"],
        swa_evicted_seqlen=line["swa_evicted_seqlen"],
        handle=_handle(line, handles),
    )
    if "swa_branching_seqlen" in line:  # only the branch-insert rule's traces name one
        kwargs["swa_branching_seqlen"] = line["swa_branching_seqlen"]
    slots = np.asarray(line["slots"], np.int32)
    if op == "cache_finished":
        if "swa_evict_floor" in line:  # only the prefill-floor rule's traces name one
            kwargs["swa_evict_floor"] = line["swa_evict_floor"]
        return cache.cache_finished(
            line["tokens"], slots, insert=line.get("insert", True), **kwargs
        )
    return cache.cache_unfinished(line["tokens"], slots, **kwargs)


def _handle(line, handles):
    """The lock a line names (None where it names none); a handle no earlier `lock` made is
    the trace's error, named."""
    handle = line.get("handle")
    if handle is None:
        return None
    if handle not in handles:
        raise TraceError(
            f"{line['op']} names lock handle {handle!r}, which no earlier lock in the trace "
            f"made (known: {sorted(handles)[:8]}{'...' if len(handles) > 8 else ''})"
        )
    return handles[handle]
