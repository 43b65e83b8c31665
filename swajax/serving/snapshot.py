"""A serving engine's host state as plain data, and back: what a snapshot of a running engine
holds beside the device arrays and the tree (host code, no JAX).

Saved: every request (its tokens, sampling parameters and seed, full slots, row, progress
through the window and the prefix cache, its lock on the tree by node number and id, a tail
rebuild under way, the report of its last match), the scheduler's queues in order, its free
rows and counters, and the engine's own counters (the next request id, the step count, the
seed generator's state, the sampling defaults). A request's lock is rebuilt from the node
numbering of `prefix_cache.state.tree_order`, so the tree must be loaded first.

Every `Request` field is named here once, in `_FIELDS` (plain values) or `_SPECIAL` (the rest):
a field added to `Request` without a place here is an error at the first save, not a snapshot
that silently drops it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque

import numpy as np

from swajax.errors import InputError
from swajax.prefix_cache.explain import MatchReport
from swajax.prefix_cache.locks import LockHandle
from swajax.serving.request import Request, Status
from swajax.serving.sampling_params import SamplingParams
from swajax.serving.tail_rebuild import TailRebuild

FORMAT = 1

# Request fields saved as they are (ints, strings, bools, None, lists of numbers).
_FIELDS = (
    "rid",
    "prompt",
    "output",
    "logprobs",
    "finish_reason",
    "row",
    "kv_len",
    "cache_protected_len",
    "swa_evicted_seqlen",
    "swa_evict_floor",
    "swa_branching_seqlen",
    "retractions",
    "cached_tokens",
    "suspect",
    "keep_logits",
    "penalties_seeded",
    "cache_hits",
    "leads",
    "spec_drafted",
    "spec_accepted",
)
# Fields and counters added since FORMAT 1 was first written: what an older snapshot lacks.
_ADDED = {"spec_drafted": 0, "spec_accepted": 0, "draft_tokens": 0}
# Request fields with their own encoding below.
_SPECIAL = (
    "params",
    "status",
    "_buf",
    "stale",
    "handle",
    "rebuild",
    "cache_report",
    "top_logprobs",
    "follows",
    "logits",
)
# The scheduler's counters (ints; `missed_tokens` is a dict of them).
_COUNTERS = (
    "retractions",
    "swa_freed_tokens",
    "hit_tokens",
    "admitted_tokens",
    "tail_miss_tokens",
    "rebuilt_tokens",
    "rebuild_saved_tokens",
    "missed_tokens",
    "accepted_tokens",
    "draft_tokens",
    "dropped_tokens",
)


def check_fields() -> None:
    """Every `Request` field has a place here (tested; `engine_state` calls it too)."""
    known = set(_FIELDS) | set(_SPECIAL)
    fields = {f.name for f in dataclasses.fields(Request)}
    if fields != known:
        raise TypeError(
            f"Request fields without a snapshot encoding: {sorted(fields - known)}; "
            f"encoded but gone: {sorted(known - fields)} (serving/snapshot.py)"
        )


def engine_state(engine, index: dict | None) -> tuple[dict, dict[str, np.ndarray]]:
    """The engine's host state (flushed: no step launched): JSON-able data and the arrays
    (slots, kept logits) beside it. `index`: the tree's node numbers, or None without a tree."""
    check_fields()
    if engine._launched is not None:
        raise InputError("a step is still launched: flush the engine before saving it")
    sched = engine.scheduler
    arrays: dict[str, np.ndarray] = {}
    requests = [_request(req, index, arrays) for req in engine.requests.values()]
    return (
        dict(
            format=FORMAT,
            requests=requests,
            waiting=[r.rid for r in sched.waiting],
            running=[r.rid for r in sched.running],
            free_rows=list(sched.free_rows),
            counters={name: getattr(sched, name) for name in _COUNTERS},
            acceptance=sorted(sched.acceptance.items()),
            next_id=engine.next_id,
            steps=engine.steps,
            launched_ahead=engine.launched_ahead,
            seeds=engine.seed_generator.bit_generator.state,
            sampling_defaults=engine.sampling_defaults,
        ),
        arrays,
    )


