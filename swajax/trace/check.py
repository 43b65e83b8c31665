"""The trace format's schema: every line of a trace is checked before anything is replayed.

Version 3 (written): line 1 is the `init` header (format version, the model's type and layer
kinds, pool sizes, page size, mode, window, cache policy profile and `ops`, the number of
operation lines), the last line the footer `{"op": "end", "ops": n}`; long integer lists are
deltas of earlier ones (`trace_codec.py`) and the file may be gzip-compressed. Version 2 (read):
the same header without config and profile, plain lists, no footer. A trace cut short, even at a
line boundary, is detected by the count and (version 3) the missing footer. Every operation
names a known `op`, carries exactly the fields that op takes with the right types, and stays
within the sizes of the header, so a malformed or adversarial trace is refused with the line and
the field named, never half-replayed or left to hang.
"""

from __future__ import annotations

from swajax.errors import InputError

FORMAT_VERSION = 3
READS = (2, 3)
PROFILES = ("swajax", "sglang-0.5.23", "lean")  # cache policy profiles a trace may name
MAX_TOKENS = 1 << 26  # pool tokens, and the longest token / slot list on a line
MAX_PAGE = 1 << 16

# The header's `ran`: what the recorded engine ran (overlap scheduling and how many steps were
# launched ahead, speculative decoding's draft tokens per round and how many were accepted);
# the operations are the same calls either way. Values: a sample of each field's type.
RAN = {"overlap": False, "launched_ahead": 0, "speculative_tokens": 0, "accepted_tokens": 0}

INTS, INT, BOOL, HANDLE, EXPECT = "ints", "int", "bool", "handle", "expect"
OPS = {
    "alloc_extend": {"prefix_lens": INTS, "seq_lens": INTS, "last_loc": INTS},
    "alloc_decode": {"seq_lens": INTS, "last_loc": INTS},
    "free": {"slots": INTS},
    "free_swa": {"slots": INTS},
    "match": {"tokens": INTS},
    "insert": {
        "tokens": INTS,
        "slots": INTS,
        "prev_prefix_len": INT,
        "swa_evicted_seqlen": INT,
        "keep_tombstone_leaf": BOOL,
    },
    "lock": {"node": INTS},
    "unlock": {"handle": HANDLE},
    "release_swa": {"handle": HANDLE},
    "evict": {"full": INT, "swa": INT},
    "cache_finished": {
        "tokens": INTS,
        "slots": INTS,
        "cache_protected_len": INT,
        "swa_evicted_seqlen": INT,
        "handle": HANDLE,
        "insert": BOOL,
        "swa_evict_floor": INT,
        "swa_branching_seqlen": INT,
    },
    "cache_unfinished": {
        "tokens": INTS,
        "slots": INTS,
        "cache_protected_len": INT,
        "swa_evicted_seqlen": INT,
        "handle": HANDLE,
        "swa_branching_seqlen": INT,
    },
}
# Arguments a line may leave out: the prefill-floor rule's floor and the branch-insert rule's
# branch point (prefix_cache/policy.py) appear only where the rule is on and the request has one.
OPTIONAL = {
    "insert": {"prev_prefix_len", "swa_evicted_seqlen", "keep_tombstone_leaf"},
    "cache_finished": {"swa_evict_floor", "swa_branching_seqlen"},
    "cache_unfinished": {"swa_branching_seqlen"},
}


