"""Ragged paged extend / prefill attention: blocks of queries of one request over a paged pool.

The batch is cut into query blocks (`block_q` consecutive queries of one request; see
`swajax.attention.metadata`). Each block reads only the pages that intersect
[window start of its first query, its last query], so a sliding layer reads about
`window + block_q` keys per block, whatever the cached prefix. Front ends as in `paged_decode`:
GPU (grid (blocks,), page table as an input, pages gathered in the kernel) and TPU (grid
(blocks, pages), scalar-prefetched tables driving the K/V index maps).

Layout: q [NB, Hkv, block_q * G, Dk] with row = query * G + group; pools
[pages, page_size, Hkv, D]; per request page_table [R, NP] (logical page first_page[r] + j);
per block block_req, block_pos (first query position) and block_len (real queries; 0 =
padding block). The keys a query sees end at its own position (causal), so no sequence
length is needed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from swajax.kernels import common

# ---------------------------------------------------------------------------------------------
# Reference: the spec every front end is checked against


def ragged_extend_reference(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    block_req,
    block_pos,
    block_len,
    sinks=None,
    *,
    g: int,
    kind: str,
    window: int = 0,
    scale: float,
    soft_cap: float | None = None,
    **_,
):
    """Same signature and result as `ragged_extend`: gather every table page, mask, softmax."""
    static_validate(
        q,
        k_pages,
        v_pages,
        page_table,
        first_page,
        block_req,
        block_pos,
        block_len,
        sinks,
        g,
        kind,
        window,
    )
    nb, hkv, rows, _ = q.shape
    ps, np_ = k_pages.shape[1], page_table.shape[1]

    def one(qb, req, pos0, n):
        pt = page_table[req]
        k, v = k_pages[pt].reshape(np_ * ps, hkv, -1), v_pages[pt].reshape(np_ * ps, hkv, -1)
        k_pos = first_page[req] * ps + jnp.arange(np_ * ps)
        mask = _mask(k_pos, pos0, n, rows, g, kind, window)
        heads = []
        for h in range(hkv):
            sink = None if sinks is None else jnp.tile(sinks[h], rows // g)
            heads.append(
                common.dense_reference(
                    qb[h], k[:, h], v[:, h], mask, scale=scale, sink=sink, soft_cap=soft_cap
                )
            )
        return jnp.stack(heads)

    return jax.vmap(one)(q, block_req, block_pos, block_len).astype(q.dtype)


def _block_window(req, pos0, n, fp_ref, ps, num_cols, kind, window):
    """First visible key of the block and its table columns [first, last]."""
    lo = common.window_lo(pos0, kind, window)
    first = jnp.maximum(lo // ps - fp_ref[req], 0)
    last = jnp.minimum((pos0 + n - 1) // ps - fp_ref[req], num_cols - 1)
    return first, jnp.where(n > 0, last, first - 1)  # a padding block reads nothing


def _mask(k_pos, pos0, n, rows, g, kind, window):
    """bool[rows, ps]: row r is query pos0 + r // g (real if r // g < n)."""
    q_pos = pos0 + jax.lax.iota(jnp.int32, rows) // g
    real = jax.lax.iota(jnp.int32, rows) // g < n
    return common.visible(q_pos[:, None], k_pos[None, :], kind, window) & real[:, None]


def _init(sinks_ref, hkv, rows, dv):
    return tuple(
        common.softmax_init(rows, dv, None if sinks_ref is None else sinks_ref[h])
        for h in range(hkv)
    )


def _finish(o_ref, carry):
    for h, (_, l, acc) in enumerate(carry):
        o_ref[h] = common.softmax_finish(l, acc).astype(o_ref.dtype)


# ---------------------------------------------------------------------------------------------
# GPU front end


def ragged_extend_kernel_gpu(
    # inputs
    q_ref,  # [Hkv, rows, Dk] one query block
    k_ref,  # [pages, ps, Hkv, Dk] whole pool (ANY)
    v_ref,  # [pages, ps, Hkv, Dv] whole pool (ANY)
    pt_ref,  # [R, NP] page tables (ANY)
    fp_ref,  # [R] first logical page of each row (ANY)
    req_ref,  # [NB] request of each block (ANY)
    pos_ref,  # [NB] position of each block's first query (ANY)
    len_ref,  # [NB] real queries per block (ANY)
    *rest,  # optional sinks_ref [Hkv, rows, 1]; o_ref [Hkv, rows, Dv]
    g: int,
    kind: str,
    window: int,
    scale: float,
    soft_cap: float | None,
):
    sinks_ref, o_ref = rest if len(rest) == 2 else (None, rest[0])
    i = pl.program_id(0)
    ps, hkv, rows = k_ref.shape[1], k_ref.shape[2], q_ref.shape[1]
    req, pos0, n = req_ref[i], pos_ref[i], len_ref[i]
    first, last = _block_window(req, pos0, n, fp_ref, ps, pt_ref.shape[1], kind, window)
    qs = [q_ref[h] for h in range(hkv)]

    def body(col, carry):
        page = pt_ref[req, col]
        k = [k_ref[page, :, h, :] for h in range(hkv)]
        v = [v_ref[page, :, h, :] for h in range(hkv)]
        k_pos = (fp_ref[req] + col) * ps + jax.lax.iota(jnp.int32, ps)
        mask = _mask(k_pos, pos0, n, rows, g, kind, window)
        return common.fold_heads(carry, qs, k, v, mask, scale=scale, soft_cap=soft_cap)

    init = _init(sinks_ref, hkv, rows, o_ref.shape[2])
    _finish(o_ref, jax.lax.fori_loop(first, last + 1, body, init))


