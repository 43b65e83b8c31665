"""The operation cases' protocol: what a backend (allocator + hybrid radix tree) is asked to do,
and what it must answer. This is the one place it is written down; `OPS_SCHEMA` (written to a
kit as `ops.schema.json`) says the same in JSON Schema, and `examples/kit_checker.py` compares a
backend's answers with a kit's without any swajax code.

A case `ops/NAME.jsonl` is JSON lines. Line 1, the header (`op` "init"): `full_size` and
`swa_size` (tokens in each pool; page 0 of each is reserved), `page_size`, `mode` ("hybrid":
two pools; "all_swa": one pool, SWA only; "single": one pool, no window), `window` (W, tokens
before the query; null for "single"), `cap_leaf_to_window`, `profile` (the cache-policy rules
the case follows, `prefix_cache/policy.py`), `ops` (the number of operation lines), `ran` (what
the recorded engine ran: `overlap`, `launched_ahead`, `speculative_tokens`, `accepted_tokens`;
the operations are the same calls either way). The last line is `{"op": "end", "ops": n}`.
Kit cases write every list plainly (a recorded trace may delta-encode long lists,
`swajax.trace.codec`).

Every other line is one call, its arguments, and `expect`, the answer. Slots are full-pool
token indices (page p holds slots p*page_size ... p*page_size + page_size - 1); in hybrid mode
the backend derives SWA slots itself. Tokens are ints; all lists are lists of ints.

    op             arguments                                   expect (besides the two below)
    alloc_extend   prefix_lens, seq_lens, last_loc (one per     status, slots (the new tokens'
                   request: cached length, length after the      full slots, requests in order)
                   step, slot of the last cached token or -1)
    alloc_decode   seq_lens (after the step), last_loc          status, slots (one per request)
    free           slots (their full and SWA KV)               mapped (hybrid; see below)
    free_swa       slots (SWA KV only; page_size > 1: one slot  mapped (hybrid)
                   per page, meaning the whole page)
    match          tokens                                      length, slots, tail_miss
    lock           node (the tokens from the root to the end    handle
                   of a matched node)
    unlock         handle
    release_swa    handle (release only the window part of
                   the lock, once; again is a no-op)
    evict          full, swa (tokens to free at least)          evicted ([full, SWA] freed)
    insert         tokens, slots, prev_prefix_len,              prefix_len (tokens already
                   swa_evicted_seqlen, keep_tombstone_leaf      cached)
    cache_unfinished  tokens, slots, cache_protected_len,       prefix (the cache's slots for
                   swa_evicted_seqlen, handle                     the page-aligned part), handle
                   [, swa_branching_seqlen: the request's branch
                   point under the branch-insert rule: an insert
                   starting below it that reaches it stops there]
    cache_finished tokens, slots, cache_protected_len,
                   swa_evicted_seqlen, handle, insert
                   [, swa_evict_floor: all-SWA pools under the
                   prefill-floor rule: cache only positions
                   below it; [floor, swa_evicted_seqlen) is
                   already free; swa_branching_seqlen as above,
                   the positions after the point are freed]

Every `expect` also holds `available` ([full, SWA] free tokens after the call; one pool: the
same number twice) and `sizes` ([full evictable, full protected, SWA evictable, SWA protected]
tokens the cache holds after the call). A backend's answer must equal `expect` in every field:

- `status`: 0 allocated; 1 the full pool is short; 2 the SWA pool is short (all_swa: the one
  pool); 3 a request continuing a page has no SWA KV at its last slot (its window was freed).
  Checked in that order; on a non-zero status nothing is allocated and `slots` is [].
- `slots` / `prefix`: compared through a page bijection, not by number: a backend may hand out
  pages in any order. When an allocation's slot sits at offset 0 of its page, the recorded page
  and the backend's page pair (replacing older pairings of either); every other slot must
  continue the page its predecessor paired with. Slots passed *in* are recorded numbers: the
  backend translates them through the pairing. A slot passed in may lie on a page freed and
  handed out again since (an all-SWA request's positions that slid out of its window, which
  the backend must skip): it translates as its page last did. -1 and 0 map to themselves.
- `mapped` (hybrid only): how many full slots on the pages of `slots` still map to an SWA
  slot after the call: 0, since a release takes whole pages and every slot's mapping with them
  (a backend that clears only the slots it was given keeps the rest mapped). A backend answers
  it through a `translate(full slots) -> SWA slots` of its mapping.
- `handle`: locks are numbered 0, 1, 2, ... in the order they are taken: each `lock`, and each
  `cache_unfinished` that moves the request's lock (it answers the new lock's number; when it
  keeps the lock it was given, that lock's number, or null if it was given none). Arguments
  name locks by these numbers.
- `length` / `tail_miss`: the accepted prefix (a page multiple meeting the window rule: W live
  tokens before its end, or no tombstone on the whole path) and the full-KV tokens after it
  that the window rule cut off.
- `evicted`: what an `evict` freed, whole nodes, [full, SWA] tokens.

Every 50 engine steps and at the end of a case, a pair of `evict` lines (SWA, then full, each
asking for both pools' sizes together) drains the cache: after them, `available` counts
everything no request holds, and at the end of a case both pools exactly (a slot leaked or
freed twice surfaces there).
"""

