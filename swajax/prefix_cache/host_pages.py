"""The host tier's page free lists (host code): page-granular like the device pools."""

from __future__ import annotations

import numpy as np


class HostPages:
    """A free list of host pages (ids from 1), page-granular like the device pools."""

    def __init__(self, pages: int):
        self.total = pages
        self._free = list(range(pages, 0, -1))  # the lowest on top

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def free_ids(self) -> set[int]:
        return set(self._free)

    def take(self, n: int) -> np.ndarray | None:
        if n > len(self._free):
            return None
        out = self._free[len(self._free) - n :][::-1]
        del self._free[len(self._free) - n :]
        return np.asarray(out, np.int32)

    def state(self) -> list[int]:
        """The free list in its order (a snapshot's)."""
        return list(self._free)

    def load_state(self, free: list[int]) -> None:
        self._free = [int(p) for p in free]

    def give(self, pages) -> None:
        self._free.extend(int(p) for p in np.asarray(pages)[::-1])
