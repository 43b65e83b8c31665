"""Answer a conformance kit's operation cases with your own allocator and prefix cache: the
adapter side of the protocol, written from swajax/conformance/protocol.py alone (standard
library only), as the author of another backend would write it.

    python examples/kit_adapter.py KIT_DIR ANSWERS_DIR --backend MODULE:FACTORY
    python examples/kit_checker.py KIT_DIR ANSWERS_DIR

FACTORY(header) is called once per case with the case's header line (pool sizes, page size,
mode, window, profile) and returns the backend (or raises NotImplementedError to decline the
case: no answers are written for it, and the checker reports it skipped): an object with
these methods, every slot in the backend's own numbering (this file translates the recorded
numbers both ways):

    available() -> (full, swa)          free tokens
    sizes() -> (full_evictable, full_protected, swa_evictable, swa_protected)
    alloc_extend(prefix_lens, seq_lens, last_loc) -> (status, slots)
    alloc_decode(seq_lens, last_loc) -> (status, slots)
    free(slots), free_swa(slots)
    translate(slots) -> SWA slots      (hybrid: the full -> SWA mapping, 0 where none)
    match(tokens) -> (length, slots, tail_miss)
    lock(tokens) -> a lock (any object): the node that ends after `tokens` (root when empty)
    unlock(lock or None), release_swa(lock)
    evict(full, swa) -> (full, swa) freed
    insert(tokens, slots, prev_prefix_len, swa_evicted_seqlen, keep_tombstone_leaf) -> prefix_len
    cache_unfinished(tokens, slots, cache_protected_len, swa_evicted_seqlen, lock)
        -> (prefix slots, the lock the request holds now: a new one, or `lock` kept)
    cache_finished(tokens, slots, cache_protected_len, swa_evicted_seqlen, lock, insert)
        (all-SWA cases under the prefill-floor rule also pass `swa_evict_floor`)
    Cases under the branch-insert rule (profile sglang-0.5.23) also pass `swa_branching_seqlen`
    to both cache_ calls: the request's branch point (protocol: an insert that starts below it
    and reaches it stops there).
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

ALLOCS = ("alloc_extend", "alloc_decode")
HANDLE_OPS = ("unlock", "release_swa", "cache_unfinished", "cache_finished")


class Slots:
    """Recorded slot numbers -> the backend's: pages pair when an allocation hands out the
    slot at offset 0 of a page (the recorded page with the backend's), replacing older
    pairings of either; a recorded page whose backend page went to another keeps translating
    as it last did (slots passed in may lie on it); -1 and 0 stand for themselves."""

    def __init__(self, page_size):
        self.ps, self.to_backend, self.to_recorded, self.last = page_size, {}, {}, {}

    def pair(self, recorded, actual):
        for r, a in zip(recorded, actual):
            if r % self.ps == 0:
                rp, ap = r // self.ps, a // self.ps
                self.to_recorded.pop(self.to_backend.pop(rp, None), None)
                self.to_backend.pop(self.to_recorded.pop(ap, None), None)
                self.to_backend[rp] = self.last[rp] = ap
                self.to_recorded[ap] = rp

    def backend(self, slots):
        """None if a slot lies on a page never paired (an earlier answer already differs)."""
        if any(s > 0 and s // self.ps not in self.last for s in slots):
            return None
        return [s if s <= 0 else self.last[s // self.ps] * self.ps + s % self.ps for s in slots]


def answer_case(case_path, factory):
    """The backend's answer to every operation line of one case, in the backend's numbering."""
    lines = [json.loads(x) for x in Path(case_path).read_text().splitlines() if x.strip()]
    header, ops = lines[0], lines[1:-1]
    backend, slots = factory(header), Slots(header["page_size"])
    locks = {}  # protocol handle -> the backend's lock, numbered in the order taken
    answers = []
    for line in ops:
        op, expect = line["op"], line["expect"]
        args = {k: v for k, v in line.items() if k not in ("op", "expect")}
        for name in ("slots", "last_loc"):  # slots passed in are recorded numbers
            if name in args:
                args[name] = slots.backend(args[name])
                if args[name] is None:  # the checker names the earlier difference
                    return answers
        handle = args.pop("handle", None)
        if op in HANDLE_OPS:
            args["lock"] = locks.get(handle)
        answer = _call(backend, op, args)
        if op == "cache_unfinished" and answer["handle"] is args["lock"]:
            answer["handle"] = handle  # kept the request's lock (or still holds none)
        elif op in ("lock", "cache_unfinished"):  # a lock taken: the next number
            locks[len(locks)] = answer["handle"]
            answer["handle"] = len(locks) - 1
        if op in ALLOCS and answer["status"] == 0 and expect.get("status") == 0:
            slots.pair(expect["slots"], answer["slots"])
        if op in ("free", "free_swa") and header["mode"] == "hybrid":
            answer["mapped"] = _mapped(backend, args["slots"], header["page_size"])
        answer["available"] = [int(x) for x in backend.available()]
        answer["sizes"] = [int(x) for x in backend.sizes()]
        answers.append(answer)
    return answers


def _mapped(backend, slots, ps):
    """Slots on the pages of `slots` still mapped to an SWA slot."""
    pages = sorted({int(s) // ps for s in slots if int(s) > 0})
    full = [p * ps + offset for p in pages for offset in range(ps)]
    return sum(1 for swa in backend.translate(full) if int(swa) > 0) if full else 0


def _call(backend, op, args):
    ints = lambda xs: [int(x) for x in xs]  # noqa: E731
    if op in ALLOCS:
        status, slots = getattr(backend, op)(**args)
        return dict(status=int(status), slots=ints(slots) if status == 0 else [])
    if op == "match":
        length, slots, tail_miss = backend.match(args["tokens"])
        return dict(length=int(length), slots=ints(slots), tail_miss=int(tail_miss))
    if op == "lock":
        return dict(handle=backend.lock(args["node"]))
    if op == "evict":
        return dict(evicted=ints(backend.evict(args["full"], args["swa"])))
    if op == "insert":
        defaults = dict(prev_prefix_len=0, swa_evicted_seqlen=0, keep_tombstone_leaf=False)
        return dict(prefix_len=int(backend.insert(**{**defaults, **args})))
    if op == "cache_unfinished":
        prefix, lock = backend.cache_unfinished(**args)
        return dict(prefix=ints(prefix), handle=lock)
    getattr(backend, op)(**args)  # free, free_swa, unlock, release_swa, cache_finished
    return {}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kit")
    p.add_argument("answers")
    p.add_argument("--backend", required=True, metavar="MODULE:FACTORY")
    args = p.parse_args(argv)
    module, _, name = args.backend.partition(":")
    sys.path.insert(0, str(Path.cwd()))  # MODULE may live where the command runs
    factory = getattr(importlib.import_module(module), name)
    manifest = json.loads((Path(args.kit) / "manifest.json").read_text())
    out = Path(args.answers)
    out.mkdir(parents=True, exist_ok=True)
    for case in manifest["cases"]:
        if case["kind"] == "ops":
            try:
                answers = answer_case(Path(args.kit) / case["path"], factory)
            except NotImplementedError as e:  # the backend declines the case (no answers)
                print(f"skipped {case['name']}: {e}")
                continue
            text = "".join(json.dumps(a) + "\n" for a in answers)
            (out / f"{case['name']}.jsonl").write_text(text)
            print(f"answered {case['name']} ({len(answers)} operations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
