"""Index-blind comparison: a bijection between the pages a trace recorded and the pages another
backend hands out, so a backend with another free-list order can be checked op by op.

Pages pair when they are allocated: the slot that starts a page (offset 0 within it) pairs the
recorded page with the backend's, replacing whatever either page paired with before (an
allocator only hands out free pages, so an old pairing has ended). Every other slot must agree
with the current pairing at the same in-page offset. Slots the trace passes *in* (frees,
inserts, `last_loc`) are translated to the backend's numbering; slots that come *out* (matches,
cached prefixes) are compared through the pairing. Slot -1 and 0 (none, and the dummy) map to
themselves.
"""

from __future__ import annotations

SLOT_INPUTS = {
    "alloc_extend": ("last_loc",),
    "alloc_decode": ("last_loc",),
    "free": ("slots",),
    "free_swa": ("slots",),
    "insert": ("slots",),
    "cache_finished": ("slots",),
    "cache_unfinished": ("slots",),
}
SLOT_OUTPUTS = ("slots", "prefix")


class Divergence(Exception):
    """The backend's slots cannot be a renaming of the recorded ones."""


class PageMap:
    def __init__(self, page_size: int):
        self.ps = page_size
        self.fwd: dict[int, int] = {}  # recorded page -> backend page
        self.back: dict[int, int] = {}
        # A recorded page whose backend page went to another recorded page since: slots on it
        # that a trace still passes in (an all-SWA request's evicted positions, which the
        # backend skips) translate as they were.
        self.stale: dict[int, int] = {}

    def _check_offsets(self, recorded: int, actual: int) -> None:
        if recorded % self.ps != actual % self.ps:
            raise Divergence(
                f"slot {actual} sits at offset {actual % self.ps} of its page, the recorded "
                f"slot {recorded} at offset {recorded % self.ps}"
            )

    def pair(self, recorded, actual) -> None:
        """Slots of one allocation, recorded vs the backend's."""
        recorded, actual = list(recorded), list(actual)
        if len(recorded) != len(actual):
            raise Divergence(f"{len(actual)} slots allocated, {len(recorded)} recorded")
        for r, a in zip(recorded, actual):
            self._check_offsets(r, a)
            rp, ap = r // self.ps, a // self.ps
            if r % self.ps == 0:  # a fresh page on both sides: (re)pair
                self.back.pop(self.fwd.pop(rp, None), None)
                displaced = self.back.pop(ap, None)
                if displaced is not None:
                    self.stale[displaced] = self.fwd.pop(displaced)
                self.fwd[rp], self.back[ap] = ap, rp
                self.stale.pop(rp, None)
            elif self.fwd.get(rp) != ap:
                raise Divergence(
                    f"slot {a} continues page {ap}, the recorded slot {r} page "
                    f"{rp}, which pairs with {self.fwd.get(rp)}"
                )

    def to_backend(self, slots) -> list[int]:
        out = []
        for s in slots:
            if s <= 0:
                out.append(s)
                continue
            page = self.fwd.get(s // self.ps, self.stale.get(s // self.ps))
            if page is None:
                raise Divergence(f"recorded slot {s} lies on a page the backend never allocated")
            out.append(page * self.ps + s % self.ps)
        return out

    def same(self, recorded, actual) -> bool:
        """Whether the backend's output slots are the recorded ones, renamed."""
        try:
            return self.to_backend(recorded) == list(actual)
        except Divergence:
            return False
