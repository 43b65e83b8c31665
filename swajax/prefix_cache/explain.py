"""Why a prefix-cache match gave what it gave (host code).

A match is explained by where it stopped and why: every whole page matched (the rest of the
key is a partial page, never cached), the tree never held the next page, it held it and an
eviction deleted its full KV, or the window hit rule cut the match at a tombstone (and which
eviction made that tombstone). Evictions are numbered per tree from 1 in the order `evict` is
called, so a trace's `evict` lines name them too.

Knowing that a page *was* cached needs a memory of deleted nodes: `Ghosts` keeps, for the last
`capacity` pages whose full KV the tree deleted, a hash of the whole path up to the page's end
and the eviction that deleted it. Forgotten pages read as never cached; a hash collision could
name the wrong reason, never change a match.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

# What took a tombstone's SWA KV (`Node.tombstoned_by`) or a page's full KV besides an
# eviction's number (>= 1):
INSERTED = 0  # never live in the tree: its request's runtime window eviction freed it first
RELEASED = -1  # its request's early window release tombstoned the leaf it still held

COMPLETE = "complete"  # every token of the key matched
PAGE_ALIGNMENT = "page_alignment"  # every whole page matched; the rest is a partial page
NO_ENTRY = "no_entry"  # the tree never held the next page (as far as it remembers)
FULL_EVICTED = "full_evicted"  # the next page was cached and an eviction deleted its full KV
SWA_TOMBSTONE = "swa_tombstone"  # the window hit rule cut the match at a tombstone
HOST = "host"  # the rest of the path is in a host tier that could not bring it back now
POLICY = "policy"  # the cache shares nothing (prefix caching off), or the request takes no hit
REASONS = (COMPLETE, PAGE_ALIGNMENT, NO_ENTRY, FULL_EVICTED, SWA_TOMBSTONE, HOST, POLICY)


@dataclasses.dataclass(frozen=True)
class MatchReport:
    """One match, explained. Token counts are positions of the key the match was asked about."""

    asked: int  # tokens of the key
    cacheable: int  # of those, on whole pages
    matched: int  # the accepted prefix
    full_match: int  # tokens with full KV on the path: accepted plus what the window rule cut
    stop: str  # why the match ends where it does (REASONS)
    # SWA_TOMBSTONE: the tombstone nearest the full match's end, [start, end); its `cause`
    # (an eviction's number, INSERTED or RELEASED). FULL_EVICTED: the eviction that deleted the
    # next page.
    tombstone: tuple[int, int] | None = None
    cause: int | None = None
    loaded: tuple[int, int] = (0, 0)  # (full, SWA) tokens a host tier brought back
    rebuilt: int = 0  # tokens past `matched` an exact SWA-tail rebuild recovered (the scheduler)

    @property
    def missed(self) -> int:
        """Key tokens the request computes because the cache did not supply them."""
        return self.asked - self.matched - self.rebuilt

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["tombstone"] = list(self.tombstone) if self.tombstone else None
        out["loaded"] = list(self.loaded)
        out["missed"] = self.missed
        out["reason"] = self.describe()
        return out

    def describe(self) -> str:
        head = f"{self.matched} of {self.asked} tokens matched"
        if self.stop == COMPLETE:
            why = "the whole key"
        elif self.stop == PAGE_ALIGNMENT:
            why = f"every whole page; the last {self.asked - self.cacheable} tokens fill no page"
        elif self.stop == NO_ENTRY:
            why = f"no entry for the page at {self.full_match}"
        elif self.stop == FULL_EVICTED:
            why = f"the page at {self.full_match} was cached; {_cause(self.cause)} deleted it"
        elif self.stop == SWA_TOMBSTONE:
            lo, hi = self.tombstone
            why = (
                f"full KV up to {self.full_match}, but the SWA KV of [{lo}, {hi}) is gone "
                f"({_cause(self.cause)}) within the window before every later end"
            )
        elif self.stop == HOST:
            why = f"the path goes on from {self.full_match} in the host tier, not brought back"
        else:
            why = "the cache shares nothing for this request"
        extra = []
        if self.rebuilt:
            extra.append(f"a tail rebuild recovered {self.rebuilt} more")
        if any(self.loaded):
            extra.append(f"{self.loaded[0]} full / {self.loaded[1]} SWA loaded from the host")
        return f"{head}: {why}" + (f"; {', '.join(extra)}" if extra else "")


def _cause(cause: int | None) -> str:
    if cause is None:
        return "an eviction"
    if cause == INSERTED:
        return "freed by its request's window eviction before it was cached"
    if cause == RELEASED:
        return "its request's early window release"
    return f"eviction #{cause}"


def page_hash(previous: int, page: tuple[int, ...]) -> int:
    """The hash of a path one page longer than the path `previous` hashes (0: the root)."""
    return hash((previous, page))


def path_hash(node, ps: int) -> int:
    """The hash of the path from the root to the end of `node`, memoized on the nodes (a split
    keeps the lower part's: its path ends where it did). Iterative: a path may be thousands
    of nodes deep."""
    pending = []
    while node.parent is not None and node.chain is None:
        pending.append(node)
        node = node.parent
    h = 0 if node.parent is None else node.chain
    for x in reversed(pending):
        for i in range(0, len(x.key), ps):
            h = page_hash(h, x.key[i : i + ps])
        x.chain = h
    return h


class Ghosts:
    """The pages whose full KV the tree deleted, most recent last: path hash -> cause."""

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = capacity
        self._pages: OrderedDict[int, int] = OrderedDict()

    def record(self, node, ps: int, cause: int) -> None:
        """Every page of `node`, about to be deleted."""
        h = path_hash(node.parent, ps)
        for i in range(0, len(node.key), ps):
            h = page_hash(h, node.key[i : i + ps])
            self._pages[h] = cause
            self._pages.move_to_end(h)
        while len(self._pages) > self.capacity:
            self._pages.popitem(last=False)

    def cause(self, h: int) -> int | None:
        return self._pages.get(h)

    def items(self):
        """(path hash, cause), oldest first (a snapshot's order)."""
        return self._pages.items()

    def restore(self, h: int, cause: int) -> None:
        """Append one page of a snapshot (`items` order)."""
        self._pages[h] = cause


def explain(tree, key: tuple, asked: int, path: list, best: int, full: int, loaded) -> MatchReport:
    """The report of a match of `key` (page aligned, of a key of `asked` tokens) that walked
    `path`, accepted its first `best` nodes and found device full KV for `full` tokens."""
    ends = [0]
    for node in path:
        ends.append(ends[-1] + len(node))
    report = dict(asked=asked, cacheable=len(key), matched=ends[best], full_match=full)
    if full > ends[best]:
        cut = [i for i in range(len(path)) if ends[i + 1] <= full and not path[i].swa_valid]
        if not cut:
            return MatchReport(**report, stop=HOST, loaded=loaded)
        node = path[cut[-1]]
        span = (ends[cut[-1]], ends[cut[-1] + 1])
        return MatchReport(
            **report, stop=SWA_TOMBSTONE, tombstone=span, cause=node.tombstoned_by, loaded=loaded
        )
    if full < ends[-1]:
        return MatchReport(**report, stop=HOST, loaded=loaded)
    if full >= len(key):
        stop = COMPLETE if asked == len(key) else PAGE_ALIGNMENT
        return MatchReport(**report, stop=stop, loaded=loaded)
    ps = tree.ps
    previous = path_hash(path[-1], ps) if path else 0
    cause = tree.ghosts.cause(page_hash(previous, key[full : full + ps]))
    stop = NO_ENTRY if cause is None else FULL_EVICTED
    return MatchReport(**report, stop=stop, cause=cause, loaded=loaded)
