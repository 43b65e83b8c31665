"""The allocator of `memory/allocator.py` in numpy, page for page: the same stacks, the same pop
and push order, the same pairing and the same status codes, so a model that reads no KV (the
null model) runs the engine's bookkeeping with no device program at all.

The device allocator is a jitted pytree because a real model's step reads the slots it hands
out inside the same program; the null model reads nothing, and for it every jitted call is
overhead (a compile per pool size, a dispatch per step). `simulate` and `plan` run thousands of
steps over dozens of pool sizes, so they use this one. Its state is mutable: it is host code.
Equality with the device allocator, slot for slot and page for page, is a property test
(tests/memory/test_host_allocator.py), which is what lets a trace recorded on either replay on
the other.
"""

from __future__ import annotations

import numpy as np

from swajax.arith import ceil_div
from swajax.memory.allocator import (
    FULL_SHORT,
    OK,
    SWA_LAST_LOC_MISSING,
    SWA_SHORT,
    AllocatorState,
    check_sizes,
)
from swajax.memory.page_stack import PageStack
from swajax.sizing import PoolMode


class HostPageStack:
    """`memory.page_stack.PageStack` on the host: free pages 1..n, the top at pages[count - 1]."""

    def __init__(self, num_pages: int):
        self.pages = np.arange(num_pages, 0, -1, dtype=np.int32)
        self.count = num_pages
        self.is_free = np.ones(num_pages + 1, bool)
        self.is_free[0] = False

    @property
    def size(self) -> int:
        return len(self.pages)

    def peek(self, j: np.ndarray) -> np.ndarray:
        """The pages the (j+1)-th pops would return (clamped in range, as on the device)."""
        return self.pages[np.clip(self.count - 1 - np.asarray(j), 0, self.size - 1)]

    def pop(self, n: int, popped: np.ndarray) -> None:
        self.count -= int(n)
        self.is_free[popped] = False
        self.is_free[0] = False

    def push(self, candidates: np.ndarray) -> None:
        """Push the pages in use among `candidates` (repeats, 0 and free pages are skipped); the
        lowest ends on top."""
        pages = np.unique(candidates)
        pages = pages[(pages > 0) & ~self.is_free[pages]]
        k = len(pages)
        self.pages[self.count : self.count + k] = pages[::-1]
        self.count += k
        self.is_free[pages] = True

    def claim(self, pages: np.ndarray) -> None:
        """Take the given free pages off the stack, the others keeping their order."""
        self.is_free[pages] = False
        self.is_free[0] = False
        live = self.pages[: self.count]
        keep = live[self.is_free[live]]
        self.pages = np.zeros_like(self.pages)  # (as on the device: peeks past the end read 0)
        self.pages[: len(keep)] = keep
        self.count = len(keep)

    def as_stack(self) -> PageStack:
        """A copy as the device's pytree (numpy leaves)."""
        return PageStack(self.pages.copy(), np.int32(self.count), self.is_free.copy())


