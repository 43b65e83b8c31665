"""Paged attention test cases and a dense float64 oracle written from the mask definition.

A case allocates real slots with the allocator (free lists shuffled, so page tables are permuted),
writes random K/V for every position into the pools, fills every other row (unused pages, the
dummy page, freed SWA pages) with NaN, and builds the batch metadata.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from swajax.attention import as_pages, attention, build_metadata
from swajax.config import LayerKind, LayerSpec
from swajax.memory import allocator as A, req_to_token as R


@dataclasses.dataclass
class Case:
    meta: object
    q: np.ndarray  # [T, Hq, Dk]
    keys: list  # per request [seq, Hkv, Dk]
    values: list  # per request [seq, Hkv, Dv]
    pages: dict  # "full" / "swa" -> (k_pages, v_pages)
    prefix: np.ndarray
    seq: np.ndarray
    r2t: object = None
    alloc: object = None


def _shuffled(state, rng):
    def shuffle(stack):
        if stack is None:
            return None
        pages = np.asarray(stack.pages).copy()
        rng.shuffle(pages)
        return dataclasses.replace(stack, pages=jnp.asarray(pages))

    return dataclasses.replace(state, full=shuffle(state.full), swa=shuffle(state.swa))


def make_case(
    rng,
    *,
    ps,
    prefix,
    seq,
    hq=4,
    hkv=2,
    dk=16,
    dv=16,
    window=8,
    evict=True,
    mode="hybrid",
    dtype=jnp.float32,
    block_q=None,
):
    prefix, seq = np.asarray(prefix), np.asarray(seq)
    n = len(seq)
    pages_needed = int(sum(-(-s // ps) for s in seq))
    size = (pages_needed + 3) * ps
    alloc = _shuffled(A.init_allocator(size, size, ps, mode), rng)
    r2t = R.ReqToToken.init(n, int(seq.max()) + ps)
    rows = np.arange(n)
    alloc, res = A.alloc_extend(alloc, [0] * n, prefix, [-1] * n)
    r2t = R.write(r2t, rows, [0] * n, prefix, res.full_slots)
    alloc, res = A.alloc_extend(alloc, prefix, seq, np.asarray(R.last_loc(r2t, rows, prefix)))
    assert int(res.status) == A.OK
    r2t = R.write(r2t, rows, prefix, seq, res.full_slots)
    keys = [rng.normal(size=(s, hkv, dk)).astype(np.float32) for s in seq]
    values = [rng.normal(size=(s, hkv, dv)).astype(np.float32) for s in seq]
    if evict and window:  # free SWA pages wholly before every query's window, as eviction does
        table = np.asarray(r2t.table)
        for r in range(n):
            alloc = A.free_swa(alloc, table[r, : max(prefix[r] - window, 0) // ps * ps])
    table = np.asarray(r2t.table)
    full_rows = {"k": np.full((size + ps, hkv, dk), np.nan, np.float32)}
    full_rows["v"] = np.full((size + ps, hkv, dv), np.nan, np.float32)
    swa_rows = {name: arr.copy() for name, arr in full_rows.items()}
    for r in range(n):
        slots = table[r, : seq[r]]
        swa = np.asarray(A.translate(alloc, slots))
        live = swa > 0
        full_rows["k"][slots], full_rows["v"][slots] = keys[r], values[r]
        swa_rows["k"][swa[live]], swa_rows["v"][swa[live]] = keys[r][live], values[r][live]
    meta = build_metadata(r2t, alloc, rows, prefix, seq, window=window, block_q=block_q)
    t = meta.num_tokens
    q = rng.normal(size=(t, hq, dk)).astype(np.float32)
    pages = {
        kind: (as_pages(jnp.asarray(d["k"], dtype), ps), as_pages(jnp.asarray(d["v"], dtype), ps))
        for kind, d in (("full", full_rows), ("swa", swa_rows))
    }
    return Case(meta, jnp.asarray(q, dtype), keys, values, pages, prefix, seq, r2t, alloc)


def sees(q: int, k: int, layer: LayerSpec) -> bool:
    """The window convention, stated independently of swajax.attention.mask."""
    if k > q:
        return False
    if layer.kind is LayerKind.SLIDING:
        return k >= q - layer.window
    if layer.kind is LayerKind.CHUNKED:
        return k // layer.window == q // layer.window
    return True


def oracle(case: Case, layer: LayerSpec, *, scale, sinks=None, soft_cap=None):
    """Dense float64 attention per query, from the unpaged K/V. Returns (rows, expected)."""
    q = np.asarray(case.q, np.float64)
    hq = q.shape[1]
    rows, out, start = [], [], 0
    for r, (pre, seq) in enumerate(zip(case.prefix, case.seq)):
        k, v = case.keys[r].astype(np.float64), case.values[r].astype(np.float64)
        g = hq // k.shape[1]
        for i, pos in enumerate(range(pre, seq)):
            vis = np.array([sees(pos, j, layer) for j in range(seq)])
            res = np.zeros((hq, v.shape[2]))
            for h in range(hq):
                s = k[vis, h // g] @ q[start + i, h] * scale
                if soft_cap is not None:
                    s = np.tanh(s / soft_cap) * soft_cap
                logits = np.concatenate([s, [sinks[h]]]) if sinks is not None else s
                p = np.exp(logits - logits.max())
                res[h] = (p[: len(s)] / p.sum()) @ v[vis, h // g]
            rows.append(start + i)
            out.append(res)
        start += seq - pre
    return np.array(rows), np.array(out)


def check(case, layer, got, *, scale, sinks=None, soft_cap=None, tol=1e-5):
    rows, expected = oracle(case, layer, scale=scale, sinks=sinks, soft_cap=soft_cap)
    got = np.asarray(got, np.float64)[rows]
    err = np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30)
    assert np.isfinite(got).all(), "NaN or inf in the output"
    assert err <= tol, f"relative error {err:.3g} > {tol}"


def jitted(layer: LayerSpec, **options):
    """`attention` for one layer and options as one jitted program, as a model's step runs it:
    called eagerly, each of its operations (and each body of its maps) compiles on its own,
    which was most of the attention tests' time. Call it as fn(q, k_pages, v_pages, meta,
    sinks=...)."""
    return jax.jit(functools.partial(attention, layer=layer, **options))
