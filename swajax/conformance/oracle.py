"""A correctness oracle for other backends: dense reference attention over paged pools, and a
comparison that reports the worst element.

Another implementation (a CUDA kernel, a different framework) fills its own output for the same
paged inputs; `reference_attention` computes what it must be, in float64 with numpy, from the
window convention alone (its own `visible`, written out here so that the oracle shares no code
with the implementations it checks), and `compare` says how far apart they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Report:
    max_abs: float
    max_rel: float  # max |a - e| / max |e|
    worst_index: tuple[int, ...]
    actual: float
    expected: float
    ok: bool

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        return (
            f"{verdict}: max abs diff {self.max_abs:.3e}, max rel {self.max_rel:.3e} at "
            f"{self.worst_index} (actual {self.actual:.6g}, expected {self.expected:.6g})"
        )


def visible(q: int, k: int, kind: str, window: int) -> bool:
    """The window convention: W tokens before the query (W + 1 keys); chunked: same chunk."""
    if k > q:
        return False
    if kind == "sliding":
        return k >= q - window
    if kind == "chunked":
        return k // window == q // window
    return True


def reference_attention(
    q,
    k_pages,
    v_pages,
    page_table,
    seq_lens,
    query_req,
    query_pos,
    *,
    kind: str = "full",
    window: int = 0,
    scale: float,
    sinks=None,
    soft_cap: float | None = None,
) -> np.ndarray:
    """Attention of every query over its request's pages, dense, in float64.

    Args:
      q: [T, Hq, Dk]; k_pages / v_pages: [pages, page_size, Hkv, D].
      page_table: [R, NP] pool page of each logical page (position p is in page p // ps).
      seq_lens: [R] keys per request; query_req / query_pos: [T] request and position of each
        query.
      sinks: optional [Hq] logits that only add to the denominator.
    Returns:
      [T, Hq, Dv] float64.
    """
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    ps, hkv = k_pages.shape[1], k_pages.shape[2]
    out = np.zeros((q.shape[0], q.shape[1], v_pages.shape[3]))
    for t, (r, pos) in enumerate(zip(np.asarray(query_req), np.asarray(query_pos))):
        n = int(seq_lens[r])
        rows = [(int(page_table[r][p // ps]), p % ps) for p in range(n)]
        keys = np.array([k_pages[pg, off] for pg, off in rows])
        vals = np.array([v_pages[pg, off] for pg, off in rows])
        vis = np.array([visible(int(pos), p, kind, window) for p in range(n)])
        g = q.shape[1] // hkv
        for h in range(q.shape[1]):
            s = keys[vis, h // g] @ q[t, h] * scale
            if soft_cap is not None:
                s = np.tanh(s / soft_cap) * soft_cap
            logits = np.append(s, sinks[h]) if sinks is not None else s
            p = np.exp(logits - logits.max())
            out[t, h] = (p[: len(s)] / p.sum()) @ vals[vis, h // g]
    return out


def compare(actual, expected, *, rtol: float = 1e-5) -> Report:
    """Worst element of |actual - expected| and whether it is within rtol * max |expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: actual {actual.shape}, expected {expected.shape}")
    diff = np.abs(actual - expected)
    idx = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    max_abs = float(diff[idx]) if not np.isnan(diff[idx]) else float("inf")
    return Report(
        max_abs,
        max_abs / scale,
        tuple(int(i) for i in idx),
        float(actual[idx]),
        float(expected[idx]),
        max_abs <= rtol * scale,
    )