class HostAllocator:
    """Full and SWA page stacks and the full -> SWA map; slots are numpy int32 arrays."""

    def __init__(
        self, full_size: int, swa_size: int, page_size: int, mode: PoolMode = PoolMode.HYBRID
    ):
        self.mode, self.page_size = PoolMode(mode), page_size
        check_sizes(full_size, swa_size, page_size, self.mode)
        ps = page_size
        self.full = HostPageStack(full_size // ps) if self.mode is not PoolMode.ALL_SWA else None
        self.swa = HostPageStack(swa_size // ps) if self.mode is not PoolMode.SINGLE else None
        self.full_to_swa = None
        if self.mode is PoolMode.HYBRID:
            self.full_to_swa = np.zeros(full_size + ps + 1, np.int32)
            self.full_to_swa[-1] = -1

    @property
    def primary(self) -> HostPageStack:
        return self.swa if self.mode is PoolMode.ALL_SWA else self.full

    @property
    def hybrid(self) -> bool:
        return self.mode is PoolMode.HYBRID

    def as_state(self) -> AllocatorState:
        """A copy as the device allocator's state (numpy leaves): what
        `allocator.check_invariants` and comparisons with a device run read."""
        return AllocatorState(
            full=self.full.as_stack() if self.full is not None else None,
            swa=self.swa.as_stack() if self.swa is not None else None,
            full_to_swa=None if self.full_to_swa is None else self.full_to_swa.copy(),
            page_size=self.page_size,
            mode=self.mode,
        )

    def available(self) -> tuple[int, int]:
        """Free (full, SWA) tokens; outside hybrid mode both are the one pool's count."""
        primary = self.primary.count * self.page_size
        return primary, (self.swa.count * self.page_size if self.hybrid else primary)

    def translate(self, full_slots: np.ndarray) -> np.ndarray:
        if not self.hybrid:
            return full_slots
        return np.where(full_slots < 0, -1, self.full_to_swa[np.maximum(full_slots, 0)])

    # -- allocation --------------------------------------------------------------------------

    def alloc_extend(self, prefix_lens, seq_lens, last_loc) -> tuple[int, np.ndarray]:
        """Extend request i from prefix_lens[i] to seq_lens[i] tokens: (status, full slot of
        each new token, request after request). On failure nothing changes."""
        pre, seq = np.asarray(prefix_lens, np.int64), np.asarray(seq_lens, np.int64)
        last = np.asarray(last_loc, np.int64)
        ps = self.page_size
        n = seq - pre
        req = np.repeat(np.arange(len(pre)), n)
        pos = pre[req] + np.arange(len(req)) - np.repeat(np.cumsum(n) - n, n)
        first_new = ceil_div(pre, ps)
        new_pages = ceil_div(seq, ps) - first_new
        num_pages = int(new_pages.sum())
        base = np.cumsum(new_pages) - new_pages

        def layout(stack, last_slot):
            in_tail = pos < first_new[req] * ps
            page = np.where(in_tail, 0, stack.peek(base[req] + pos // ps - first_new[req]))
            slot = np.where(in_tail, last_slot[req] + 1 + pos - pre[req], page * ps + pos % ps)
            return slot, page

        full, full_pages = layout(self.primary, last)
        swa_last = self.translate(last)
        swa, swa_pages = layout(self.swa, swa_last) if self.hybrid else (full, full_pages)
        needs_last = (pre % ps != 0) & (seq > pre)
        status = self._status(num_pages, swa_last, needs_last)
        if status == OK:
            self._commit(num_pages, full, swa, full_pages, swa_pages)
        return status, full.astype(np.int32)

    def alloc_decode(self, seq_lens, last_loc) -> tuple[int, np.ndarray]:
        """One new token per request (seq_lens include it; last_loc: the slot before it)."""
        seq, last = np.asarray(seq_lens, np.int64), np.asarray(last_loc, np.int64)
        ps = self.page_size
        need = (seq - 1) % ps == 0
        j = np.cumsum(need) - 1

        def slots(stack, last_slot):
            page = np.where(need, stack.peek(j), 0)
            return np.where(need, page * ps, last_slot + 1), page

        full, full_pages = slots(self.primary, last)
        swa_last = self.translate(last)
        swa, swa_pages = slots(self.swa, swa_last) if self.hybrid else (full, full_pages)
        num_pages = int(need.sum())
        status = self._status(num_pages, swa_last, ~need)
        if status == OK:
            self._commit(num_pages, full, swa, full_pages, swa_pages)
        return status, full.astype(np.int32)

    def _status(self, num_pages: int, swa_last: np.ndarray, needs_last: np.ndarray) -> int:
        """Both pools checked (and that a continued page still has its SWA slot), in the
        device allocator's order of precedence."""
        if num_pages > self.primary.count:
            return SWA_SHORT if self.mode is PoolMode.ALL_SWA else FULL_SHORT
        if self.hybrid and num_pages > self.swa.count:
            return SWA_SHORT
        if np.any(needs_last & (swa_last <= 0)):
            return SWA_LAST_LOC_MISSING
        return OK

    def _commit(self, num_pages, full, swa, full_pages, swa_pages) -> None:
        if self.hybrid:
            self.full_to_swa[full] = swa
            self.full_to_swa[0] = 0  # (the device's padding writes 0 there)
        if self.full is not None:
            self.full.pop(num_pages, full_pages)
        if self.swa is not None:
            self.swa.pop(num_pages, swa_pages if self.hybrid else full_pages)

    # -- release -----------------------------------------------------------------------------

    def _pages(self, full_slots) -> np.ndarray:
        slots = np.asarray(full_slots, np.int64)
        return np.where(slots > 0, slots // self.page_size, 0)

    def free_swa(self, full_slots) -> None:
        """Free the SWA pages paired with the full pages of `full_slots` (idempotent)."""
        if self.mode is PoolMode.SINGLE:
            return
        pages = self._pages(full_slots)
        if self.mode is PoolMode.ALL_SWA:
            self.swa.push(pages)
            return
        ps = self.page_size
        expanded = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
        swa = self.full_to_swa[expanded]
        self.swa.push(np.where(swa > 0, swa // ps, 0))
        self.full_to_swa[expanded] = 0

    def free(self, full_slots) -> None:
        """Free the full pages of `full_slots` and, through the map, their SWA pages."""
        self.free_swa(full_slots)
        if self.mode is not PoolMode.ALL_SWA:
            self.full.push(self._pages(full_slots))

    def release(self, swa_slots, full_slots) -> None:
        """`free_swa(swa_slots)` then `free(full_slots)`, as one device release."""
        self.free_swa(swa_slots)
        self.free(full_slots)

    def move_swa(self, dst_slots, src_slots) -> None:
        """Hand the SWA slots of `src_slots` to `dst_slots`."""
        if not self.hybrid:
            return
        dst, src = np.asarray(dst_slots, np.int64), np.asarray(src_slots, np.int64)
        moved = self.full_to_swa[src]
        self.full_to_swa[src] = 0
        self.full_to_swa[dst] = moved
        self.full_to_swa[0] = 0

    # -- a host tier's loads (memory/host_copy.load_pages without the KV) --------------------

    def claim(self, pages) -> None:
        """Take the full pages `pages` (the host chose them) off the free stack."""
        self.full.claim(np.asarray(pages, np.int64))

    def pair(self, pages) -> None:
        """Give each full page in `pages` a fresh SWA page, top of the stack first."""
        pages = np.asarray(pages, np.int64)
        pages = pages[pages > 0]
        if not len(pages) or not self.hybrid:
            return
        ps = self.page_size
        swa_pages = self.swa.peek(np.arange(len(pages)))
        offsets = np.arange(ps)
        self.full_to_swa[(pages[:, None] * ps + offsets).reshape(-1)] = (
            swa_pages[:, None] * ps + offsets
        ).reshape(-1)
        self.swa.pop(len(pages), swa_pages)
