"""Paged attention cases as plain arrays (numpy only), and their float64 expected outputs.

A case is one layer of one batch: requests with `prefix_lens` tokens cached and queries for
positions [prefix_lens[r], seq_lens[r]); their K/V sit in the pool pages `page_table[r, j]`
(logical page j holds positions [j * ps, (j + 1) * ps)). Pages are drawn in a shuffled order;
page 0 is the dummy. For a local layer the pages wholly before every query's window are freed
(page table entry 0), as runtime eviction leaves them. Every row that holds no live token (the
dummy page, unused pages, the tail of a last page, freed pages) is NaN, so a backend that reads
what it must not read turns the output NaN.
"""

from __future__ import annotations

import numpy as np

from swajax.arith import ceil_div
from swajax.conformance.oracle import reference_attention

# name, kind, window, page size, prefix lens, seq lens, sinks, soft cap, heads (q, kv), dims (k, v)
CASES = (
    ("full_decode", "full", 0, 4, (13, 30, 7), (14, 31, 8), False, None, (4, 2), (16, 16)),
    ("full_extend", "full", 0, 4, (0, 9), (11, 17), False, None, (4, 2), (16, 16)),
    ("sliding_decode", "sliding", 7, 4, (40, 9, 23), (41, 10, 24), False, None, (4, 2), (16, 16)),
    ("sliding_extend", "sliding", 7, 4, (0, 21), (19, 37), False, None, (4, 2), (16, 16)),
    ("sliding_sinks", "sliding", 5, 2, (31, 0), (32, 12), True, None, (4, 1), (16, 16)),
    ("sliding_page1", "sliding", 6, 1, (17, 3), (18, 9), True, None, (2, 2), (8, 8)),
    ("sliding_softcap", "sliding", 7, 4, (26,), (33,), False, 20.0, (4, 2), (16, 16)),
    ("chunked_extend", "chunked", 8, 4, (5, 12), (21, 17), False, None, (4, 2), (16, 16)),
    ("mla_dims", "sliding", 9, 4, (30,), (36,), True, None, (8, 2), (24, 16)),
)


def _first_live(kind: str, window: int, prefix: int) -> int:
    """First position any query of the batch can read (everything before may be freed)."""
    if kind == "sliding":
        return max(prefix - window, 0)
    if kind == "chunked":
        return prefix // window * window
    return 0


def make_case(spec, seed: int) -> dict[str, np.ndarray]:
    name, kind, window, ps, prefix, seq, sinks, cap, (hq, hkv), (dk, dv) = spec
    rng = np.random.default_rng(seed)
    prefix, seq = np.asarray(prefix, np.int32), np.asarray(seq, np.int32)
    pages_per = [ceil_div(int(s), ps) for s in seq]
    width = max(pages_per)
    order = rng.permutation(np.arange(1, sum(pages_per) + 1, dtype=np.int32))
    table = np.zeros((len(seq), width), np.int32)
    k_pages = np.full((sum(pages_per) + 2, ps, hkv, dk), np.nan)
    v_pages = np.full((sum(pages_per) + 2, ps, hkv, dv), np.nan)
    taken = 0
    for r, n in enumerate(pages_per):
        table[r, :n] = order[taken : taken + n]
        taken += n
        live = _first_live(kind, window, int(prefix[r])) // ps  # pages before are freed
        for p in range(int(seq[r])):
            page = table[r, p // ps]
            if p // ps >= live:
                k_pages[page, p % ps] = rng.normal(size=(hkv, dk))
                v_pages[page, p % ps] = rng.normal(size=(hkv, dv))
        table[r, :live] = 0
    q = rng.normal(size=(int(np.sum(seq - prefix)), hq, dk))
    case = dict(
        q=q.astype(np.float32),
        k_pages=k_pages.astype(np.float32),
        v_pages=v_pages.astype(np.float32),
        page_table=table,
        prefix_lens=prefix,
        seq_lens=seq,
        kind=np.array(kind),
        window=np.int32(window),
        scale=np.float64(dk**-0.5),
    )
    if sinks:
        case["sinks"] = rng.normal(size=hq).astype(np.float32)
    if cap is not None:
        case["soft_cap"] = np.float64(cap)
    case["expected"] = expected_output(case)
    return case


def expected_output(case: dict) -> np.ndarray:
    """The oracle's float64 output; freed pages are never visible, so their rows never count."""
    prefix, seq = case["prefix_lens"], case["seq_lens"]
    query_req = np.concatenate([np.full(s - p, r) for r, (p, s) in enumerate(zip(prefix, seq))])
    query_pos = np.concatenate([np.arange(p, s) for p, s in zip(prefix, seq)])
    return reference_attention(
        case["q"],
        case["k_pages"],
        case["v_pages"],
        case["page_table"],
        seq,
        query_req,
        query_pos,
        kind=str(case["kind"]),
        window=int(case["window"]),
        scale=float(case["scale"]),
        sinks=case.get("sinks"),
        soft_cap=float(case["soft_cap"]) if "soft_cap" in case else None,
    )
