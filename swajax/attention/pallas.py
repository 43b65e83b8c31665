"""Adapter from batch metadata to the Pallas kernels of `swajax.kernels`."""

from __future__ import annotations

import jax.numpy as jnp

from swajax import platform
from swajax.attention.metadata import AttentionMetadata, from_blocks, to_blocks
from swajax.config import LayerSpec
from swajax.kernels.paged_decode import mosaic_gpu_misfit, paged_decode
from swajax.kernels.ragged_extend import ragged_extend


def _tables(meta: AttentionMetadata, layer: LayerSpec):
    if layer.kind.is_local:
        return meta.swa_page_table, meta.swa_first_page
    return meta.full_page_table, jnp.zeros_like(meta.swa_first_page)


def default_backend() -> str:
    return "tpu" if platform.target() == "tpu" else "gpu"


def attention_pallas(
    q,
    k_pages,
    v_pages,
    meta: AttentionMetadata,
    layer: LayerSpec,
    *,
    scale,
    sinks=None,
    soft_cap=None,
    interpret=False,
    backend=None,
):
    """Same contract as `attention_xla`; decode batches (block_q == 1) use the decode kernel."""
    backend = backend or default_backend()
    if platform.is_cpu() and not interpret:
        raise ValueError("Pallas kernels run on CPU only in interpret mode: pass interpret=True")
    t, hq, dk = q.shape
    hkv, dv = k_pages.shape[2], v_pages.shape[3]
    g, nb, bq = hq // hkv, *meta.block_tokens.shape
    table, first = _tables(meta, layer)
    sink = None if sinks is None else sinks.reshape(hkv, g)
    kw = dict(
        kind=layer.kind.value,
        window=layer.kernel_window,
        scale=scale,
        soft_cap=soft_cap,
        backend=backend,
        interpret=interpret,
    )
    real = meta.block_tokens < t
    q_blocks = to_blocks(q, meta)
    if bq == 1:
        req = meta.block_req
        seq = jnp.where(real[:, 0], meta.block_pos + 1, 0)
        q_dec = q_blocks.reshape(nb, hkv, g, dk)
        # Hopper and newer: the Mosaic GPU front end where its shapes allow (the Triton one,
        # which JAX deprecated, otherwise).
        if backend == "gpu" and platform.mosaic_gpu() and not interpret:
            if mosaic_gpu_misfit(q_dec, k_pages, v_pages) is None:
                kw["backend"] = "mosaic_gpu"
        out = paged_decode(q_dec, k_pages, v_pages, table[req], first[req], seq, sink, **kw)
    else:
        q_rows = q_blocks.reshape(nb, bq, hkv, g, dk).transpose(0, 2, 1, 3, 4)
        out = ragged_extend(
            q_rows.reshape(nb, hkv, bq * g, dk),
            k_pages,
            v_pages,
            table,
            first,
            meta.block_req,
            meta.block_pos,
            jnp.sum(real, axis=1, dtype=jnp.int32),
            sink,
            g=g,
            **kw,
        )
        out = out.reshape(nb, hkv, bq, g, dv).transpose(0, 2, 1, 3, 4)
    return from_blocks(out.reshape(nb, bq, hq, dv), meta, q.dtype)
