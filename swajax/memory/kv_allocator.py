"""Host handle on the device allocator: the object the prefix cache and the scheduler call.

It owns the current `AllocatorState` and applies the jitted pure functions to it. Frees are
deferred and applied together in one device call (`flush`), which runs before anything that
reads or allocates; so a scheduler step that frees many ranges costs one dispatch.
"""

from __future__ import annotations

import numpy as np

from swajax.memory import allocator as A
from swajax.sizing import PoolMode


class KVAllocator:
    def __init__(self, state: A.AllocatorState):
        self.state = state
        self._free: list[np.ndarray] = []
        self._free_swa: list[np.ndarray] = []

    @classmethod
    def create(
        cls, full_size: int, swa_size: int, page_size: int, mode: PoolMode = PoolMode.HYBRID
    ):
        return cls(A.init_allocator(full_size, swa_size, page_size, mode))

    @property
    def page_size(self) -> int:
        return self.state.page_size

    @property
    def mode(self) -> str:
        return self.state.mode

    # -- releases (deferred)
    def free(self, slots) -> None:
        """Release full slots (their whole pages) and, through the mapping, their SWA pages."""
        if len(slots):
            self._free.append(np.array(slots, np.int32))  # a copy: callers may reuse arrays

    def free_swa(self, slots) -> None:
        """Release only the SWA pages paired with these full slots' pages."""
        if len(slots):
            self._free_swa.append(np.array(slots, np.int32))

    def flush(self) -> None:
        if self._free or self._free_swa:
            swa = np.concatenate(self._free_swa) if self._free_swa else np.zeros(0, np.int32)
            full = np.concatenate(self._free) if self._free else np.zeros(0, np.int32)
            self._free, self._free_swa = [], []
            self.state = A.release(self.state, swa, full)

    def move_swa(self, dst, src) -> None:
        self.flush()
        self.state = A.move_swa(self.state, dst, src)

    # -- queries and allocation (flush first)
    def available(self) -> tuple[int, int]:
        """(full, SWA) free tokens."""
        self.flush()
        avail = A.available(self.state)
        return int(avail.full), int(avail.swa)

    def alloc_extend(self, prefix_lens, seq_lens, last_loc) -> tuple[int, np.ndarray]:
        """(status, full slots of the new tokens); see `allocator.alloc_extend`."""
        self.flush()
        self.state, result = A.alloc_extend(self.state, prefix_lens, seq_lens, last_loc)
        n = int(np.sum(np.asarray(seq_lens) - np.asarray(prefix_lens)))
        return int(result.status), np.asarray(result.full_slots)[:n]

    def alloc_decode(self, seq_lens, last_loc) -> tuple[int, np.ndarray]:
        self.flush()
        self.state, result = A.alloc_decode(self.state, seq_lens, last_loc)
        return int(result.status), np.asarray(result.full_slots)[: len(seq_lens)]

    def translate(self, slots) -> np.ndarray:
        self.flush()
        return np.asarray(A.translate(self.state, np.asarray(slots, np.int32)))
