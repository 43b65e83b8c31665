"""Windowed paged decode attention: one query per sequence over a paged KV pool.

Two front ends share the math of `common.py`:
  * GPU (Triton style): grid (batch,); the page table is an ordinary input and each program
    gathers the pages of its window from the pool inside the kernel, looping only over pages
    that intersect [window start, query] (pages outside the window are never read).
  * TPU (Mosaic style): grid (batch, window pages); the page table is scalar-prefetched and
    drives the K/V BlockSpec index maps; a page index past the window repeats the last page
    (no new DMA) and its step is skipped.

Layout: pools [pages, page_size, Hkv, D] (page 0 is a dummy); q [B, Hkv, G, Dk];
page_table [B, NP] holds the pool page of logical page first_page[b] + j; seq_lens [B] counts
the keys including the query's own (the query sits at position seq_len - 1; 0 = padding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from swajax.kernels import common

F32 = jnp.float32

# ---------------------------------------------------------------------------------------------
# Reference: the spec every front end is checked against


def paged_decode_reference(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    seq_lens,
    sinks=None,
    *,
    kind: str,
    window: int = 0,
    scale: float,
    soft_cap: float | None = None,
    **_,
):
    """Same signature and result as `paged_decode`: gather every table page, mask, softmax."""
    static_validate(q, k_pages, v_pages, page_table, first_page, seq_lens, sinks, kind, window)
    b, hkv, g, _ = q.shape
    ps, np_ = k_pages.shape[1], page_table.shape[1]

    def one(qb, pt, fp, seq, sink):
        k, v = k_pages[pt].reshape(np_ * ps, hkv, -1), v_pages[pt].reshape(np_ * ps, hkv, -1)
        k_pos = fp * ps + jnp.arange(np_ * ps)
        mask = common.visible(seq - 1, k_pos, kind, window)[None, :]
        mask = jnp.broadcast_to(mask, (g, np_ * ps))
        heads = [
            common.dense_reference(
                qb[h],
                k[:, h],
                v[:, h],
                mask,
                scale=scale,
                sink=None if sink is None else sink[h],
                soft_cap=soft_cap,
            )
            for h in range(hkv)
        ]
        return jnp.stack(heads)

    sink_b = None if sinks is None else jnp.broadcast_to(sinks, (b, hkv, g))
    out = jax.vmap(one, in_axes=(0, 0, 0, 0, None if sinks is None else 0))(
        q, page_table, first_page, seq_lens, sink_b
    )
    return out.astype(q.dtype)


def _mask(k_pos, q_pos, lo, rows):
    """bool[rows, ps]: every row (query head) of the one query sees the same keys."""
    return jnp.broadcast_to(((k_pos >= lo) & (k_pos <= q_pos))[None, :], (rows, k_pos.shape[0]))


def _init(sinks_ref, hkv, g, dv):
    return tuple(
        common.softmax_init(g, dv, None if sinks_ref is None else sinks_ref[h]) for h in range(hkv)
    )


def _finish(o_ref, carry):
    for h, (_, l, acc) in enumerate(carry):
        o_ref[h] = common.softmax_finish(l, acc).astype(o_ref.dtype)


def _window(seq_ref, fp_ref, b, ps, num_cols, kind, window):
    """Query position, first visible key, and the table columns [first, last] to read."""
    q_pos = seq_ref[b] - 1
    lo = common.window_lo(q_pos, kind, window)
    first = jnp.maximum(lo // ps - fp_ref[b], 0)  # keys before the table are not in it
    return q_pos, lo, first, jnp.minimum(q_pos // ps - fp_ref[b], num_cols - 1)


# ---------------------------------------------------------------------------------------------
# GPU front end


def paged_decode_kernel_gpu(
    # inputs
    q_ref,  # [Hkv, G, Dk] this sequence's query
    k_ref,  # [pages, ps, Hkv, Dk] whole pool (ANY)
    v_ref,  # [pages, ps, Hkv, Dv] whole pool (ANY)
    pt_ref,  # [B, NP] page table (ANY)
    fp_ref,  # [B] first logical page of each table row (ANY)
    seq_ref,  # [B] sequence lengths (ANY)
    *rest,  # optional sinks_ref [Hkv, G, 1], then o_ref [Hkv, G, Dv]
    kind: str,
    window: int,
    scale: float,
    soft_cap: float | None,
):
    sinks_ref, o_ref = rest if len(rest) == 2 else (None, rest[0])
    b = pl.program_id(0)
    ps, hkv = k_ref.shape[1], k_ref.shape[2]
    q_pos, lo, first_col, last_col = _window(seq_ref, fp_ref, b, ps, pt_ref.shape[1], kind, window)

    qs = [q_ref[h] for h in range(hkv)]

    def body(col, carry):
        page = pt_ref[b, col]
        k = [k_ref[page, :, h, :] for h in range(hkv)]
        v = [v_ref[page, :, h, :] for h in range(hkv)]
        k_pos = (fp_ref[b] + col) * ps + jax.lax.iota(jnp.int32, ps)
        mask = _mask(k_pos, q_pos, lo, len(qs[0]))
        return common.fold_heads(carry, qs, k, v, mask, scale=scale, soft_cap=soft_cap)

    init = _init(sinks_ref, hkv, q_ref.shape[1], o_ref.shape[2])
    _finish(o_ref, jax.lax.fori_loop(first_col, last_col + 1, body, init))


# ---------------------------------------------------------------------------------------------
# TPU front end


def paged_decode_kernel_tpu(
    # scalar prefetch
    pt_ref,  # [B * NP] flattened page table (SMEM)
    fp_ref,  # [B] first logical page of each table row (SMEM)
    seq_ref,  # [B] sequence lengths (SMEM)
    # inputs
    q_ref,  # [Hkv, G, Dk]
    k_ref,  # [ps, Hkv * Dk] the page chosen by the index map, heads side by side
    v_ref,  # [ps, Hkv * Dv]
    *rest,  # optional sinks_ref [Hkv, G, 1]; o_ref [Hkv, G, Dv]; scratch m, l [Hkv, G, 1], acc
    kind: str,
    window: int,
    scale: float,
    soft_cap: float | None,
):
    *inputs, o_ref, m_ref, l_ref, acc_ref = rest
    sinks_ref = inputs[0] if inputs else None
    b, j = pl.program_id(0), pl.program_id(1)
    ps, hkv = k_ref.shape[0], q_ref.shape[0]
    num_cols = pt_ref.shape[0] // seq_ref.shape[0]
    q_pos, lo, first_col, last_col = _window(seq_ref, fp_ref, b, ps, num_cols, kind, window)

    @pl.when(j == 0)
    def _():
        for h, (m, l, acc) in enumerate(_init(sinks_ref, hkv, q_ref.shape[1], acc_ref.shape[2])):
            m_ref[h], l_ref[h], acc_ref[h] = m, l, acc

    @pl.when(first_col + j <= last_col)  # steps past the window read nothing new and are skipped
    def _():
        carry = tuple((m_ref[h], l_ref[h], acc_ref[h]) for h in range(hkv))
        k = [common.head_slice(k_ref, h, q_ref.shape[2]) for h in range(hkv)]
        v = [common.head_slice(v_ref, h, acc_ref.shape[2]) for h in range(hkv)]
        qs = [q_ref[h] for h in range(hkv)]
        # 2-D positions only: Mosaic lays out no boolean reshape or broadcast of a 1-D mask.
        base = (fp_ref[b] + first_col + j) * ps
        k_pos = common.positions(base, (len(qs[0]), ps), 1)
        mask = (k_pos >= lo) & (k_pos <= q_pos)
        key = common.positions(base, (ps, 1), 0)
        live = (key >= lo) & (key <= q_pos)
        carry = common.fold_heads(carry, qs, k, v, mask, live, scale=scale, soft_cap=soft_cap)
        for h, (m, l, acc) in enumerate(carry):
            m_ref[h], l_ref[h], acc_ref[h] = m, l, acc

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        _finish(o_ref, tuple((m_ref[h], l_ref[h], acc_ref[h]) for h in range(hkv)))


# ---------------------------------------------------------------------------------------------
# Mosaic GPU front end (Hopper and newer)

MGPU_ROWS = 64  # a warpgroup product's rows: the G query heads of one KV head, padded
MGPU_BLOCK = 64  # keys per step (whole pages; at least a product's minimum width)
MGPU_NEG = -1e30  # finite: a step whose keys are all masked must not make exp(-inf + inf)
MGPU_DTYPES = (jnp.bfloat16, jnp.float16)
MGPU_SMEM_BYTES = 200 * 1024  # of Hopper's 227 KiB per block, some left to the compiler


def mosaic_gpu_misfit(q, k_pages, v_pages) -> str | None:
    """Why the Mosaic GPU front end cannot run these shapes (None: it can). Its products are
    warpgroup matrix products over 128-byte swizzled tiles in shared memory: 16-bit KV, head
    dims a multiple of 64, at most 64 query heads per KV head, pages of 8 to 64 tokens that
    tile 64 (or whole multiples of 64)."""
    g, dk = q.shape[2], q.shape[3]
    ps, dv = k_pages.shape[1], v_pages.shape[3]
    dt = jnp.dtype(k_pages.dtype)
    if dt not in (jnp.dtype(d) for d in MGPU_DTYPES) or v_pages.dtype != k_pages.dtype:
        return f"KV dtype {dt} (16-bit only)"
    if dk % 64 or dv % 64:
        return f"head dims {dk} / {dv} (multiples of 64 only)"
    if g > MGPU_ROWS:
        return f"{g} query heads per KV head (at most {MGPU_ROWS})"
    if ps < 8 or (MGPU_BLOCK % ps if ps < MGPU_BLOCK else ps % MGPU_BLOCK):
        return f"page size {ps} (8 to 64 dividing 64, or a multiple of 64)"
    block = max(ps, MGPU_BLOCK)
    smem = dt.itemsize * (MGPU_ROWS * (dk + 2 * dv + block) + 2 * block * (dk + dv))
    if smem > MGPU_SMEM_BYTES:
        return f"{smem} bytes of shared memory (at most {MGPU_SMEM_BYTES})"
    return None


def _gpu_interpreter(interpret):
    """The Mosaic GPU interpreter's parameters for `interpret` (True: its defaults; it runs the
    kernel on CPU, simulating shared memory, barriers and asynchronous copies), or None."""
    if not interpret or not isinstance(interpret, bool):
        return interpret or None
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = getattr(plgpu, "InterpretParams", None)  # public in later JAX, private in 0.10
    if params is None:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as params
    return params()


def _transposed(plgpu, ref):
    """A shared-memory ref read transposed by a product: Mosaic GPU's own transform in JAX
    0.10; the ref's `transpose` from 0.11 (where the former is deprecated for it)."""
    if jax.__version_info__ < (0, 11):
        return plgpu.transpose_ref(ref, (1, 0))
    return ref.transpose((1, 0))