class TraceError(InputError):
    """A trace that does not follow the format; the message names the line and the field."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_value(kind: str, value, where: str, limit: int) -> None:
    if kind == INTS:
        if not isinstance(value, list) or len(value) > MAX_TOKENS:
            raise TraceError(f"{where}: must be a list of at most {MAX_TOKENS} integers")
        if not all(_is_int(v) and -1 <= v <= limit for v in value):
            raise TraceError(f"{where}: every entry must be an integer in [-1, {limit}]")
    elif kind == INT:
        if not _is_int(value) or not 0 <= value <= limit:
            raise TraceError(f"{where}: must be an integer in [0, {limit}], got {value!r}")
    elif kind == BOOL:
        if not isinstance(value, bool):
            raise TraceError(f"{where}: must be true or false, got {value!r}")
    elif kind == HANDLE and value is not None and not (_is_int(value) and value >= 0):
        raise TraceError(f"{where}: must be a lock number or null, got {value!r}")


def check_header(init, path: str) -> None:
    if not isinstance(init, dict) or init.get("op") != "init":
        raise TraceError(f"{path}:1: the first line must be the 'init' header")
    if init.get("version") not in READS:
        raise TraceError(
            f"{path}:1: trace format version {init.get('version')!r}; this swajax reads "
            f"versions {', '.join(map(str, READS))}"
        )
    if init["version"] >= 3 and init.get("profile") not in PROFILES:
        raise TraceError(
            f"{path}:1: profile must be one of {PROFILES}, got {init.get('profile')!r}"
        )
    ps = init.get("page_size")
    if not _is_int(ps) or not 1 <= ps <= MAX_PAGE:
        raise TraceError(f"{path}:1: page_size must be an integer in [1, {MAX_PAGE}]")
    for name in ("full_size", "swa_size"):
        size = init.get(name)
        if not _is_int(size) or not ps <= size <= MAX_TOKENS or size % ps:
            raise TraceError(
                f"{path}:1: {name} must be a multiple of page_size {ps} in [{ps}, {MAX_TOKENS}]"
            )
    if init.get("mode") not in ("hybrid", "single", "all_swa"):
        raise TraceError(f"{path}:1: mode must be hybrid, single or all_swa")
    window = init.get("window")
    if window is not None and (not _is_int(window) or not 1 <= window <= MAX_TOKENS):
        raise TraceError(f"{path}:1: window must be null or an integer >= 1")
    if not isinstance(init.get("cap_leaf_to_window"), bool):
        raise TraceError(f"{path}:1: cap_leaf_to_window must be true or false")
    if not _is_int(init.get("ops")) or init["ops"] < 0:
        raise TraceError(f"{path}:1: ops must be the number of operation lines")
    ran = init.get("ran", {})  # what ran (version 3 traces written since it was added)
    if not isinstance(ran, dict) or set(ran) - set(RAN):
        raise TraceError(f"{path}:1: ran must be an object with fields among {sorted(RAN)}")
    for name, value in ran.items():
        if type(value) is not type(RAN[name]) or (_is_int(value) and value < 0):
            kind = "true or false" if RAN[name] is False else "an integer >= 0"
            raise TraceError(f"{path}:1: ran.{name} must be {kind}, got {value!r}")


def check_line(line, number: int, path: str, limit: int) -> None:
    """One operation line; `limit` bounds every integer (slots, lengths, tokens)."""
    where = f"{path}:{number}"
    if not isinstance(line, dict) or line.get("op") not in OPS:
        op = line.get("op") if isinstance(line, dict) else None
        raise TraceError(f"{where}: unknown operation {op!r}; known: {', '.join(OPS)}")
    fields = OPS[line["op"]]
    extra = set(line) - set(fields) - {"op", "expect"}
    if extra:
        raise TraceError(f"{where}: {line['op']} takes no field {sorted(extra)[0]!r}")
    for name, kind in fields.items():
        if name not in line:
            if name in OPTIONAL.get(line["op"], ()):
                continue
            raise TraceError(f"{where}: {line['op']} needs the field {name!r}")
        _check_value(kind, line[name], f"{where}: {name}", limit)
    if not isinstance(line.get("expect"), dict):
        raise TraceError(f"{where}: every operation needs its 'expect' object")


def check(lines: list, path: str) -> None:
    if not lines:
        raise TraceError(f"{path}: the trace is empty")
    check_header(lines[0], path)
    if lines[0]["ops"] != len(lines) - 1:
        raise TraceError(
            f"{path}: the header announces {lines[0]['ops']} operations, the file holds "
            f"{len(lines) - 1} (truncated or appended to)"
        )
    pool = max(lines[0]["full_size"], lines[0]["swa_size"])
    limit = min(pool * 64, MAX_TOKENS)  # bounds token ids and lengths too
    for number, line in enumerate(lines[1:], 2):
        check_line(line, number, path, limit)
        if line["op"] in ("alloc_extend", "alloc_decode"):
            _check_allocation(line, f"{path}:{number}", pool)


def _check_allocation(line, where: str, pool: int) -> None:
    """An allocation asks for no more than the pool holds, with consistent lengths."""
    seq, last = line["seq_lens"], line["last_loc"]
    pre = line.get("prefix_lens", [s - 1 for s in seq])
    if not (len(pre) == len(seq) == len(last)) or not seq:
        raise TraceError(f"{where}: prefix_lens, seq_lens and last_loc need one entry per request")
    if any(not 0 <= p <= s for p, s in zip(pre, seq)):
        raise TraceError(f"{where}: need 0 <= prefix_lens <= seq_lens")
    new = sum(s - p for p, s in zip(pre, seq))
    if new > pool:
        raise TraceError(f"{where}: asks for {new} tokens, more than the pool's {pool}")