def load_engine_state(engine, state: dict, arrays, nodes: list | None) -> None:
    """Fill the fresh `engine` (no request yet) from `engine_state`; `nodes`: the loaded tree's
    nodes by number (`load_tree_state`), None without a tree."""
    if state.get("format") != FORMAT:
        raise InputError(f"engine state format {state.get('format')}, this swajax reads {FORMAT}")
    if engine.requests:
        raise InputError(f"the engine already has {len(engine.requests)} requests")
    reqs: dict[int, Request] = {}
    for s in sorted(state["requests"], key=lambda s: s["rid"]):
        reqs[s["rid"]] = _load_request(s, arrays, nodes, reqs)
    sched = engine.scheduler
    sched.waiting = deque(reqs[rid] for rid in state["waiting"])
    sched.running = [reqs[rid] for rid in state["running"]]
    sched.free_rows = list(state["free_rows"])
    for name in _COUNTERS:
        setattr(sched, name, state["counters"].get(name, _ADDED.get(name)))
    sched.acceptance = Counter(dict(state.get("acceptance", [])))
    engine.requests = reqs
    engine.next_id, engine.steps = state["next_id"], state["steps"]
    engine.launched_ahead = state["launched_ahead"]
    engine.seed_generator.bit_generator.state = state["seeds"]
    engine.sampling_defaults = state["sampling_defaults"]


def _request(req: Request, index: dict | None, arrays: dict) -> dict:
    out = {name: _plain(name, getattr(req, name)) for name in _FIELDS}
    rid = req.rid
    arrays[f"slots_{rid}"] = np.array(req.slots)
    if req.logits:
        arrays[f"logits_{rid}"] = np.stack([np.asarray(x) for x in req.logits])
    handle = req.handle
    rebuild = req.rebuild
    out.update(
        params=dataclasses.asdict(req.params),
        status=req.status.value,
        stale=None if req.stale is None else list(req.stale),
        handle=None if handle is None else [index[handle.node], handle.id, handle.swa_released],
        rebuild=None
        if rebuild is None
        else dict(
            start=rebuild.start,
            end=rebuild.end,
            source=[int(s) for s in rebuild.source],
            exact_from=rebuild.exact_from,
            saved=rebuild.saved,
        ),
        cache_report=None if req.cache_report is None else dataclasses.asdict(req.cache_report),
        top_logprobs=[[[int(t), float(p)] for t, p in top.items()] for top in req.top_logprobs],
        follows=None if req.follows is None else req.follows.rid,
        logits=len(req.logits),
    )
    return out


def _load_request(s: dict, arrays, nodes: list | None, reqs: dict) -> Request:
    """A saved request, built whole (its lead, if it follows one, is among `reqs` already:
    ids are given in order)."""
    fields = {name: s[name] if name in s else _ADDED[name] for name in _FIELDS}
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in s["params"].items()}
    slots = np.asarray(arrays[f"slots_{s['rid']}"], np.int32)
    handle = None
    if s["handle"] is not None:
        node, lock_id, released = s["handle"]
        if nodes is None:
            raise InputError(f"request {s['rid']} holds a lock on a tree the snapshot lacks")
        handle = LockHandle(nodes[node], lock_id, released)
    rebuild = s["rebuild"]
    if rebuild is not None:
        rebuild = TailRebuild(**dict(rebuild, source=np.asarray(rebuild["source"], np.int32)))
    report = s["cache_report"]
    if report is not None:
        report = MatchReport(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in report.items()}
        )
    return Request(
        **fields,
        params=SamplingParams(**params),
        status=Status(s["status"]),
        _buf=np.concatenate([slots, np.zeros(16, np.int32)]),
        stale=None if s["stale"] is None else tuple(s["stale"]),
        handle=handle,
        rebuild=rebuild,
        cache_report=report,
        top_logprobs=[{t: p for t, p in top} for top in s["top_logprobs"]],
        follows=None if s["follows"] is None else reqs[s["follows"]],
        logits=list(arrays[f"logits_{s['rid']}"]) if s["logits"] else [],
    )


def _plain(name: str, value):
    """A plain field as JSON holds it (numpy scalars as Python numbers, exactly)."""
    if isinstance(value, list):
        return [x.item() if isinstance(x, np.generic) else x for x in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, int | float | str | bool):
        return value
    raise TypeError(f"Request.{name} = {value!r} is not a plain value (serving/snapshot.py)")
