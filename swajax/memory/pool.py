"""KV pools: a full sub-pool for full layers and an SWA sub-pool for sliding / chunked layers.

Each sub-pool has its own KV-head count and K / V head dims (MiMo-V2: SWA 8 heads, full 4;
K 192, V 128) and `size + page_size` rows, so that slot / page 0 is a dummy that padded tokens
write into. Buffers are stacked per sub-pool: `full_k[i]` is the K cache of the i-th full layer.

Modes follow the pool sizes: "hybrid" (two pools of their own sizes), "single" (hybrid memory
disabled: both sub-pools have the one pool's rows and SWA layers address them with full slots;
they still attend only their window) and "all_swa" (no full layers).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from swajax.config import AttentionShape, HybridConfig
from swajax.memory import bits
from swajax.memory.compressed_pool import CompressedPools, dtype_of, init_compressed
from swajax.memory.zeros import zeros
from swajax.sizing import PoolMode, PoolSizes

DTYPES = {
    "bf16": jnp.bfloat16,
    "fp16": jnp.float16,
    "fp32": jnp.float32,
    # FP8 pools: a layer's K and V are stored divided by the checkpoint's per-layer scales
    # (1.0 without them) and read back times them inside the attention (`models.layers`).
    "fp8_e4m3": jnp.float8_e4m3fn,
    "fp8_e5m2": jnp.float8_e5m2,
}
FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))


def stored(x: jax.Array, dtype) -> jax.Array:
    """`x` as a pool of `dtype` stores it. FP8 saturates at its largest finite value: e4m3
    has no infinity, so a plain cast would turn an outlier into NaN and poison every read."""
    if jnp.dtype(dtype) in FP8:
        top = float(jnp.finfo(dtype).max)
        return jnp.clip(x.astype(jnp.float32), -top, top).astype(dtype)
    return x.astype(dtype)


class Slot(NamedTuple):
    """Where one layer's KV lives: its index in a sub-pool's stacked buffers (an int, or a
    traced scalar inside a scan over layers) and which sub-pool."""

    index: int | jax.Array
    is_swa: bool


class KVWriteLoc(NamedTuple):
    """Where the new tokens' KV goes: full slots, and for SWA layers their SWA slots."""

    full: jax.Array  # i32[T]
    swa: jax.Array | None = None  # i32[T]; the pool never translates on the write path
    # i32[T] or None: full layers store the KV already at this full slot instead of the new
    # one (0: the new one). A tail rebuild gets the prefix cache's exact full KV this way.
    full_src: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVPools:
    # A token's heads side by side: [layers, rows, kv_heads * dim]. Read as [..., heads, dim]
    # (`stacked`, `pages`, `layer`): the same bytes on CPU and GPU, where that is a free
    # reshape; on TPU this is the layout the buffers take in HBM with no padding (a minor axis
    # of 64 or 128 lanes of one head would pad, or XLA would store the pool transposed and copy
    # it whole around every kernel that reads it), and the layout the kernels read a page in.
    full_k: jax.Array  # [L_full, full_rows, full_kv_heads * full_k_dim]
    full_v: jax.Array  # [L_full, full_rows, full_kv_heads * full_v_dim]
    swa_k: jax.Array  # [L_swa, swa_rows, swa_kv_heads * swa_k_dim]
    swa_v: jax.Array  # [L_swa, swa_rows, swa_kv_heads * swa_v_dim]
    # Global layer id -> (index in its sub-pool, is an SWA layer). A KV-shared layer (Gemma 4)
    # maps to its source layer's buffers.
    layers: tuple[tuple[int, bool], ...] = dataclasses.field(metadata=dict(static=True))
    page_size: int = dataclasses.field(metadata=dict(static=True))
    mode: PoolMode = dataclasses.field(metadata=dict(static=True))
    # (full, swa): the sub-pool stores one tensor that is both K and V (Gemma 4
    # attention_k_eq_v); its V buffer then has no layers.
    k_is_v: tuple[bool, bool] = dataclasses.field(
        default=(False, False), metadata=dict(static=True)
    )
    # DeepSeek-V4's compressed entries and pending compressor projections (None otherwise).
    compressed: CompressedPools | None = None
    # The (full, SWA) K / V dtype where the buffers hold its bits instead (`memory.bits`: a
    # narrow float on CPU, which XLA:CPU would widen or copy whole to write or carry), or None.
    # `stacked` and `pages` read them as that dtype; `write_kv` stores the bits.
    bits_of: tuple[str | None, str | None] = dataclasses.field(
        default=(None, None), metadata=dict(static=True)
    )
    # (full, SWA) KV heads: how the minor axis splits into heads and dims.
    heads: tuple[int, int] = dataclasses.field(default=(1, 1), metadata=dict(static=True))

    def as_bits(self, is_swa: bool) -> bool:
        return self.bits_of[1 if is_swa else 0] is not None

    def layer(self, layer_id: int) -> tuple[jax.Array, jax.Array]:
        """(K, V) buffers of one global layer, shape [rows, kv_heads, dim] (the same buffer
        twice where keys are values)."""
        slot = self.slot(layer_id)
        k, v = self.stacked(slot.is_swa)
        return k[slot.index], v[slot.index]

    def slot(self, layer: int | Slot) -> Slot:
        """The slot of a global layer id (a `Slot` passes through)."""
        return layer if isinstance(layer, Slot) else Slot(*self.layers[layer])

    def stacked(self, is_swa: bool) -> tuple[jax.Array, jax.Array]:
        """A sub-pool's (K, V) buffers [layers, rows, heads, dim] (K twice where keys are
        values)."""
        k, v = (self.swa_k, self.swa_v) if is_swa else (self.full_k, self.full_v)
        dtype = self.bits_of[1 if is_swa else 0]
        if dtype is not None:
            k, v = bits.from_bits(k, dtype), bits.from_bits(v, dtype)
        heads = self.heads[1 if is_swa else 0]
        k, v = (x.reshape(*x.shape[:2], heads, x.shape[2] // heads) for x in (k, v))
        return k, k if self.k_is_v[1 if is_swa else 0] else v

    def pages(self, slot: Slot) -> tuple[jax.Array, jax.Array, int | jax.Array]:
        """(K pages, V pages, page offset) of one layer without slicing its buffers out: the
        whole sub-pool viewed as [layers * pages, page_size, heads, dim], where the layer's page
        p is page `offset + p`. No copy of a layer's pool is made, even for a traced index (a
        scan over layers) or a kernel operand, which XLA would otherwise materialize."""
        k, v = self.stacked(slot.is_swa)
        per_layer = k.shape[1] // self.page_size
        return (
            _flat_pages(k, self.page_size),
            _flat_pages(v, self.page_size),
            (slot.index * per_layer),
        )


def _flat_pages(buffer: jax.Array, page_size: int) -> jax.Array:
    layers, rows, heads, dim = buffer.shape
    return buffer.reshape(layers * rows // page_size, page_size, heads, dim)


def layers_mapping(cfg: HybridConfig) -> tuple[tuple[int, bool], ...]:
    full_index = {layer: i for i, layer in enumerate(cfg.full_layer_ids)}
    swa_index = {layer: i for i, layer in enumerate(cfg.swa_layer_ids)}

    def slot(i):
        return (swa_index[i], True) if i in swa_index else (full_index[i], False)

    return tuple(
        slot(i if layer.kv_source is None else layer.kv_source)
        for i, layer in enumerate(cfg.layers)
    )


def _buffers(num_layers: int, rows: int, shape: AttentionShape, dtype) -> tuple[tuple, tuple]:
    """(shape, dtype) of a pool's K and V buffers."""
    v_layers = 0 if shape.k_is_v else num_layers
    return (
        ((num_layers, rows, shape.num_kv_heads * shape.head_dim), dtype),
        ((v_layers, rows, shape.num_kv_heads * shape.v_head_dim), dtype),
    )


def init_pools(cfg: HybridConfig, sizes: PoolSizes, dtype: str = "bf16", sharding=None) -> KVPools:
    """Zeroed pools for the sizes of `swajax.sizing` (any mode); `sharding`: where each
    [layers, rows, heads * dim] buffer lives (tensor parallel: split on heads), made in place."""
    if dtype not in DTYPES:
        raise ValueError(f"KV pool dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    mode = sizes.mode
    ps = sizes.page_size
    full_rows = sizes.full_tokens + ps if mode is not PoolMode.ALL_SWA else ps
    swa_rows = (sizes.full_tokens if mode is PoolMode.SINGLE else sizes.swa_tokens) + ps
    kind = jnp.dtype(DTYPES[dtype]).name
    held = bits.held(kind).name
    full = _buffers(len(cfg.full_layer_ids), full_rows, cfg.full_attention, held)
    swa = _buffers(len(cfg.swa_layer_ids), swa_rows, cfg.swa_attention, held)
    full_k, full_v, swa_k, swa_v = zeros(*full, *swa, sharding=sharding)  # one program
    k_is_v = (cfg.full_attention.k_is_v, cfg.swa_attention.k_is_v)
    # Compressed stores have no head axis: split pools over heads leave them replicated.
    whole = None if sharding is None else jax.sharding.NamedSharding(sharding.mesh, P())
    compressed = init_compressed(cfg, full_rows, swa_rows, ps, dtype_of(kind).name, whole)
    bits_of = (kind, kind) if held != kind else (None, None)
    heads = (cfg.full_attention.num_kv_heads, cfg.swa_attention.num_kv_heads)
    return KVPools(
        full_k,
        full_v,
        swa_k,
        swa_v,
        layers_mapping(cfg),
        ps,
        mode,
        k_is_v,
        compressed,
        bits_of,
        heads,
    )


def placed(pools: KVPools, sharding) -> KVPools:
    """`pools` of shapes only as `init_pools(..., sharding=sharding)` places them: the four KV
    buffers by `sharding`, the compressed stores replicated (None: left as they are)."""
    if sharding is None:
        return pools
    whole = jax.sharding.NamedSharding(sharding.mesh, P())

    def at(where):
        return lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where)

    kv = {n: at(sharding)(getattr(pools, n)) for n in ("full_k", "full_v", "swa_k", "swa_v")}
    compressed = jax.tree.map(at(whole), pools.compressed)
    return dataclasses.replace(pools, **kv, compressed=compressed)


def write_kv(
    pools: KVPools, layer_id: int | Slot, k: jax.Array, v: jax.Array, loc: KVWriteLoc
) -> KVPools:
    """Store one layer's new K [T, heads, k_dim] and V [T, heads, v_dim] at `loc`; the layer
    is a global layer id or its `Slot` (whose index may be traced).

    Full layers write at `loc.full` (any `loc.swa` is ignored); SWA layers write at `loc.swa`,
    which must be given: a missing SWA location is a bug in the caller and fails at trace time.
    Where keys are values the pool stores `k` only (`v` must be None).
    """
    index, is_swa = pools.slot(layer_id)
    if pools.k_is_v[1 if is_swa else 0] != (v is None):
        raise ValueError(f"layer {layer_id}: pass v=None exactly where the pool's keys are values")
    if is_swa and loc.swa is None:
        raise ValueError(
            f"layer {layer_id} is an SWA layer: writing its KV needs the SWA location "
            "(KVWriteLoc.swa), translated once per batch by the attention metadata"
        )
    names = ("swa_k", "swa_v") if is_swa else ("full_k", "full_v")
    views = pools.stacked(is_swa)
    new = {}
    for name, view, x in zip(names, views, (k, v), strict=True):
        if x is None:
            continue
        x = stored(x, view.dtype)
        buffer = getattr(pools, name)
        if is_swa:
            rows = loc.swa
        else:
            rows = loc.full
            if loc.full_src is not None:  # a tail rebuild stores the prefix cache's own KV
                x = jnp.where(
                    (loc.full_src > 0)[:, None, None],
                    _rows(pools, buffer, index, loc.full_src, x.shape),
                    x,
                )
        x = x.reshape(x.shape[0], -1)  # heads side by side, as the buffer holds them
        new[name] = buffer.at[index, rows].set(bits.to_bits(x) if pools.as_bits(is_swa) else x)
    return dataclasses.replace(pools, **new)


def _rows(pools: KVPools, buffer: jax.Array, index, rows: jax.Array, shape) -> jax.Array:
    """Full-pool rows of one layer as [T, heads, dim], gathered as the buffer stores them
    (heads side by side) and split after: gathering from the per-head view instead relays the
    whole pool out on TPU, where [.., heads * dim] and [.., heads, dim] tile differently
    (measured: a copy of each full pool in every step that rebuilds a tail)."""
    kept = buffer[index, rows]
    if pools.bits_of[0] is not None:
        kept = bits.from_bits(kept, pools.bits_of[0])
    return kept.reshape(shape)


write_kv_jit = jax.jit(write_kv, static_argnames="layer_id", donate_argnums=0)
write_kv_jit.__doc__ = "`write_kv`, jit-compiled with the old pools donated."


def bytes_allocated(pools: KVPools) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pools))
