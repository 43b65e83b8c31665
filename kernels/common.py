"""Math shared by every attention kernel and front end: pure jnp on values, no refs.

The window convention (one definition, also used by the XLA path): a query at position q sees
key position k iff k <= q and
  "full":     always
  "sliding":  k >= q - window            (window + 1 keys)
  "chunked":  k >= floor(q / window) * window

Online softmax over key tiles, per KV head, with optional per-head sinks: a sink is a logit with
no value that only adds exp(sink) to the denominator. It starts the running max and sum, so
`m = sink, l = 1` before the first tile.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KINDS = ("full", "sliding", "chunked")
MASK_VALUE = -1e30  # finite: a fully masked tile leaves no NaN behind


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
    """Tuning knobs of the kernels (never literals in a kernel body)."""

    block_q: int = 16  # queries per program of the ragged extend kernel (set by the metadata)
    num_warps: int = 4  # Triton
    num_stages: int = 2  # Triton


DEFAULT_BLOCK_SIZES = BlockSizes()


def compiler_params(backend: str, interpret, block_sizes: BlockSizes = DEFAULT_BLOCK_SIZES):
    """Backend compiler parameters, chosen in one place (none in interpret mode). Triton params
    are what select the Triton lowering on GPU; TPU grids are (parallel, arbitrary)."""
    if interpret:
        return None
    if backend == "gpu":
        from jax.experimental.pallas import triton as plt

        return plt.CompilerParams(
            num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages
        )
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


def window_lo(q_pos, kind: str, window: int):
    """First visible key position for query position `q_pos` (clamped at 0)."""
    if kind == "sliding":
        lo = q_pos - window
    elif kind == "chunked":
        lo = q_pos // window * window
    else:
        lo = q_pos * 0
    return jnp.maximum(lo, 0)


def visible(q_pos, k_pos, kind: str, window: int):
    """bool: the query at q_pos sees the key at k_pos (broadcasting)."""
    return (k_pos <= q_pos) & (k_pos >= window_lo(q_pos, kind, window))


def head_slice(ref, h: int, dim: int):
    """Head `h` of a TPU page block [ps, Hkv * dim]: its lanes, [ps, dim]."""
    return ref[:, h * dim : (h + 1) * dim]


def positions(base, shape: tuple[int, int], axis: int, every: int = 1):
    """int32[shape]: `base` plus the index along `axis` (divided by `every`), built 2-D: the TPU
    kernels' masks come from these, never from a 1-D vector reshaped."""
    index = jax.lax.broadcasted_iota(jnp.int32, shape, axis)
    return base + (index if every == 1 else index // every)


def lookback(kind: str, window: int) -> int | None:
    """Most tokens before a query that it can see (None: unbounded)."""
    return {"sliding": window, "chunked": window - 1}.get(kind)


def softmax_init(num_rows: int, dv: int, sink=None):
    """Running (max, sum, accumulator) before the first key: m, l are f32[num_rows, 1] (2-D, a
    column per row: Mosaic lays out and reduces 2-D vectors; it refuses most 1-D reshapes);
    `sink`: f32[num_rows] or [num_rows, 1], or None."""
    if sink is None:
        m = jnp.full((num_rows, 1), MASK_VALUE, jnp.float32)
        l = jnp.zeros((num_rows, 1), jnp.float32)
    else:
        m, l = sink.astype(jnp.float32).reshape(num_rows, 1), jnp.ones((num_rows, 1), jnp.float32)
    return m, l, jnp.zeros((num_rows, dv), jnp.float32)


def softmax_step(m, l, acc, q, k, v, mask, v_live=None, *, scale: float, soft_cap: float | None):
    """Fold one tile of keys into the running softmax of one KV head.

    q: [Q, Dk]; k: [S, Dk]; v: [S, Dv]; mask: bool[Q, S]; m, l: [Q, 1]; acc: [Q, Dv].
    v_live: bool broadcasting to [S, Dv], True for the keys some query of the tile sees (the
    rest may be garbage: freed slots, the dummy page, and 0 * NaN = NaN). None: derived from
    `mask` (a reduction over queries and a boolean reshape, which Mosaic refuses: the TPU
    kernels pass it, built from the tile's key range).
    """
    dims = (((1,), (1,)), ((), ()))
    s = (
        jax.lax.dot_general(
            q.astype(jnp.float32), k.astype(jnp.float32), dims, preferred_element_type=jnp.float32
        )
        * scale
    )
    if soft_cap is not None:
        s = jnp.tanh(s / soft_cap) * soft_cap
    s = jnp.where(mask, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    if v_live is None:
        v_live = (jnp.max(mask.astype(jnp.float32), axis=0) > 0)[:, None]  # no reduce_or: Triton
    v = jnp.where(v_live, v.astype(jnp.float32), 0.0)
    pv = jnp.dot(p, v, preferred_element_type=jnp.float32)
    return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv


def fold_heads(carry, qs, ks, vs, mask, v_live=None, *, scale: float, soft_cap: float | None):
    """`softmax_step` for every KV head: carry, qs, ks, vs are per-head tuples / lists."""
    return tuple(
        softmax_step(m, l, acc, q, k, v, mask, v_live, scale=scale, soft_cap=soft_cap)
        for (m, l, acc), q, k, v in zip(carry, qs, ks, vs, strict=True)
    )


def softmax_finish(l, acc):
    """Normalized output; rows that saw nothing (and had no sink) are 0. l: [Q, 1]."""
    return acc / jnp.where(l > 0, l, 1.0)


def dense_reference(q, k, v, mask, *, scale, sink=None, soft_cap=None):
    """One-shot softmax attention of one KV head ([Q, Dk] x [S, Dk]), for kernel references."""
    m, l, acc = softmax_init(q.shape[0], v.shape[1], sink)
    m, l, acc = softmax_step(m, l, acc, q, k, v, mask, scale=scale, soft_cap=soft_cap)
    return softmax_finish(l, acc)


# ---------------------------------------------------------------------------------------------
# Front ends: one `pallas_call` builder per backend, shared by every kernel


def paged_cost(q, k_pages, v_pages, tables: tuple, steps: int) -> pl.CostEstimate:
    """What a paged kernel reads and computes, for XLA's model of the program around it: each of
    the N programs reads at most `steps` pages of K and V (the pages of its window, or of its
    whole table for a full layer: the grid's second axis, `window_pages` / `block_pages`), its
    rows of queries and outputs and the tables; every row scores and weighs every key of those
    pages, one exponential per score."""
    n, hkv, rows, dk = q.shape
    ps, dv = k_pages.shape[1], v_pages.shape[3]
    keys = n * steps * ps
    kv = keys * hkv * (dk * k_pages.dtype.itemsize + dv * v_pages.dtype.itemsize)
    io = q.size * q.dtype.itemsize + n * hkv * rows * dv * q.dtype.itemsize
    return pl.CostEstimate(
        flops=2 * hkv * rows * keys * (dk + dv),
        transcendentals=hkv * rows * keys,
        bytes_accessed=kv + io + sum(t.size * t.dtype.itemsize for t in tables),
    )


def paged_call(
    kernels,
    q,
    k_pages,
    v_pages,
    tables: tuple,
    sinks,
    *,
    name: str,
    steps: int,
    page_map,
    backend: str,
    interpret: bool,
    block_sizes: BlockSizes,
):
    """Run a paged attention kernel over programs of `q` [N, Hkv, R, Dk] -> [N, Hkv, R, Dv].

    `kernels`: (GPU kernel, TPU kernel), each with the kernel's own static parameters bound.
    `tables`: the int32 arrays that locate the keys (the page table first, flattened for the
    TPU's scalar prefetch). GPU: grid (N,), the pools and tables stay in memory (ANY) and the
    kernel gathers its pages. TPU: grid (N, steps), the tables are scalar-prefetched and
    `page_map(i, j, *tables)` names the pool page of step j, fetched by BlockSpec; three VMEM
    scratch buffers carry the running softmax across steps; a page reaches the kernel as
    [ps, Hkv * D] and each head is a slice of its lanes (`head_slice`)."""
    n, hkv, rows, dk = q.shape
    dv, ps = v_pages.shape[3], k_pages.shape[1]
    cost = paged_cost(q, k_pages, v_pages, tables, steps)
    out_shape = jax.ShapeDtypeStruct((n, hkv, rows, dv), q.dtype)
    # A sink per row, as a column (row = query * G + group): the kernels start their running
    # softmax from it without tiling or reshaping anything.
    extra = ()
    if sinks is not None:
        extra = (jnp.tile(sinks.astype(jnp.float32), (1, rows // sinks.shape[1]))[..., None],)
    sink_shape = (hkv, rows, 1)
    if backend == "gpu":
        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(
            kernels[0],
            grid=(n,),
            in_specs=[pl.BlockSpec((None, hkv, rows, dk), lambda i: (i, 0, 0, 0))]
            + [any_spec] * (2 + len(tables))
            + [pl.BlockSpec(sink_shape, lambda i: (0, 0, 0))] * len(extra),
            out_specs=pl.BlockSpec((None, hkv, rows, dv), lambda i: (i, 0, 0, 0)),
            out_shape=out_shape,
            interpret=interpret,
            compiler_params=compiler_params("gpu", interpret, block_sizes),
            cost_estimate=cost,
            name=f"{name}_gpu",
        )(q, k_pages, v_pages, *tables, *extra)
    if backend == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(tables),
            grid=(n, steps),
            in_specs=[
                pl.BlockSpec((None, hkv, rows, dk), lambda i, j, *_: (i, 0, 0, 0)),
                pl.BlockSpec((None, ps, hkv * dk), page_map),
                pl.BlockSpec((None, ps, hkv * dv), page_map),
            ]
            + [pl.BlockSpec(sink_shape, lambda i, j, *_: (0, 0, 0))] * len(extra),
            out_specs=pl.BlockSpec((None, hkv, rows, dv), lambda i, j, *_: (i, 0, 0, 0)),
            scratch_shapes=[
                pltpu.VMEM((hkv, rows, 1), jnp.float32),
                pltpu.VMEM((hkv, rows, 1), jnp.float32),
                pltpu.VMEM((hkv, rows, dv), jnp.float32),
            ],
        )
        flat = (tables[0].reshape(-1), *tables[1:])
        # A page's heads side by side in its rows ([ps, Hkv * D]): the layout the pools are
        # stored in (`memory.pool`), so XLA hands the kernel the pool as it lies in HBM, and
        # the tiles are full whatever the head count (Hkv on the sublanes would pad to 8-32).
        k_pages = k_pages.reshape(k_pages.shape[0], ps, hkv * dk)
        v_pages = v_pages.reshape(v_pages.shape[0], ps, hkv * dv)
        return pl.pallas_call(
            kernels[1],
            grid_spec=grid_spec,
            out_shape=out_shape,
            interpret=interpret,
            compiler_params=compiler_params("tpu", interpret),
            cost_estimate=cost,
            name=f"{name}_tpu",
        )(*flat, q, k_pages, v_pages, *extra)
    raise ValueError(f"backend must be 'gpu' or 'tpu', got {backend!r}")


def check_values(checks) -> None:
    """`dynamic_validate`'s helper: `checks` is (name, bool array that must hold, what it must
    be); the first failing one raises a ValueError naming the first bad index and value."""
    import numpy as np

    for name, values, ok, what in checks:
        ok = np.asarray(ok)
        if not ok.all():
            bad = tuple(int(i) for i in np.argwhere(~ok)[0])
            raise ValueError(f"{name}{list(bad)} = {np.asarray(values)[bad]} must be {what}")