# ---------------------------------------------------------------------------------------------
# TPU front end


def ragged_extend_kernel_tpu(
    # scalar prefetch
    pt_ref,  # [R * NP] flattened page tables (SMEM)
    fp_ref,  # [R] (SMEM)
    req_ref,  # [NB] (SMEM)
    pos_ref,  # [NB] (SMEM)
    len_ref,  # [NB] (SMEM)
    # inputs
    q_ref,  # [Hkv, rows, Dk]
    k_ref,  # [ps, Hkv * Dk] the page chosen by the index map, heads side by side
    v_ref,  # [ps, Hkv * Dv]
    *rest,  # optional sinks_ref [Hkv, rows, 1]; o_ref [Hkv, rows, Dv]; scratch m, l [Hkv, rows, 1]
    g: int,
    kind: str,
    window: int,
    scale: float,
    soft_cap: float | None,
):
    *inputs, o_ref, m_ref, l_ref, acc_ref = rest
    sinks_ref = inputs[0] if inputs else None
    i, j = pl.program_id(0), pl.program_id(1)
    ps, hkv, rows = k_ref.shape[0], q_ref.shape[0], q_ref.shape[1]
    req, pos0, n = req_ref[i], pos_ref[i], len_ref[i]
    num_cols = pt_ref.shape[0] // fp_ref.shape[0]
    first, last = _block_window(req, pos0, n, fp_ref, ps, num_cols, kind, window)

    @pl.when(j == 0)
    def _():
        for h, (m, l, acc) in enumerate(_init(sinks_ref, hkv, rows, acc_ref.shape[2])):
            m_ref[h], l_ref[h], acc_ref[h] = m, l, acc

    @pl.when(first + j <= last)  # steps past the block's pages read nothing new and are skipped
    def _():
        carry = tuple((m_ref[h], l_ref[h], acc_ref[h]) for h in range(hkv))
        k = [common.head_slice(k_ref, h, q_ref.shape[2]) for h in range(hkv)]
        v = [common.head_slice(v_ref, h, acc_ref.shape[2]) for h in range(hkv)]
        qs = [q_ref[h] for h in range(hkv)]
        # 2-D positions only: Mosaic lays out no boolean reshape or broadcast of a 1-D mask.
        base = (fp_ref[req] + first + j) * ps
        q_pos = common.positions(pos0, (rows, ps), 0, every=g)
        mask = common.visible(q_pos, common.positions(base, (rows, ps), 1), kind, window)
        mask = mask & (q_pos < pos0 + n)
        key = common.positions(base, (ps, 1), 0)
        live = (key >= common.window_lo(pos0, kind, window)) & (key < pos0 + n)
        carry = common.fold_heads(carry, qs, k, v, mask, live, scale=scale, soft_cap=soft_cap)
        for h, (m, l, acc) in enumerate(carry):
            m_ref[h], l_ref[h], acc_ref[h] = m, l, acc

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        _finish(o_ref, tuple((m_ref[h], l_ref[h], acc_ref[h]) for h in range(hkv)))


# ---------------------------------------------------------------------------------------------
# Public function


def static_validate(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    block_req,
    block_pos,
    block_len,
    sinks,
    g,
    kind,
    window,
):
    nb, hkv, rows, dk = q.shape
    if rows % g:
        raise ValueError(f"q rows {rows} must be block_q * G with G = {g}")
    if k_pages.ndim != 4 or k_pages.shape[2:] != (hkv, dk):
        raise ValueError(
            f"k_pages must be [pages, ps, {hkv}, {dk}] for q {q.shape}, got {k_pages.shape}"
        )
    if v_pages.shape[:3] != k_pages.shape[:3]:
        raise ValueError(
            f"v_pages {v_pages.shape} must match k_pages {k_pages.shape} but the last dim"
        )
    r = page_table.shape[0]
    if page_table.ndim != 2 or first_page.shape != (r,):
        raise ValueError(
            f"page_table {page_table.shape} and first_page {first_page.shape} "
            "must agree on the request count"
        )
    if block_req.shape != (nb,) or block_pos.shape != (nb,) or block_len.shape != (nb,):
        raise ValueError(f"block_req / block_pos / block_len must be ({nb},)")
    if sinks is not None and sinks.shape != (hkv, g):
        raise ValueError(f"sinks must be [{hkv}, {g}], got {sinks.shape}")
    if kind not in common.KINDS:
        raise ValueError(f"kind must be one of {common.KINDS}, got {kind!r}")
    if kind != "full" and window < 1:
        raise ValueError(f"a {kind} window must be >= 1, got {window}")


