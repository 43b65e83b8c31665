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


def check_engine_state(
    state: dict,
    arrays,
    *,
    rows: int,
    context: int,
    slots: int,
    vocab: int | None,
    nodes: int | None,
) -> None:
    """Refuse (InputError naming the field) a saved engine state whose indices or sizes this
    engine cannot hold: request rows outside [0, rows), lengths past `context`, full slots
    outside [0, slots), token ids outside the vocabulary, tree node numbers past `nodes`,
    queues naming unknown requests. Called before anything is loaded."""

    def bad(field: str, value, limit: str):
        raise InputError(f"the snapshot's {field} is {value!r}, outside {limit}")

    def count(field: str, value, hi: int | None = None):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            bad(field, value, "the non-negative integers")
        if hi is not None and value > hi:
            bad(field, value, f"[0, {hi}]")

    def tokens(field: str, values):
        if not isinstance(values, list) or len(values) > context:
            bad(
                field,
                f"{len(values)} tokens" if isinstance(values, list) else values,
                f"the context ({context})",
            )
        for t in values:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or (vocab and t >= vocab):
                bad(field, t, f"[0, {vocab})")

    requests = state["requests"]
    if not isinstance(requests, list):
        bad("requests", type(requests).__name__, "a list")
    rids = set()
    for i, s in enumerate(requests):
        where = f"requests[{i}]"
        count(f"{where}.rid", s["rid"])
        if s["rid"] in rids:
            bad(f"{where}.rid", s["rid"], "unique ids")
        rids.add(s["rid"])
        tokens(f"{where}.prompt", s["prompt"])
        tokens(f"{where}.output", s["output"])
        length = len(s["prompt"]) + len(s["output"])
        if s["row"] is not None:
            count(f"{where}.row", s["row"], rows - 1)
        for name in ("kv_len", "cache_protected_len", "swa_evicted_seqlen", "swa_evict_floor"):
            count(f"{where}.{name}", s.get(name, 0), length)
        for name in ("retractions", "cached_tokens", "spec_drafted", "spec_accepted"):
            count(f"{where}.{name}", s.get(name, 0))
        try:
            Status(s["status"])
        except ValueError:
            bad(f"{where}.status", s["status"], str([x.value for x in Status]))
        held = np.asarray(arrays[f"slots_{s['rid']}"])
        if held.ndim != 1 or len(held) != s["kv_len"]:
            bad(f"slots_{s['rid']}", f"{held.shape} slots", f"the kv_len {s['kv_len']}")
        if held.size and (held.min() < 0 or held.max() >= slots):
            bad(
                f"slots_{s['rid']}",
                int(held.max() if held.max() >= slots else held.min()),
                f"the full pool [0, {slots})",
            )
        if s["handle"] is not None:
            if nodes is None:
                bad(f"{where}.handle", s["handle"], "a snapshot without a prefix cache")
            count(f"{where}.handle node", s["handle"][0], nodes - 1)
        if s["follows"] is not None and s["follows"] not in rids:
            bad(f"{where}.follows", s["follows"], "the requests saved before it")
    for queue in ("waiting", "running"):
        for rid in state[queue]:
            if rid not in rids:
                bad(queue, rid, "the saved requests")
    for row in state["free_rows"]:
        count("free_rows", row, rows - 1)
    if len(set(state["free_rows"])) != len(state["free_rows"]):
        bad("free_rows", state["free_rows"], "distinct rows")
    count("next_id", state["next_id"])
    if rids and state["next_id"] <= max(rids):
        bad("next_id", state["next_id"], f"(the largest request id {max(rids)}, ...)")
