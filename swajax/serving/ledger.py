"""The host's mirror of the two pools: page occupancy, free counts and deferred releases.

Admission and eviction decisions need the pools' free counts every step; reading them from the
device would cost a round trip each time. The ledger keeps, in numpy, which primary-pool pages
are in use and which full pages are paired with an SWA page, so it knows exactly what each
release gives back (a page freed twice, or an SWA page already evicted, gives nothing, as on the
device). Releases are queued and travel with the next step's plan; after each step the device
returns its free counts and `check` compares them with the mirror, so any drift is caught at
once rather than trusted.

It is also what the prefix cache releases KV through (the `Releaser` protocol).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from swajax.observe import Observer, observed
from swajax.serving.batch import Releases, Transfer
from swajax.sizing import PoolMode, PoolSizes

# True while step programs are recorded as shapes (`runner.program_store.recording`): no
# program runs, so no device count comes back to compare.
_UNCHECKED = contextvars.ContextVar("unchecked", default=False)


@contextlib.contextmanager
def unchecked():
    """No ledger compares counts inside the block (see `_UNCHECKED`)."""
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


class LedgerMismatch(RuntimeError):
    """The device's free counts differ from the host mirror: a bookkeeping bug, never input."""


def _pages(slots, page_size: int) -> np.ndarray:
    pages = np.unique(np.asarray(slots, np.int64) // page_size)
    return pages[pages > 0]


class PoolLedger:
    observer: Observer | None = None  # swajax.observe: a recorder, if any

    def __init__(self, sizes: PoolSizes):
        self.mode, self.page_size = sizes.mode, sizes.page_size
        primary = sizes.swa_tokens if self.mode is PoolMode.ALL_SWA else sizes.full_tokens
        self.primary_pages = primary // self.page_size
        self.swa_pages = sizes.swa_tokens // self.page_size
        self.used = np.zeros(self.primary_pages + 1, bool)  # primary page p is allocated
        self.paired = np.zeros(self.primary_pages + 1, bool)  # hybrid: full page p has SWA
        self.free_primary = self.primary_pages
        self.free_swa_pages = self.swa_pages
        self._segments: list[dict[str, list[np.ndarray]]] = []
        # Pages the releases queued since the last take gave back (primary, SWA), and what the
        # last take's releases gave back, in tokens as `available` counts them: a step planned
        # while the previous one runs carries releases the device has not applied yet.
        self._freed_pages = [0, 0]
        self.taken = (0, 0)
        self._transfers: list[Transfer] = []  # host-tier copies, in order

    # ------------------------------------------------------------------------------------------
    # A snapshot (`swajax.api.state`): the mirror at rest, nothing queued

    def state(self) -> dict:
        if self.has_pending:
            raise RuntimeError("the ledger has queued releases: flush the engine first")
        return dict(used=self.used.copy(), paired=self.paired.copy())

    def load_state(self, state: dict) -> None:
        """Take a snapshot's page arrays; the free counts follow from them (and the device's
        counts are checked against them after the next step, as after every step)."""
        used, paired = np.asarray(state["used"], bool), np.asarray(state["paired"], bool)
        if used.shape != self.used.shape or paired.shape != self.paired.shape:
            raise ValueError(f"a ledger of {used.shape[0] - 1} pages into {self.primary_pages}")
        self.used[:], self.paired[:] = used, paired
        self.free_primary = self.primary_pages - int(used[1:].sum())
        if self.mode is PoolMode.HYBRID:
            self.free_swa_pages = self.swa_pages - int(paired[1:].sum())

    # ------------------------------------------------------------------------------------------
    # Reading

    def available(self) -> tuple[int, int]:
        """(full, SWA) free tokens; outside hybrid mode both are the one pool's count."""
        full = self.free_primary * self.page_size
        swa = self.free_swa_pages * self.page_size if self.mode is PoolMode.HYBRID else full
        return full, swa

    @property
    def has_pending(self) -> bool:
        return bool(self._segments or self._transfers)

    # ------------------------------------------------------------------------------------------
    # Releases (the Releaser protocol): counted now, applied on device with the next step

    def _queue(self, kind: str, slots) -> None:
        last = self._segments[-1] if self._segments else None
        if last is None or (kind != "moves" and last["moves"]) or last["sealed"]:
            self._segments.append({"swa": [], "full": [], "moves": [], "sealed": False})
        self._segments[-1][kind].append(slots)

    def _unpair(self, pages: np.ndarray) -> None:
        live = pages[self.paired[pages]]
        self.paired[live] = False
        self.free_swa_pages += len(live)
        self._freed_pages[1] += len(live)

    def _unuse(self, pages: np.ndarray) -> None:
        live = pages[self.used[pages]]
        self.used[live] = False
        self.free_primary += len(live)
        self._freed_pages[0] += len(live)

    @observed
    def free(self, slots) -> None:
        """Release full slots (their whole pages) and, through the mapping, their SWA pages."""
        if not len(slots):
            return
        slots = np.array(slots, np.int32)  # a copy: callers may reuse arrays
        pages = _pages(slots, self.page_size)
        if self.mode is PoolMode.HYBRID:
            self._unpair(pages)
        self._unuse(pages)
        self._queue("full", slots)

    @observed
    def free_swa(self, slots) -> None:
        """Release only the SWA pages paired with these full slots' pages."""
        if not len(slots) or self.mode is PoolMode.SINGLE:
            return
        slots = np.array(slots, np.int32)
        pages = _pages(slots, self.page_size)
        if self.mode is PoolMode.HYBRID:
            self._unpair(pages)
        else:  # all-SWA: the slots are the SWA pool's own
            self._unuse(pages)
        self._queue("swa", slots)

    def move_swa(self, dst, src) -> None:
        """Hand the SWA slots of `src` to `dst` (whole pages, equal in-page offsets)."""
        if self.mode is not PoolMode.HYBRID or not len(dst):
            return
        dst, src = np.array(dst, np.int32), np.array(src, np.int32)
        if dst.shape != src.shape or np.any(dst % self.page_size != src % self.page_size):
            raise ValueError("move_swa needs equally long slot lists with matching in-page offsets")
        self.paired[_pages(src, self.page_size)] = False
        self.paired[_pages(dst, self.page_size)] = True
        self._queue("moves", np.stack([dst, src]))

    # ------------------------------------------------------------------------------------------
    # Host-tier copies and the device pages their loads take (host_tier.py)

    def claim(self, tokens: int) -> np.ndarray:
        """Full slots of `tokens / page_size` free full pages (the lowest), marked in use now;
        a "full" load taking them is queued next, and the device takes the same pages."""
        ps = self.page_size
        pages = np.flatnonzero(~self.used[1:])[: tokens // ps] + 1
        if len(pages) * ps != tokens:
            raise ValueError(f"claim of {tokens} tokens: {self.free_primary} pages free")
        self.used[pages] = True
        self.free_primary -= len(pages)
        return (pages[:, None] * ps + np.arange(ps)).reshape(-1).astype(np.int32)

    def pair_swa(self, slots) -> None:
        """The full pages of `slots` (in use, unpaired) get SWA pages (an "swa" load follows)."""
        pages = _pages(slots, self.page_size)
        if self.paired[pages].any() or len(pages) > self.free_swa_pages:
            raise ValueError(f"cannot pair {len(pages)} pages ({self.free_swa_pages} SWA free)")
        self.paired[pages] = True
        self.free_swa_pages -= len(pages)

    def save(self, pool: str, slots, host_pages) -> None:
        self._transfer("save", pool, slots, host_pages)

    def load(self, pool: str, slots, host_pages) -> None:
        self._transfer("load", pool, slots, host_pages)

    def _transfer(self, kind: str, pool: str, slots, host_pages) -> None:
        """Queue a copy in order with the releases: those queued before it run first, those
        after it in a new segment."""
        if self._segments:
            self._segments[-1]["sealed"] = True
        slots, host_pages = np.array(slots, np.int32), np.array(host_pages, np.int32)
        self._transfers.append(Transfer(kind, pool, slots, host_pages, len(self._segments)))

    def take_transfers(self) -> tuple[Transfer, ...]:
        out, self._transfers = tuple(self._transfers), []
        return out

    def take_releases(self) -> tuple[Releases, ...]:
        """The queued releases, in order, as the device applies them; the queue empties."""
        out = []
        for seg in self._segments:
            cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int32)  # noqa: E731
            moves = np.concatenate(seg["moves"], axis=1) if seg["moves"] else np.zeros((2, 0))
            out.append(
                Releases(
                    swa=cat(seg["swa"]),
                    full=cat(seg["full"]),
                    move_dst=moves[0].astype(np.int32),
                    move_src=moves[1].astype(np.int32),
                )
            )
        self._segments = []
        full, swa = (n * self.page_size for n in self._freed_pages)
        self.taken = (full, swa if self.mode is PoolMode.HYBRID else full)
        self._freed_pages = [0, 0]
        return tuple(out)

    # ------------------------------------------------------------------------------------------
    # Allocation results

    @observed
    def allocated(self, slots) -> tuple[int, int]:
        """The device handed out `slots` (new pages, or the free tail of a held last page);
        returns the (full, SWA) tokens that took from the free pools (observed: a trace records
        the allocation where the step was launched and learns here what it took)."""
        before = self.available()
        pages = _pages(slots, self.page_size)
        fresh = pages[~self.used[pages]]
        self.used[fresh] = True
        self.free_primary -= len(fresh)
        if self.mode is PoolMode.HYBRID:
            fresh = pages[~self.paired[pages]]
            self.paired[fresh] = True
            self.free_swa_pages -= len(fresh)
        return tuple(a - b for a, b in zip(before, self.available()))

    def check(self, free_full: int, free_swa: int, in_flight=(0, 0)) -> None:
        """Compare the device's free counts after a step with the mirror, less what releases
        counted here but not applied there give back: those of a step launched since
        (`in_flight`, overlap scheduling) and those still queued (an abort between steps)."""
        if _UNCHECKED.get():
            return
        full, swa = (n * self.page_size for n in self._freed_pages)
        queued = (full, swa if self.mode is PoolMode.HYBRID else full)
        mine = tuple(a - b - c for a, b, c in zip(self.available(), in_flight, queued))
        if mine != (free_full, free_swa):
            raise LedgerMismatch(
                f"device pools have (full, SWA) = ({free_full}, {free_swa}) free tokens, "
                f"the host mirror says {mine}"
            )
