"""What a prefix-cache match returns (host code)."""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.prefix_cache.explain import MatchReport
from swajax.prefix_cache.node import Node

_EMPTY = np.zeros(0, np.int32)


@dataclasses.dataclass(frozen=True)
class MatchResult:
    slots: np.ndarray  # full slots of the accepted prefix (a multiple of the page size)
    node: Node | None  # last accepted node (the root when nothing matched)
    # Full slots of the path the window rule cut off after the accepted prefix, and the node
    # where that path ends (None if nothing was cut): what an exact SWA-tail rebuild reads.
    tail: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)
    tail_node: Node | None = None
    loaded: tuple[int, int] = (0, 0)  # (full, SWA) tokens the match brought back from the host
    report: MatchReport | None = None  # why it gave what it gave (explain.py)

    @property
    def tail_miss(self) -> int:
        """Tokens on the key's path that the window rule cut off."""
        return len(self.tail)

    @property
    def full_length(self) -> int:
        """How far the key matched with full KV (accepted plus what the window rule cut)."""
        return len(self.slots) + len(self.tail)

    def __len__(self) -> int:
        return len(self.slots)