def dynamic_validate(
    k_pages, page_table, first_page, block_req, block_pos, block_len, block_q: int
) -> None:
    """The checks on values `static_validate` cannot make (they need concrete arrays, so call
    it outside jit, on the host): every table entry a pool page, every block's request a table
    row, no negative position, at most `block_q` real queries per block, and each block's keys
    inside its request's table."""
    import numpy as np

    pt, fp, req, pos, n = (
        np.asarray(a) for a in (page_table, first_page, block_req, block_pos, block_len)
    )
    pages, ps, (reqs, cols) = k_pages.shape[0], k_pages.shape[1], pt.shape
    common.check_values(
        [
            ("page_table", pt, (pt >= 0) & (pt < pages), f"a pool page in [0, {pages})"),
            ("first_page", fp, fp >= 0, ">= 0"),
            ("block_req", req, (req >= 0) & (req < reqs), f"a table row in [0, {reqs})"),
            ("block_pos", pos, pos >= 0, ">= 0"),
            ("block_len", n, (n >= 0) & (n <= block_q), f"in [0, {block_q}]"),
        ]
    )
    last = (pos + np.maximum(n, 1) - 1) // ps - fp[np.clip(req, 0, reqs - 1)]
    common.check_values(
        [
            (
                "block_pos",
                pos,
                (n == 0) | (last < cols),
                f"within its request's table: last key's column < {cols}",
            ),
        ]
    )


def block_pages(kind: str, window: int, page_size: int, block_q: int, table_width: int) -> int:
    """Most pages one query block touches (the TPU grid's second axis)."""
    back = common.lookback(kind, window)
    if back is None:
        return table_width
    return min(-(-(back + block_q - 1) // page_size) + 1, table_width)


@functools.partial(
    jax.jit,
    static_argnames=(
        "g",
        "kind",
        "window",
        "scale",
        "soft_cap",
        "backend",
        "interpret",
        "block_sizes",
    ),
)
def ragged_extend(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    block_req,
    block_pos,
    block_len,
    sinks=None,
    *,
    g: int,
    kind: str,
    window: int = 0,
    scale: float,
    soft_cap: float | None = None,
    backend: str = "gpu",
    interpret: bool = False,
    block_sizes: common.BlockSizes = common.DEFAULT_BLOCK_SIZES,
):
    """Attention of query blocks over their requests' cached and new keys.

    Args:
      q: [NB, Hkv, block_q * G, Dk]; row = query * G + group, query i at block_pos + i.
      k_pages / v_pages: [pages, page_size, Hkv, Dk / Dv] one layer's pool.
      page_table: i32[R, NP] per request; first_page: i32[R] (logical page of column 0).
      block_req, block_pos, block_len: i32[NB] request, first position and real queries.
      sinks: optional f32[Hkv, G] per-head sink logits.
      g: query heads per KV head.
    Returns:
      [NB, Hkv, block_q * G, Dv] in q's dtype (rows of padding queries are 0).
    """
    static_validate(
        q,
        k_pages,
        v_pages,
        page_table,
        first_page,
        block_req,
        block_pos,
        block_len,
        sinks,
        g,
        kind,
        window,
    )
    rows, ps, np_ = q.shape[2], k_pages.shape[1], page_table.shape[1]
    params = dict(g=g, kind=kind, window=window, scale=scale, soft_cap=soft_cap)

    def page_map(i, j, pt, fp, req, pos, n):
        first, last = _block_window(req[i], pos[i], n[i], fp, ps, np_, kind, window)
        col = jnp.clip(first + j, 0, jnp.maximum(last, 0))
        return (pt[req[i] * np_ + col], 0, 0)

    kernels = tuple(
        functools.partial(k, **params) for k in (ragged_extend_kernel_gpu, ragged_extend_kernel_tpu)
    )
    tables = (page_table, first_page, block_req, block_pos, block_len)
    return common.paged_call(
        kernels,
        q,
        k_pages,
        v_pages,
        tables,
        sinks,
        name="swajax_ragged_extend",
        steps=block_pages(kind, window, ps, rows // g, np_),
        page_map=page_map,
        backend=backend,
        interpret=interpret,
        block_sizes=block_sizes,
    )