def paged_decode_mosaic_gpu(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    seq_lens,
    sinks,
    *,
    kind,
    window,
    scale,
    soft_cap,
    interpret,
):
    """Grid (batch, KV head), one warpgroup each: the window's pages, `MGPU_BLOCK` keys per
    step, copied by TMA into shared memory two steps deep (the next step's pages are in flight
    while this one computes); QK^T and PV are warpgroup products into float32 accumulators,
    with the running softmax between them in registers. The kernel returns the output and
    log-sum-exp of each row; a head's sink joins the softmax afterwards, exactly
    (out * sigmoid(lse - sink)). Interpreted (CPU), the product QK^T runs as an ordinary dot
    (the interpreter takes no transposed operand) and register layouts are left to it."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, hkv, g, dk = q.shape
    ps, np_, dv, dt = k_pages.shape[1], page_table.shape[1], v_pages.shape[3], k_pages.dtype
    rows, block = MGPU_ROWS, max(ps, MGPU_BLOCK)
    per_step = block // ps
    qp = jnp.zeros((b, hkv, rows, dk), dt).at[:, :, :g].set(q.astype(dt))
    cols = -(-np_ // 32) * 32  # copies move whole multiples of 128 bytes
    table = jnp.zeros((b, cols), jnp.int32).at[:, :np_].set(page_table)
    q_pos, lo, first, last = _window(seq_lens, first_page, jnp.arange(b), ps, np_, kind, window)
    scalars = jnp.stack([first_page, q_pos, lo, first, last], 1).astype(jnp.int32)
    info = jnp.zeros((b, 32), jnp.int32).at[:, :5].set(scalars)
    tiles = (plgpu.TilingTransform((8, 128 // jnp.dtype(dt).itemsize)), plgpu.SwizzleTransform(128))
    if interpret:
        cast, iota = (lambda x, _: x), jax.lax.broadcasted_iota
    else:
        cast = plgpu.layout_cast
        iota = functools.partial(plgpu.broadcasted_iota, layout=plgpu.Layout.WGMMA)
    row_layout, wgmma = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA

    def body(q_ref, k_ref, v_ref, pt_ref, info_ref, o_ref, lse_ref, smem, barriers):
        q_s, k_s, v_s, pt_s, info_s, p_s, o_s, lse_s = smem
        k_bar, v_bar, q_bar, s_bar = barriers
        i, h = jax.lax.axis_index("b"), jax.lax.axis_index("h")
        plgpu.copy_gmem_to_smem(q_ref.at[i, h], q_s, q_bar.at[0])
        plgpu.copy_gmem_to_smem(pt_ref.at[i], pt_s, s_bar.at[0])
        plgpu.copy_gmem_to_smem(info_ref.at[i], info_s, s_bar.at[1])
        plgpu.barrier_wait(s_bar.at[0])
        plgpu.barrier_wait(s_bar.at[1])
        fp, qpos, lo_, c0, c1 = (info_s[j] for j in range(5))
        steps = jnp.maximum(c1 - c0 + per_step, 0) // per_step

        def fetch(step, slot):  # the step's pages; one past the window repeats the last
            for j in range(per_step):
                page = pt_s[jnp.minimum(c0 + step * per_step + j, c1)]
                rows_j = pl.ds(j * ps, ps)
                plgpu.copy_gmem_to_smem(k_ref.at[page, :, h], k_s.at[slot, rows_j], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[page, :, h], v_s.at[slot, rows_j], v_bar.at[slot])

        @pl.when(steps > 0)
        def _():
            fetch(0, 0)

        plgpu.barrier_wait(q_bar.at[0])

        def step(s, carry):
            acc, m, l = carry
            slot = jax.lax.rem(s, 2)

            @pl.when(s + 1 < steps)
            def _():
                fetch(s + 1, 1 - slot)

            plgpu.barrier_wait(k_bar.at[slot])
            if interpret:
                qk = jax.lax.dot_general(
                    q_s[...], k_s[slot], (((1,), (1,)), ((), ())), preferred_element_type=F32
                )
            else:

                def qk_product(acc_ref):
                    plgpu.wgmma(acc_ref, q_s, _transposed(plgpu, k_s.at[slot]))
                    return acc_ref[...]

                qk = pl.run_scoped(qk_product, plgpu.ACC((rows, block), F32))
            qk = qk * scale
            if soft_cap is not None:
                qk = jnp.tanh(qk / soft_cap) * soft_cap
            k_pos = (fp + c0 + s * per_step) * ps + iota(jnp.int32, (rows, block), 1)
            qk = jnp.where((k_pos >= lo_) & (k_pos <= qpos), qk, MGPU_NEG)
            m_new = jnp.maximum(m, qk.max(axis=1))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(qk - jax.lax.broadcast_in_dim(m_new, qk.shape, [0]))
            l = l * alpha + p.sum(axis=1)
            acc = acc * jax.lax.broadcast_in_dim(alpha, acc.shape, [0])
            p_s[...] = p.astype(dt)
            plgpu.commit_smem()  # the product reads p through the async proxy
            plgpu.barrier_wait(v_bar.at[slot])

            def pv_product(acc_ref):
                plgpu.wgmma(acc_ref, p_s, v_s.at[slot])
                return acc_ref[...]

            return acc + pl.run_scoped(pv_product, plgpu.ACC((rows, dv), F32)), m_new, l

        init = (
            cast(jnp.full((rows, dv), 0, F32), wgmma),
            cast(jnp.full((rows,), MGPU_NEG, F32), row_layout),
            cast(jnp.full((rows,), 0, F32), row_layout),
        )
        acc, m, l = jax.lax.fori_loop(0, steps, step, init)
        safe = jnp.maximum(l, 1e-30)  # padding rows (no key) end at 0 / 1e-30 = 0
        o_s[...] = (acc / jax.lax.broadcast_in_dim(safe, acc.shape, [0])).astype(dt)
        lse_s[...] = m + jnp.log(safe)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_ref.at[i, h])
        plgpu.copy_smem_to_gmem(lse_s, lse_ref.at[i, h])
        plgpu.wait_smem_to_gmem(0)

    def swajax_paged_decode_mosaic_gpu(*refs):
        smem = (
            plgpu.SMEM((rows, dk), dt, transforms=tiles),
            plgpu.SMEM((2, block, dk), dt, transforms=tiles),
            plgpu.SMEM((2, block, dv), dt, transforms=tiles),
            plgpu.SMEM((cols,), jnp.int32),
            plgpu.SMEM((32,), jnp.int32),
            plgpu.SMEM((rows, block), dt, transforms=tiles),
            plgpu.SMEM((rows, dv), dt, transforms=tiles),
            plgpu.SMEM((rows,), F32),
        )
        barriers = (
            plgpu.Barrier(num_arrivals=per_step, num_barriers=2),  # one arrival per page copy
            plgpu.Barrier(num_arrivals=per_step, num_barriers=2),
            plgpu.Barrier(num_barriers=1),
            plgpu.Barrier(num_barriers=2),
        )
        pl.run_scoped(lambda s, bars: body(*refs, s, bars), smem, barriers)

    out, lse = plgpu.kernel(
        swajax_paged_decode_mosaic_gpu,
        out_type=(
            jax.ShapeDtypeStruct((b, hkv, rows, dv), dt),
            jax.ShapeDtypeStruct((b, hkv, rows), F32),
        ),
        grid=(b, hkv),
        grid_names=("b", "h"),
        compiler_params=plgpu.CompilerParams(),
        interpret=_gpu_interpreter(interpret),
    )(qp, k_pages, v_pages, table, info)
    out, lse = out[:, :, :g].astype(F32), lse[:, :, :g]
    if sinks is not None:  # the sink's share of the softmax, joined exactly
        out = out * jax.nn.sigmoid(lse - sinks.astype(F32)[None])[..., None]
    return out.astype(q.dtype)


# ---------------------------------------------------------------------------------------------
# Public function


def static_validate(q, k_pages, v_pages, page_table, first_page, seq_lens, sinks, kind, window):
    b, hkv, g, dk = q.shape
    if k_pages.ndim != 4 or k_pages.shape[2:] != (hkv, dk):
        raise ValueError(
            f"k_pages must be [pages, ps, {hkv}, {dk}] for q {q.shape}, got {k_pages.shape}"
        )
    if v_pages.shape[:3] != k_pages.shape[:3]:
        raise ValueError(
            f"v_pages {v_pages.shape} must match k_pages {k_pages.shape} but the last dim"
        )
    if page_table.ndim != 2 or page_table.shape[0] != b:
        raise ValueError(f"page_table must be [{b}, pages], got {page_table.shape}")
    if first_page.shape != (b,) or seq_lens.shape != (b,):
        raise ValueError(
            f"first_page {first_page.shape} and seq_lens {seq_lens.shape} must be ({b},)"
        )
    if sinks is not None and sinks.shape != (hkv, g):
        raise ValueError(f"sinks must be [{hkv}, {g}], got {sinks.shape}")
    if kind not in common.KINDS:
        raise ValueError(f"kind must be one of {common.KINDS}, got {kind!r}")
    if kind != "full" and window < 1:
        raise ValueError(f"a {kind} window must be >= 1, got {window}")


def dynamic_validate(k_pages, page_table, first_page, seq_lens) -> None:
    """The checks on values `static_validate` cannot make (they need concrete arrays, so call
    it outside jit, on the host): every table entry a pool page, no negative first page or
    length, and each sequence's keys inside its table."""
    import numpy as np

    pt, fp, sl = (np.asarray(a) for a in (page_table, first_page, seq_lens))
    pages, ps, cols = k_pages.shape[0], k_pages.shape[1], pt.shape[1]
    common.check_values(
        [
            ("page_table", pt, (pt >= 0) & (pt < pages), f"a pool page in [0, {pages})"),
            ("first_page", fp, fp >= 0, ">= 0"),
            ("seq_lens", sl, sl >= 0, ">= 0"),
            (
                "seq_lens",
                sl,
                (sl == 0) | ((sl - 1) // ps - fp < cols),
                f"within the table: (seq_len - 1) // {ps} - first_page < {cols}",
            ),
        ]
    )


def window_pages(kind: str, window: int, page_size: int, table_width: int) -> int:
    """Most pages one query's window touches (the TPU grid's second axis)."""
    back = common.lookback(kind, window)
    if back is None:
        return table_width
    return min(-(-back // page_size) + 1, table_width)


@functools.partial(
    jax.jit,
    static_argnames=("kind", "window", "scale", "soft_cap", "backend", "interpret", "block_sizes"),
)
def paged_decode(
    q,
    k_pages,
    v_pages,
    page_table,
    first_page,
    seq_lens,
    sinks=None,
    *,
    kind: str,
    window: int = 0,
    scale: float,
    soft_cap: float | None = None,
    backend: str = "gpu",
    interpret: bool = False,
    block_sizes: common.BlockSizes = common.DEFAULT_BLOCK_SIZES,
):
    """Decode attention of one query per sequence, reading only its window's pages.

    Args:
      q: [B, Hkv, G, Dk] queries at positions seq_lens - 1.
      k_pages / v_pages: [pages, page_size, Hkv, Dk / Dv] one layer's pool.
      page_table: i32[B, NP]: pool page of logical page first_page[b] + j.
      first_page: i32[B]; seq_lens: i32[B] (0 marks padding: its output is 0).
      sinks: optional f32[Hkv, G] per-head sink logits.
      kind / window: "full", "sliding" (keys [q - window, q]) or "chunked" (chunk = window).
      backend: "gpu" (Triton: pages gathered in the kernel), "mosaic_gpu" (Hopper and newer:
        pages copied by TMA, warpgroup products; `mosaic_gpu_misfit` says which shapes) or
        "tpu" (scalar-prefetched page table). Interpreted, each runs on CPU.
    Returns:
      [B, Hkv, G, Dv] in q's dtype.
    """
    static_validate(q, k_pages, v_pages, page_table, first_page, seq_lens, sinks, kind, window)
    params = dict(kind=kind, window=window, scale=scale, soft_cap=soft_cap)
    if backend == "mosaic_gpu":
        misfit = mosaic_gpu_misfit(q, k_pages, v_pages)
        if misfit is not None:
            raise ValueError(f"the Mosaic GPU decode kernel does not take {misfit}")
        tables = (page_table, first_page, seq_lens)
        return paged_decode_mosaic_gpu(
            q, k_pages, v_pages, *tables, sinks, **params, interpret=interpret
        )
    ps, np_ = k_pages.shape[1], page_table.shape[1]

    def page_map(i, j, pt, fp, sl):
        _, _, first, last = _window(sl, fp, i, ps, np_, kind, window)
        return (pt[i * np_ + jnp.clip(first + j, 0, jnp.maximum(last, 0))], 0, 0)

    kernels = tuple(
        functools.partial(k, **params) for k in (paged_decode_kernel_gpu, paged_decode_kernel_tpu)
    )
    return common.paged_call(
        kernels,
        q,
        k_pages,
        v_pages,
        (page_table, first_page, seq_lens),
        sinks,
        name="swajax_paged_decode",
        steps=window_pages(kind, window, ps, np_),
        page_map=page_map,
        backend=backend,
        interpret=interpret,
        block_sizes=block_sizes,
    )
