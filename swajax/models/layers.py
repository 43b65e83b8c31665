"""Flax NNX building blocks of the hybrid decoder: norms, attention over the pools, MLP / MoE.

Linear kernels are stored [in, out] (the untied vocabulary head [V, H], as published: `Head`);
`load(weights, prefix)` reads the Hugging Face file layout (nn.Linear weights are [out, in]) and
checks every shape.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from swajax import platform
from swajax.attention import AttentionMode, attention
from swajax.memory import bits, pool as pool_lib
from swajax.models import invariant, quantized, tensor_split
from swajax.models.quantization import Quantization
from swajax.models.rope import apply_rope
from swajax.models.spec import Act, ModelSpec, Norm, QkNorm
from swajax.models.weights import Layout

HIGHEST = jax.lax.Precision.HIGHEST
F32 = jnp.float32


def param(shape, dtype=F32) -> nnx.Param:
    """A parameter; built under `nnx.eval_shape` it is only a shape until a loader fills it."""
    return nnx.Param(jnp.zeros(shape, dtype))


class ExpertWeight(nnx.Param):
    """A mixture-of-experts weight stacked [E, ...]. A `LayerStack` hands its copies the stack
    of every copy's experts whole, with the copy's index, instead of slicing one copy out per
    step: XLA:CPU copies such a slice before a loop reads it (a layer's experts are most of a
    MoE model's bytes), while the experts' own loop reads a chunk of one expert at a time."""


def expert_param(shape, dtype=F32) -> ExpertWeight:
    return ExpertWeight(jnp.zeros(shape, dtype))


def unhoisted(weight, varying):
    """`weight` tied to `varying` (a value each step computes afresh) on CPU. Where XLA:CPU
    widens a low-precision operand to float32 first (a one-row product, float16, slices and
    gathers of a stack: `widened_on_cpu`, `_dot`), a weight's widening is invariant to every
    loop around it (the layers' scan, the steps of a multi-step round), so XLA hoists it out of
    them: every weight of the model widened at once, resident for the whole program (at
    gpt-oss-20b's shapes several GiB). Through a barrier with `varying`, the weight is not
    invariant, and only what a product reads is widened, when it reads it. Elsewhere, and for
    float32 weights, `weight` itself."""
    if weight.dtype == F32 or not platform.is_cpu():
        return weight, varying
    return jax.lax.optimization_barrier((weight, varying))


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["stack", "copy"], meta_fields=["dtype"]
)
@dataclasses.dataclass(frozen=True)
class StackedKernel:
    """Copy `copy`'s [in, out] kernel, read out of the stack of every copy's [C, in, out] as
    the stack holds it (`memory.bits`): what a `LayerStack` hands a `Linear` on CPU in place of
    a slice. XLA:CPU copies a slice of a stack into a buffer of its own before a product reads
    it, and the bit cast back to `dtype` is another copy: each layer's weights through memory
    three times. `dot` reads a stacked kernel a cache-sized chunk of outputs at a time, straight
    out of the stack (benchmarks/README.md, "Published shapes")."""

    stack: jax.Array  # [C, in, out]
    copy: jax.Array  # int32 []
    dtype: str

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.stack.shape[1:])

    @property
    def ndim(self) -> int:
        return 2

    def __getitem__(self, index) -> StackedKernel:
        if index is not Ellipsis:
            raise TypeError(f"a stacked kernel is read whole ([...]), not at {index!r}")
        return self

    def columns(self, start, cols: int) -> jax.Array:
        """Columns [start, start + cols) of this copy's kernel, in `dtype` (a copy of them:
        read where they are used, `unhoisted`)."""
        din = self.stack.shape[1]
        whole, (start, copy) = unhoisted(self.stack, (jnp.asarray(start, jnp.int32), self.copy))
        block = jax.lax.dynamic_slice(whole, (copy, 0, start), (1, din, cols))
        return bits.from_bits(block.reshape(din, cols), self.dtype)


def dot(x, w, *, w_rows_out: bool = False):
    """x @ w in w's dtype with float32 accumulation; the float32 result (tile by tile in
    batch-invariant mode, `invariant.rows`). `w_rows_out`: w is stored [out, in] (x @ w.T,
    contracted as stored: no transposed copy); `w` may be a `StackedKernel`. On CPU:

    - a weight that XLA:CPU would widen (`widened_on_cpu`) of WIDE_BYTES or more runs in column
      tiles (`tiled_dot`): widened whole, a dense MLP matrix at published widths is 0.46 GiB
      (Gemma 4 31B's);
    - a bfloat16 [in, out] weight (or a stacked one) of more than CHUNK_BYTES runs a chunk of
      CHUNK_BYTES of outputs at a time: XLA:CPU reads a wide [in, out] weight slowly (its rows
      far apart; gpt-oss-20b's [2880, 201088] head at 4.6 GB/s), and a chunk copied into the
      cache and read from there goes faster (6.9 GB/s, the same bits). Not where the weights
      are split over devices (`tensor_split`): a stacked kernel is then never made.
    """
    out_axis = 0 if w_rows_out else 1
    stacked = isinstance(w, StackedKernel)
    if stacked and w_rows_out:
        raise ValueError("a stacked kernel is [in, out]: it has no rows-out form")
    if invariant.on() or not platform.is_cpu():
        return _dot(x, w.columns(0, w.shape[1]) if stacked else w, w_rows_out)
    din, dout = w.shape[1 - out_axis], w.shape[out_axis]
    if widened_on_cpu(w) and din * dout * jnp.dtype(w.dtype).itemsize >= WIDE_BYTES:
        cols = max(TILE_BYTES // (4 * din), 128)
        if dout > 2 * cols:  # a few tiles at least, or whole
            return tiled_dot(x, w, cols, w_rows_out=w_rows_out)
    elif (stacked or (w.dtype == jnp.bfloat16 and not w_rows_out)) and not tensor_split.on():
        cols = max(CHUNK_BYTES // (din * jnp.dtype(w.dtype).itemsize), 128)
        if dout > cols:
            return tiled_dot(x, w, cols, w_rows_out=w_rows_out)
    return _dot(x, w.columns(0, dout) if stacked else w, w_rows_out)


def widened_on_cpu(w) -> bool:
    """Whether XLA:CPU widens `w` to float32 whole before a product reads it. It multiplies
    float32 and bfloat16 as stored (bfloat16 by its YNNPACK fusion, for products of two rows or
    more: `_dot` gives a single row a zero companion), and widens every other low precision
    (float16, float8) first (measured with jax 0.10.2 and 0.12: benchmarks/README.md, "Products
    of bfloat16 weights")."""
    return platform.is_cpu() and jnp.dtype(w.dtype) not in (F32, jnp.bfloat16)


def _dot(x, w, w_rows_out: bool):
    w, x = unhoisted(w, x)
    dims = (((x.ndim - 1,), (1 if w_rows_out else 0,)), ((), ()))

    def product(x):
        return jax.lax.dot_general(
            x.astype(w.dtype),
            w,
            dims,
            precision=quantized.precision(w.dtype),
            preferred_element_type=F32,
        )

    if invariant.on():
        lead = x.shape[:-1]
        return invariant.rows(product, x.reshape(-1, x.shape[-1])).reshape(*lead, -1)
    if platform.is_cpu() and w.dtype == jnp.bfloat16 and x.size == x.shape[-1]:
        # One row is a matrix-vector product, which XLA:CPU runs by widening the whole weight
        # (2.2 GiB for gpt-oss-20b's head; 10-25x slower than two rows, measured): a zero row
        # makes it a product of two rows, read as stored.
        two = jnp.concatenate([x.reshape(1, -1), jnp.zeros((1, x.shape[-1]), x.dtype)])
        return product(two)[:1].reshape(*x.shape[:-1], -1)
    return product(x)


HEAD_TILE = 8192  # vocabulary columns per tile of a tiled head product
WIDE_BYTES = 64 * 2**20  # a low-precision weight this large runs in column tiles on CPU
TILE_BYTES = 32 * 2**20  # a tile's widened float32 bytes
CHUNK_BYTES = 8 * 2**20  # a chunk of a bfloat16 or stacked weight read on CPU


def tiled_dot(x, w, cols: int, *, w_rows_out: bool = False):
    """`dot` `cols` output columns at a time (w's output axis; w plain or a `StackedKernel`):
    each tile is copied (and widened, where XLA:CPU widens) where it is read, inside the loop
    (`unhoisted` ties the weight to the tile's index, so XLA cannot widen it whole ahead of
    the loop)."""
    axis = 0 if w_rows_out else 1
    v = w.shape[axis]
    n = -(-v // cols)

    def tile(i, out):  # the last tile ends at v (it overlaps the one before)
        start = jnp.minimum(i * cols, v - cols)
        if isinstance(w, StackedKernel):
            block = w.columns(start, cols)
        else:
            whole, start = unhoisted(w, start)
            block = jax.lax.dynamic_slice_in_dim(whole, start, cols, axis=axis)
        y = _dot(x, block, w_rows_out)
        return jax.lax.dynamic_update_slice_in_dim(out, y, start, axis=x.ndim - 1)

    return jax.lax.fori_loop(0, n, tile, jnp.zeros((*x.shape[:-1], v), F32))


def lookup(table, tokens):
    """table[tokens] in the table's dtype; only the gathered rows widened on CPU (`unhoisted`:
    a 201k x 2880 bfloat16 embedding would otherwise be widened whole, 2.2 GiB)."""
    table, tokens = unhoisted(table, tokens)
    return table[tokens]


def head_dot(x, head, *, vocab_first: bool = False):
    """x [T, H] @ head [H, V]: the vocabulary head, float32 logits; `vocab_first`: the head is
    stored [V, H] (an embedding the head is tied to), read as it is stored (a tied head
    transposed first was another copy of the table: 2.6 GiB at Gemma 3 27B's). Where XLA:CPU
    would widen the head (`widened_on_cpu`), a 201k-token head would be a 2.2 GiB temporary in
    every step, so it runs one tile of HEAD_TILE vocabulary entries at a time (the widened copy
    is one tile); elsewhere one product."""
    v = head.shape[0 if vocab_first else 1]
    if not widened_on_cpu(head) or v <= 2 * HEAD_TILE:
        return _dot(x, head, vocab_first)
    return tiled_dot(x, head, HEAD_TILE, w_rows_out=vocab_first)


class Linear(nnx.Module):
    """y = x W (+ b); the kernel is stored [in, out] in `dtype`, the output is in `dtype`.

    With `quant` saying block FP8 (a checkpoint's projections as published) the kernel stays
    float8 with its block scales (`quantized.BlockFp8`) and is dequantized to `dtype` inside
    the jitted call: the device holds the checkpoint's bytes."""

    def __init__(
        self, din: int, dout: int, bias: bool = False, dtype=F32, quant: Quantization | None = None
    ):
        self.dtype = jnp.dtype(dtype).name
        self.block = fp8_block(quant, din, dout)
        if self.block is None:
            self.kernel, self.kernel_scale = param((din, dout), dtype), None
        else:
            self.kernel = param((din, dout), quantized.FP8)
            self.kernel_scale = param(quantized.grid(din, dout, self.block))
        self.bias = param((dout,)) if bias else None

    def weight(self) -> jax.Array:
        """The kernel [in, out] in `dtype` (dequantized if kept quantized)."""
        if self.kernel_scale is None:
            return self.kernel[...]
        w, s = self.kernel[...], self.kernel_scale[...]
        return quantized.BlockFp8(w, s, self.block, self.dtype).dense()

    def __call__(self, x):
        y = dot(x, self.weight())
        y = y + self.bias[...] if self.bias is not None else y
        return y.astype(self.dtype)

    def load(self, w, prefix):
        if self.kernel_scale is None:
            w.fill(self.kernel, f"{prefix}.weight", transpose=True)
        else:
            w.fill_fp8(self.kernel, self.kernel_scale, f"{prefix}.weight", self.block)
        if self.bias is not None:
            w.fill(self.bias, f"{prefix}.bias")


class Head(nnx.Module):
    """The vocabulary head of an untied model, stored [V, H] as checkpoints publish
    `lm_head.weight` and read as stored (`head_dot`'s `vocab_first`). On CPU a product reads a
    [V, H] head about 2.5x faster than the [H, V] of a `Linear` kernel (gpt-oss-20b's 1.16 GB
    head at batch 1: 73 against 186-250 ms, benchmarks/README.md, "Products of bfloat16
    weights"); elsewhere the layout is the one the hub ships."""

    def __init__(self, hidden: int, vocab: int, dtype=F32):
        self.weight = param((vocab, hidden), dtype)

    def __call__(self, x):
        """Float32 logits of rows `x` [T, H]."""
        return head_dot(x, self.weight[...], vocab_first=True)

    def load(self, w, name):
        w.fill(self.weight, name)


def fp8_block(quant: Quantization | None, din: int, dout: int) -> tuple[int, int] | None:
    """The (bm, bn) blocks a [din, dout] projection keeps FP8 in, or None (kept plain). A
    checkpoint without `weight_block_size` has one scale per tensor: one block of it all."""
    if quant is None or quant.method != "fp8":
        return None
    return quant.block or (dout, din)


class RMSNorm(nnx.Module):
    """RMS norm in float32 (Gemma: x * (1 + w)); `centered` subtracts the mean first, which
    makes it Cohere's weight-only LayerNorm."""

    def __init__(self, dim: int, eps: float, plus_one: bool = False, centered: bool = False):
        self.weight, self.eps, self.plus_one = param((dim,)), eps, plus_one
        self.centered = centered

    def __call__(self, x):
        return invariant.per_token(self._norm)(x)

    def _norm(self, x):
        x32 = x.astype(jnp.float32)
        if self.centered:
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...] + 1.0 if self.plus_one else self.weight[...]
        return (y * w).astype(x.dtype)

    def load(self, w, name):
        w.fill(self.weight, name)


def norm_of(spec: ModelSpec, dim: int) -> RMSNorm:
    return RMSNorm(dim, spec.eps, spec.norm_plus_one, centered=spec.norm is Norm.LAYER)


def act(kind: Act, x):
    return jax.nn.silu(x) if kind is Act.SILU else jax.nn.gelu(x, approximate=True)


class Attention(nnx.Module):
    def __init__(self, spec: ModelSpec, layer_id: int):
        self.spec, self.layer_id = spec, layer_id
        self.layer = spec.hybrid.layers[layer_id]
        shape = (
            spec.hybrid.swa_attention if self.layer.kind.is_local else spec.hybrid.full_attention
        )
        self.shape = shape
        h, bias, dt, qw = spec.hidden, spec.qkv_bias, spec.dtype, spec.weights
        self.q_proj = Linear(h, shape.num_heads * shape.head_dim, bias, dt, qw)
        self.k_proj = Linear(h, shape.num_kv_heads * shape.head_dim, bias, dt, qw)
        self.v_proj = Linear(h, shape.num_kv_heads * shape.v_head_dim, bias, dt, qw)
        self.o_proj = Linear(shape.num_heads * shape.v_head_dim, h, spec.o_bias, dt, qw)
        # q/k norms per head ("weight") or over the whole projection (Olmo 3: "full").
        q_dim, k_dim = shape.head_dim, shape.head_dim
        if spec.qk_norm is QkNorm.FULL:
            q_dim, k_dim = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        norm = spec.qk_norm in (QkNorm.WEIGHT, QkNorm.FULL)
        self.q_norm = norm_of(spec, q_dim) if norm else None
        self.k_norm = norm_of(spec, k_dim) if norm else None
        self.sinks = param((shape.num_heads,)) if shape.has_sinks else None
        self.g_proj = Linear(h, shape.num_heads, dtype=dt) if spec.attn_gate else None
        # Per-layer K and V scales of an FP8 KV cache, where the checkpoint ships them
        # (`self_attn.k_scale` / `v_scale`); without them an FP8 pool stores K and V as they are.
        self.k_scale = param(()) if spec.kv_scales else None
        self.v_scale = param(()) if spec.kv_scales else None

    def load(self, w, prefix):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(self, name).load(w, f"{prefix}.{name}")
        if self.q_norm is not None:
            self.q_norm.load(w, f"{prefix}.q_norm.weight")
            self.k_norm.load(w, f"{prefix}.k_norm.weight")
        if self.sinks is not None:
            name = "sinks" if self.spec.family == "gpt_oss" else "attention_sink_bias"
            w.fill(self.sinks, f"{prefix}.{name}")
        if self.g_proj is not None:
            self.g_proj.load(w, f"{prefix}.g_proj")
        if self.k_scale is not None:
            w.fill(self.k_scale, f"{prefix}.k_scale", transform=SCALAR)
            w.fill(self.v_scale, f"{prefix}.v_scale", transform=SCALAR)

    def __call__(self, x, positions, pools, meta, mode: AttentionMode, slot=None):
        """`slot`: where this layer's KV lives (`pool.Slot`, its index traced inside a scan
        over layers); by default the pools' slot of `layer_id`."""
        t, s, spec = x.shape[0], self.shape, self.spec
        slot = pools.slot(self.layer_id if slot is None else slot)
        q, k = self.q_proj(x), self.k_proj(x)
        if spec.qk_norm is QkNorm.FULL:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(t, s.num_heads, s.head_dim)
        k = k.reshape(t, s.num_kv_heads, s.head_dim)
        v = self.v_proj(x).reshape(t, s.num_kv_heads, s.v_head_dim) * spec.value_scale
        if spec.qk_norm is QkNorm.WEIGHT:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = spec.ropes[self.layer_id]
        if rope is not None:
            q, k = apply_rope(q, positions, rope), apply_rope(k, positions, rope)
            if spec.qk_norm is QkNorm.L2:  # Llama 4: weightless RMS norm after RoPE
                q, k = unit_rms(q, spec.eps), unit_rms(k, spec.eps)
        elif spec.attn_temperature is not None:  # Llama 4 NoPE layers
            scale, floor = spec.attn_temperature
            tune = jnp.log1p(jnp.floor((positions.astype(jnp.float32) + 1) / floor)) * scale + 1
            q = (q.astype(F32) * tune[:, None, None]).astype(q.dtype)
        scales = None
        if self.k_scale is not None and pools.stacked(slot.is_swa)[0].dtype in pool_lib.FP8:
            scales = (self.k_scale[...], self.v_scale[...])
            k, v = k.astype(F32) / scales[0], v.astype(F32) / scales[1]
        pools = pool_lib.write_kv(pools, slot, k, v, meta.write)
        out = paged_attention(
            q,
            pools,
            slot,
            meta,
            self.layer,
            mode,
            kv_scales=scales,
            scale=spec.scales[self.layer_id],
            sinks=None if self.sinks is None else self.sinks[...],
            soft_cap=spec.attn_soft_cap,
        )
        if self.g_proj is not None:  # Step 3.x: each head's output times sigmoid(g_h(x))
            gate = jax.nn.sigmoid(self.g_proj(x).astype(F32))[:, :, None]
            out = (out.astype(F32) * gate).astype(out.dtype)
        return self.o_proj(out.reshape(t, s.num_heads * s.v_head_dim)), pools


def _scalar(a):
    """A checkpoint's scale stored as a scalar or as [1] (both are published)."""
    return a.reshape(())


SCALAR = Layout(_scalar, lambda a: a)


def unit_rms(x, eps):
    """A weightless RMS norm in float32 (Llama 4's q/k after RoPE, Gemma 4's v norm)."""

    def norm(x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
        return y.astype(x.dtype)

    return invariant.per_token(norm)(x)


def paged_attention(
    q,
    pools,
    where: int | pool_lib.Slot,
    meta,
    layer,
    mode: AttentionMode,
    *,
    kv_scales=None,
    **kwargs,
):
    """`attention` over one layer's pool buffers (`where`: a global layer id, whose KV-shared
    layers read their source's, or a `Slot`), run as `mode` says. `kv_scales` (k, v): the pool
    holds K / k and V / v, so q.K = (q k).(K / k) and the output is v times the attention over
    V / v, exactly."""
    if kv_scales is not None:
        k_scale, v_scale = kv_scales
        q = (q.astype(F32) * k_scale).astype(q.dtype)
        out = paged_attention(q, pools, where, meta, layer, mode, **kwargs)
        return (out.astype(F32) * v_scale).astype(out.dtype)
    slot = pools.slot(where)
    k_pages, v_pages, offset = pools.pages(slot)
    return attention(
        q,
        k_pages,
        v_pages,
        offset_tables(meta, slot.is_swa, offset),
        layer,
        implementation=mode.implementation,
        interpret=mode.interpret,
        mesh=mode.mesh,
        deterministic=mode.deterministic,
        **kwargs,
    )


def offset_tables(meta, is_swa: bool, offset):
    """`meta` with the page table a layer of this sub-pool reads shifted by `offset`: its pages
    in the sub-pool's [layers * pages] view (`KVPools.pages`)."""
    if isinstance(offset, int) and offset == 0:
        return meta
    if is_swa:
        return dataclasses.replace(meta, swa_page_table=meta.swa_page_table + offset)
    return dataclasses.replace(meta, full_page_table=meta.full_page_table + offset)


class DenseMLP(nnx.Module):
    """down(act(gate(x)) * up(x)); `limit` (Step 3.x) clamps act(gate) above and up both ways."""

    def __init__(
        self,
        hidden: int,
        width: int,
        act: str,
        dtype=F32,
        limit: float | None = None,
        quant: Quantization | None = None,
    ):
        self.gate_proj = Linear(hidden, width, dtype=dtype, quant=quant)
        self.up_proj = Linear(hidden, width, dtype=dtype, quant=quant)
        self.down_proj = Linear(width, hidden, dtype=dtype, quant=quant)
        self.act, self.limit = act, limit

    def __call__(self, x):
        gate, up = act(self.act, self.gate_proj(x)), self.up_proj(x)
        if self.limit is not None:
            gate, up = jnp.minimum(gate, self.limit), jnp.clip(up, -self.limit, self.limit)
        return self.down_proj(gate * up)

    def load(self, w, prefix):
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(self, name).load(w, f"{prefix}.{name}")
