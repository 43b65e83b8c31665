"""`attention(...)`: one public entry for paged attention, dispatching to an implementation."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax

from swajax.attention.invariant import attention_invariant
from swajax.attention.metadata import AttentionMetadata
from swajax.attention.xla import attention_xla
from swajax.config import LayerSpec

Implementation = Literal["xla", "pallas"]


class AttentionMode(NamedTuple):
    """How a model's layers run `attention` (hashable: a static argument of the model's jit)."""

    implementation: Implementation = "xla"
    interpret: bool = False  # Pallas interpret mode (CPU)
    mesh: Any = None  # a Mesh splitting KV heads over axis "tp", or None
    # The platform the programs are traced for (`swajax.platform.target()` where the model was
    # built): part of every step program's static key, so a program traced for one platform is
    # never reused for another.
    target: str | None = None
    # Batch-invariant attention (`swajax.attention.invariant`): a query's output bits do not
    # depend on how it was batched; the XLA implementation only.
    deterministic: bool = False


def as_pages(buffer: jax.Array, page_size: int) -> jax.Array:
    """One layer's pool buffer [rows, heads, dim] viewed as [pages, page_size, heads, dim]."""
    rows, heads, dim = buffer.shape
    if rows % page_size:
        raise ValueError(f"pool rows {rows} are not a multiple of page_size {page_size}")
    return buffer.reshape(rows // page_size, page_size, heads, dim)


def _validate(q, k_pages, v_pages, meta, sinks):
    if q.ndim != 3 or k_pages.ndim != 4 or v_pages.ndim != 4:
        raise ValueError(
            f"expected q [T, Hq, Dk] and pages [P, ps, Hkv, D], got q {q.shape}, "
            f"k {k_pages.shape}, v {v_pages.shape}"
        )
    if q.shape[0] != meta.num_tokens:
        raise ValueError(f"q has {q.shape[0]} tokens, the metadata {meta.num_tokens}")
    if k_pages.shape[:3] != v_pages.shape[:3] or k_pages.shape[1] != meta.page_size:
        raise ValueError(
            f"k pages {k_pages.shape} and v pages {v_pages.shape} must share pages, page size "
            f"{meta.page_size} and KV heads"
        )
    if q.shape[2] != k_pages.shape[3] or q.shape[1] % k_pages.shape[2]:
        raise ValueError(
            f"q {q.shape} does not match k pages {k_pages.shape}: need equal head dims and "
            "query heads a multiple of KV heads"
        )
    if sinks is not None and sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks must have shape ({q.shape[1]},), got {sinks.shape}")


def attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    meta: AttentionMetadata,
    layer: LayerSpec,
    *,
    scale: float,
    sinks: jax.Array | None = None,
    soft_cap: float | None = None,
    key_transform=None,
    implementation: Implementation = "xla",
    interpret: bool = False,
    backend: str | None = None,
    mesh=None,
    deterministic: bool = False,
) -> jax.Array:
    """Paged attention of a flattened batch for one layer.

    Args:
      q: [T, Hq, Dk] queries, in the order of `meta.positions`.
      k_pages, v_pages: the layer's pool as [pages, page_size, Hkv, D] (see `as_pages`); local
        layers pass the SWA pool and read `meta.swa_page_table`, full layers the full pool.
      layer: the layer's kind and window: full, sliding (keys [q - W, q]) or chunked.
      scale: multiplies q.k (sinks are not scaled).
      sinks: optional [Hq] per-head logits added to the softmax denominator only.
      soft_cap: optional logit soft cap (Gemma 2): s -> cap * tanh(s / cap), before the mask.
      key_transform: optional fn(rows, positions) -> keys for pools that store one tensor as K
        and V (Gemma 4 attention_k_eq_v: K = RoPE(V * k_norm weight)). Applied to the gathered
        rows, so such layers run the XLA implementation whatever `implementation` says (the
        kernels read K pages as stored).
      implementation: "xla" (any device) or "pallas" (kernels in swajax.kernels).
      interpret: run Pallas kernels in interpret mode (required on CPU).
      backend: Pallas front end, "gpu" (Triton style) or "tpu" (scalar prefetch); default
        from the JAX backend (the GPU front end on CPU).
      mesh: a `jax.sharding.Mesh` whose axis "tp" splits the KV heads (tensor parallel): each
        device runs the implementation on its own heads inside `shard_map` (a kernel sees only
        local arrays; query head h reads KV head h // group on the same device).
      deterministic: batch-invariant attention (`swajax.attention.invariant`), with the XLA
        implementation only.
    Returns:
      [T, Hq, Dv] in q's dtype.
    """
    _validate(q, k_pages, v_pages, meta, sinks)
    if deterministic and implementation != "xla":
        raise ValueError(
            f"deterministic attention runs the XLA implementation only, not {implementation!r}"
        )
    if key_transform is not None:
        implementation = "xla"
    if deterministic:
        implementation = "invariant"
    kwargs = dict(
        scale=scale,
        soft_cap=soft_cap,
        key_transform=key_transform,
        implementation=implementation,
        interpret=interpret,
        backend=backend,
    )
    if mesh is not None:
        return _sharded(q, k_pages, v_pages, meta, layer, mesh, sinks=sinks, **kwargs)
    return _local(q, k_pages, v_pages, meta, layer, sinks=sinks, **kwargs)


def _sharded(q, k_pages, v_pages, meta, layer, mesh, *, sinks, **kwargs):
    from jax.sharding import PartitionSpec as P

    from swajax.memory.mesh_axis import AXIS

    heads, pages = P(None, AXIS, None), P(None, None, AXIS, None)
    if sinks is None:
        fn = lambda q, k, v, m: _local(q, k, v, m, layer, sinks=None, **kwargs)  # noqa: E731
        specs, args = (heads, pages, pages, P()), (q, k_pages, v_pages, meta)
    else:
        fn = lambda q, k, v, m, s: _local(q, k, v, m, layer, sinks=s, **kwargs)  # noqa: E731
        specs, args = (heads, pages, pages, P(), P(AXIS)), (q, k_pages, v_pages, meta, sinks)
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=heads, check_vma=False)
    return mapped(*args)


def _local(
    q,
    k_pages,
    v_pages,
    meta,
    layer,
    *,
    scale,
    sinks,
    soft_cap,
    key_transform,
    implementation,
    interpret,
    backend,
):
    kwargs = dict(scale=scale, sinks=sinks, soft_cap=soft_cap)
    if implementation == "invariant":
        return attention_invariant(
            q, k_pages, v_pages, meta, layer, key_transform=key_transform, **kwargs
        )
    if implementation == "xla":
        return attention_xla(
            q, k_pages, v_pages, meta, layer, key_transform=key_transform, **kwargs
        )
    if implementation == "pallas":
        from swajax.attention.pallas import attention_pallas

        return attention_pallas(
            q, k_pages, v_pages, meta, layer, interpret=interpret, backend=backend, **kwargs
        )
    raise ValueError(f"implementation must be 'xla' or 'pallas', got {implementation!r}")
