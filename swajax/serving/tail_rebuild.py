"""Exact SWA-tail rebuild (host code): resume a prefix hit the window rule cut, recomputing only
what the local layers need.

A match whose last W tokens hold a tombstone falls back to F, the last position with W live
tokens before it, although the tree holds the full KV of the whole matched path up to L. The
rebuild recomputes [s0, L) instead of [F, L): full layers take the tree's KV for those
positions (the step copies it into the request's fresh slots, `KVWriteLoc.full_src`), local
layers compute theirs, which is exact from `exact_from` on in every local layer (the cone:
each local layer below the top one narrows the exact region by its window or chunk; the
derivation is in BUILD_NOTES.md). s0 is chosen so that the last W positions before L are exact
in every local layer; they revive the tombstones there when the request inserts.

The rules that keep it exact and leak-free, applied by the scheduler (`Scheduler._settle`,
`_before_checkpoint`):
- the request locks the node at L (the full KV it copies from stays) and owns [s0, ...) as any
  extend; its row holds the tree's slots for [0, s0);
- no chunk checkpoint inserts before the request reaches L (the tree already holds those
  tokens); between chunks the request frees its own out-of-window SWA as it goes;
- before its first insert past L (`settle`), the request frees its SWA KV below `exact_from`,
  so the tree never receives inexact SWA KV as live.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swajax.arith import round_up
from swajax.config import HybridConfig


@dataclasses.dataclass(frozen=True)
class TailRebuild:
    start: int  # s0: the first recomputed position (page aligned)
    end: int  # L: where the full match ends (page aligned)
    source: np.ndarray  # i32[end - start]: the tree's full slots of [start, end)
    exact_from: int  # page aligned: SWA KV from here on is exact in every local layer
    saved: int  # tokens the fallback would have recomputed and this does not (s0 - F)

    def sources(self, lo: int, hi: int) -> np.ndarray:
        """The full-KV source slot of each position in [lo, hi); 0 (the dummy slot): compute."""
        out = np.zeros(hi - lo, np.int32)
        a, b = max(lo, self.start), min(hi, self.end)
        if b > a:
            out[a - lo : b - lo] = self.source[a - self.start : b - self.start]
        return out


def lower_reach(cfg: HybridConfig) -> int:
    """How far the exact region moves up below the top local layer: the windows (chunk sizes)
    of every local layer but the topmost, in depth order (KV-shared ones too: their queries
    narrow it as much)."""
    windows = [layer.window for layer in cfg.layers if layer.kind.is_local]
    return sum(windows[:-1])


def plan(match, *, reach: int, window: int, page_size: int) -> TailRebuild | None:
    """The rebuild of a match (`prefix_cache.MatchResult`), or None if it saves nothing.

    s0 = align_down(align_down(L - W) - reach): then exact_from = align_up(s0 + reach) is at
    most align_down(L - W), so the window kept at L is exact and, once the request has passed
    L, everything below exact_from is out of its window and can be freed at once."""
    ps, hit, end = page_size, len(match), match.full_length
    start = ((end - window) // ps * ps - reach) // ps * ps
    if end <= hit or start <= hit:
        return None
    slots = np.concatenate([match.slots, match.tail])
    exact = round_up(start + reach, ps)
    return TailRebuild(start, end, slots[start:end].copy(), exact, start - hit)


def cut(n: int, rebuild: TailRebuild, kv_len: int) -> int:
    """A rebuilding request's chunk ends at L at the latest: the checkpoint there revives the
    window before L while the request still holds its SWA KV (decode eviction would free it
    before a finishing insert), so later requests sharing the prefix hit at L."""
    return min(n, rebuild.end - kv_len) if kv_len < rebuild.end else n
