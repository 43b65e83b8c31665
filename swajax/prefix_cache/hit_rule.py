"""The window hit rule, in one place.

A cached prefix may end at a node only if a query there can read its whole window: at least W
contiguous tokens whose SWA KV is there precede the end, or the path from the root has none
missing (a prompt shorter than W reads everything before it). The tree applies it to the SWA KV
it counts as valid (device or host-resident, which a hit loads back); the host tier to device KV
alone, stopping where the path leaves the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

INF = float("inf")


def hit_end(
    path: Sequence,
    window: int,
    has_swa: Callable[[object], bool],
    usable: Callable[[object], bool] | None = None,
) -> int:
    """The most nodes of `path` (root first; each has a length in tokens) a match may keep:
    the deepest end at which at least `window` tokens of nodes with `has_swa` precede it without
    a gap, or which has no gap above it. `usable`: the path ends before the first node that is
    not (its tokens are not there at all)."""
    best, since = 0, INF
    for i, node in enumerate(path):
        if usable is not None and not usable(node):
            return best if since < window else i
        if has_swa(node):
            since += len(node)
        else:
            best = i if since >= window else best
            since = 0
    return len(path) if since >= window else best