from __future__ import annotations

from swajax.trace.check import BOOL, HANDLE, INT, INTS, OPS, OPTIONAL, PROFILES, RAN

_INTS = {"type": "array", "items": {"type": "integer"}}
_HANDLE = {"type": ["integer", "null"]}
_COMMON = {
    "available": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "minItems": 2,
        "maxItems": 2,
    },
    "sizes": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "minItems": 4,
        "maxItems": 4,
    },
}


HYBRID_ONLY = {"mapped"}  # answered in hybrid mode only (no mapping otherwise)


def _op(name: str, args: dict, optional) -> dict:
    answer = ANSWERS[name]
    return {
        "type": "object",
        "properties": {
            "op": {"const": name},
            **{field: _TYPES[kind] for field, kind in args.items()},
            "expect": {
                "type": "object",
                "properties": {**_COMMON, **answer},
                "required": sorted({*_COMMON, *answer} - HYBRID_ONLY),
                "additionalProperties": False,
            },
        },
        "required": sorted({"op", "expect", *args} - set(optional)),
        "additionalProperties": False,
    }


# The arguments' types come from the trace format's own checks (`trace/check.py`); the answers
# are what `trace.recorder.observe` records.
_TYPES = {INTS: _INTS, INT: {"type": "integer"}, BOOL: {"type": "boolean"}, HANDLE: _HANDLE}
_STATUS = {"status": {"enum": [0, 1, 2, 3]}, "slots": _INTS}
ANSWERS = {
    "alloc_extend": _STATUS,
    "alloc_decode": _STATUS,
    "free": {"mapped": {"type": "integer", "minimum": 0}},
    "free_swa": {"mapped": {"type": "integer", "minimum": 0}},
    "match": {"length": {"type": "integer"}, "slots": _INTS, "tail_miss": {"type": "integer"}},
    "lock": {"handle": {"type": "integer"}},
    "unlock": {},
    "release_swa": {},
    "evict": {
        "evicted": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    },
    "insert": {"prefix_len": {"type": "integer"}},
    "cache_unfinished": {"prefix": _INTS, "handle": _HANDLE},
    "cache_finished": {},
}
OPERATIONS = [_op(name, args, OPTIONAL.get(name, ())) for name, args in OPS.items()]
HEADER = {
    "type": "object",
    "properties": {
        "op": {"const": "init"},
        "version": {"const": 3},
        "full_size": {"type": "integer", "minimum": 0},
        "swa_size": {"type": "integer", "minimum": 0},
        "page_size": {"type": "integer", "minimum": 1},
        "mode": {"enum": ["hybrid", "all_swa", "single"]},
        "window": {"type": ["integer", "null"]},
        "cap_leaf_to_window": {"type": "boolean"},
        "profile": {"enum": list(PROFILES)},
        "ops": {"type": "integer", "minimum": 0},
        "config": {"type": "object"},
        "ran": {
            "type": "object",
            "properties": {
                k: {"type": "boolean"} if v is False else {"type": "integer", "minimum": 0}
                for k, v in RAN.items()
            },
            "additionalProperties": False,
        },
    },
    "required": [
        "op",
        "version",
        "full_size",
        "swa_size",
        "page_size",
        "mode",
        "window",
        "cap_leaf_to_window",
        "profile",
        "ops",
    ],
}
FOOTER = {
    "type": "object",
    "properties": {"op": {"const": "end"}, "ops": {"type": "integer"}},
    "required": ["op", "ops"],
    "additionalProperties": False,
}
# One schema for any line of an operation case.
OPS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "swajax conformance kit: one line of an operation case (ops/NAME.jsonl)",
    "oneOf": [HEADER, FOOTER, *OPERATIONS],
}
