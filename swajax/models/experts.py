"""Mixture-of-experts feed-forward over stacked expert weights: routed, and the dense reference.

An expert is h = x W1[e] (+ b1[e]), a = act(h), out = a W2[e] (+ b2[e]). A router gives each
token k (expert, input scale, output weight) choices; the block's output is
sum_j weight_j * expert_{e_j}(x * scale_j).

`routed` runs each token through its k experts only (a padding row of the batch through none:
`Routing.valid`). The (token, choice) pairs are sorted by expert and each expert's group is
padded to a multiple of a block of rows, so every block of the padded layout belongs to one
expert. On GPU / TPU the two grouped matmuls are `lax.ragged_dot` over the padded groups; on CPU,
where `ragged_dot` falls back to a dense masked product slower than running every expert, and
for quantized experts, a loop over the blocks in use does all of a block's work (gather, two
[block, K] x [K, N] products reading the expert's weights a cache-sized chunk at a time, biases,
activation). On CPU a block of a few rows multiplies an MXFP4 expert in a kernel that reads the
packed blocks where it multiplies them (`swajax.kernels.mxfp4_cpu`; `KERNEL_ROWS`). `dense`
runs every expert on every token and weighs the unselected ones 0: the test oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from swajax import platform
from swajax.arith import ceil_div, round_up
from swajax.kernels import mxfp4_cpu
from swajax.models import invariant, quantized, tensor_split
from swajax.models.layers import unhoisted

HIGHEST = jax.lax.Precision.HIGHEST
F32 = jnp.float32


class Experts(NamedTuple):
    """Plain arrays, or `quantized` weights (dequantized one expert at a time when routed).
    With `copy`, w1 and w2 hold every copy of a `LayerStack` [C, E, ...] and these experts are
    copy `copy`'s (`layers.ExpertWeight`): the routed loop reads them out of the whole stack."""

    w1: jax.Array  # [E, H, F]
    b1: jax.Array | None  # [E, F]
    w2: jax.Array  # [E, F', H]
    b2: jax.Array | None  # [E, H]
    copy: jax.Array | None = None

    @property
    def count(self) -> int:
        return self.w1.shape[0 if self.copy is None else 1]

    def alone(self) -> Experts:
        """These experts without the other copies (a copy of their weights: only for the
        computations that read every expert whole)."""
        if self.copy is None:
            return self
        return self._replace(w1=self.w1[self.copy], w2=self.w2[self.copy], copy=None)


class Routing(NamedTuple):
    experts: jax.Array  # [T, k] int32
    scale: jax.Array | None  # [T, k]: the expert's input is x * scale (Llama 4), else None
    weight: jax.Array  # [T, k]: the expert's output weight
    # [T] bool: False for a padding row, which `routed` runs through no expert (its output is
    # 0, as `dense` weighs it). A batch padded to its bucket (a decode step of one request
    # runs eight rows) would otherwise run its padding rows' experts too: identical rows, so
    # up to k more experts a layer, each read whole (gpt-oss-20b at batch 1: twice the
    # experts' work).
    valid: jax.Array | None = None


def rows_in_use(token_valid):
    """What a layer passes its MoE as `Routing.valid`: the batch's padding mask, or None in
    batch-invariant mode, whose MLPs run a tile of rows at a time (`invariant.per_token`)."""
    return None if invariant.on() else token_valid


def dense(x, routing: Routing, experts: Experts, act: Callable) -> jax.Array:
    """Every expert on every token, unselected weighing 0 (reference). Its products' shapes
    follow the token count, so batch-invariant mode runs `routed` instead."""
    if invariant.on():
        return routed(x, routing, experts, act)
    experts = experts.alone()
    t, e = x.shape[0], experts.count
    rows = jnp.arange(t)[:, None]
    weight = jnp.zeros((t, e), F32).at[rows, routing.experts].set(routing.weight)
    if routing.valid is not None:  # a padding row weighs every expert 0, as `routed` runs none
        weight = jnp.where(routing.valid[:, None], weight, 0.0)
    xin = jnp.broadcast_to(x[:, None, :].astype(F32), (t, e, x.shape[-1]))
    if routing.scale is not None:
        scale = jnp.zeros((t, e), F32).at[rows, routing.experts].set(routing.scale)
        xin = xin * scale[:, :, None]
    w1, w2 = quantized.dense(experts.w1), quantized.dense(experts.w2)
    h = jnp.einsum("teh,ehf->tef", xin, w1.astype(F32), precision=HIGHEST)
    h = h + experts.b1.astype(F32) if experts.b1 is not None else h
    out = jnp.einsum("tef,efh->teh", act(h), w2.astype(F32), precision=HIGHEST)
    out = out + experts.b2.astype(F32) if experts.b2 is not None else out
    return jnp.einsum("te,teh->th", weight, out, precision=HIGHEST).astype(x.dtype)


def block_rows(pairs: int, num_experts: int) -> int:
    """Rows per block: 1.25x an expert's fair share of the pairs, a multiple of 8 in [8, 128].

    A block costs about one read of its expert's weights however few rows it has, so most
    experts should fit in one block; the 1.25 covers the usual imbalance (measured with
    benchmarks/moe.py: 40 rows beat 32 and 64 at 1,024 pairs over 32 experts)."""
    share = ceil_div(pairs * 5, 4 * num_experts)
    return int(min(128, max(8, round_up(share, 8))))


class _Layout(NamedTuple):
    slot: jax.Array  # [T*k]: each pair's row in the padded layout
    token: jax.Array  # [S]: each padded row's token (T: a zero row)
    scale: jax.Array  # [S]: each padded row's input scale
    expert: jax.Array  # [S // block]: each block's expert
    sizes: jax.Array  # [E]: padded group sizes
    used: jax.Array  # number of blocks in use


def _layout(routing: Routing, num_tokens: int, num_experts: int, block: int) -> _Layout:
    k = routing.experts.shape[1]
    pairs = num_tokens * k
    flat = routing.experts.reshape(-1).astype(jnp.int32)
    if routing.valid is not None:  # a padding row's choices: no expert (`num_experts`)
        flat = jnp.where(jnp.repeat(routing.valid, k), flat, num_experts)
    order = jnp.argsort(flat, stable=True)
    sorted_e = flat[order]
    counts = jnp.zeros(num_experts, jnp.int32).at[flat].add(1, mode="drop")
    padded = (counts + block - 1) // block * block
    start = jnp.cumsum(counts) - counts
    pstart = jnp.cumsum(padded) - padded
    blocks = ceil_div(pairs + num_experts * (block - 1), block)
    size = blocks * block
    # A pair of no expert gets the row past the end: its writes dropped, its read 0 (`routed`).
    e = jnp.minimum(sorted_e, num_experts - 1)
    slot_sorted = pstart[e] + jnp.arange(pairs, dtype=jnp.int32) - start[e]
    slot_sorted = jnp.where(sorted_e < num_experts, slot_sorted, size)
    slot = jnp.zeros(pairs, jnp.int32).at[order].set(slot_sorted)
    token = jnp.full(size, num_tokens, jnp.int32)
    token = token.at[slot].set(jnp.arange(pairs, dtype=jnp.int32) // k, mode="drop")
    scale = jnp.ones((pairs,), F32) if routing.scale is None else routing.scale.reshape(-1)
    scale = jnp.zeros(size, F32).at[slot].set(scale.astype(F32), mode="drop")
    ends = jnp.cumsum(padded)
    starts = jnp.arange(blocks, dtype=jnp.int32) * block
    expert = jnp.minimum(jnp.searchsorted(ends, starts, side="right"), num_experts - 1)
    return _Layout(slot, token, scale, expert.astype(jnp.int32), padded, ends[-1] // block)


# XLA:CPU copies a dynamically indexed slice of the stacked weights into a buffer of its own
# before a product reads it. Copied whole, an expert (66 MB for gpt-oss-20b's w1) goes through
# memory three times; copied and multiplied a chunk at a time, each copy is read back from the
# last-level cache (benchmarks/moe.py --bound: 0.27 -> 0.21 s for that projection); an MXFP4
# w2 is dequantized a chunk of outputs at a time for the same reason. Chunks run along the
# hidden axis (w1's inputs, w2's outputs), which tensor parallelism never splits: a dynamic
# slice of a split axis would gather it from every device. An MXFP4 w1, which has no chunks of
# inputs, runs in chunks of its outputs only where they are not split (`tensor_split`).
# Only on CPU.
CHUNK_BYTES = 8 << 20


def k_rows(k: int, n: int, itemsize: int) -> int:
    """Rows of a [K, N] weight read per product: as many as fit CHUNK_BYTES (at least 8)."""
    return int(min(k, max(8, CHUNK_BYTES // (n * itemsize))))


def _in_chunks(count: int, size: int, fn, carry):
    """carry = fn(start, n, carry) over [0, count) in pieces of `size`, the last one shorter."""
    full = count // size
    carry = jax.lax.fori_loop(0, full, lambda c, carry: fn(c * size, size, carry), carry)
    return fn(full * size, count - full * size, carry) if count % size else carry


# Blocks of at most this many rows multiply an MXFP4 expert through the CPU kernel: every decode
# step up to about 50 sequences (`block_rows` gives 8 until then). Larger blocks (prefill, big
# batches) decode the expert for XLA's product, which reads the decoded chunk once for all the
# rows; the kernel's cost grows with its rows and passes XLA's between 8 and 16 (at gpt-oss-20b's
# widths: 4x faster at one row; benchmarks/README.md, "MXFP4 experts").
KERNEL_ROWS = 8


def _kernel(rows, w) -> bool:
    """`rows` x `w` runs in the MXFP4 CPU kernel (`swajax.kernels.mxfp4_cpu`)."""
    return (
        isinstance(w, quantized.Mxfp4)
        and platform.is_cpu()
        and not tensor_split.on()  # the kernel reads a whole stack held on one device
        and rows.shape[0] <= KERNEL_ROWS
        and mxfp4_cpu.available()
    )


def expert_product(rows, w, e, along: str | None = "in", copy=None, live=None):
    """rows [block, K] x w[e] [K, N] in float32, w read (or dequantized) a chunk of its inputs
    (`along` "in") or of its outputs ("out") at a time; whole when one chunk holds it or
    `along` is None. With `copy`, w is a stack of copies [C, E, K, N] and w[copy, e] is read.
    With `live` (the block's rows in use come first), the rows past it may come out as 0."""
    lead = (e,) if copy is None else (copy, e)
    k, n = w.shape[len(lead) :]
    if live is not None and _kernel(rows, w):  # read from the stack where it is multiplied
        return mxfp4_cpu.mxfp4_rows(rows, w.blocks, w.scales, jnp.stack(lead), live)
    mxfp4 = isinstance(w, quantized.Mxfp4)
    # Quantized weights are chunked only over MXFP4 outputs: its inputs come in blocks of 32
    # whose slices are strided gathers (slower than dequantizing the expert whole, measured).
    chunkable = not quantized.is_quantized(w) or (mxfp4 and along == "out")
    length, across = (k, n) if along == "in" else (n, k)
    size = k_rows(length, across, jnp.dtype(w.dtype).itemsize) if chunkable else length
    if along is None or size >= length:
        if not quantized.is_quantized(w):  # widened (on CPU) an expert at a time, not whole
            w, lead = unhoisted(w, lead)
        return quantized.matmul(rows, w[lead])  # quantized: this expert alone dequantized

    def piece(start, size):
        if mxfp4:
            return w.outputs(lead, start, size)
        shape, at = ((size, n), (start, 0)) if along == "in" else ((k, size), (0, start))
        ones = (1,) * len(lead)
        # Tied to the chunk and the expert: XLA:CPU would otherwise widen a low-precision stack
        # whole, ahead of the loops (all of Llama 4 Scout's experts of a layer: 7.5 GiB of
        # float32). The last, shorter chunk's start is a constant, so the expert is what varies
        # there (tied to its start alone, gpt-oss-20b's bfloat16 experts held 3 GiB, 0.7 s).
        whole, (start, at_lead) = unhoisted(w, (jnp.asarray(start, jnp.int32), lead))
        at = (start, 0) if along == "in" else (0, start)
        return jax.lax.dynamic_slice(whole, (*at_lead, *at), (*ones, *shape)).reshape(shape)

    def over_inputs(start, size, acc):
        part = jax.lax.dynamic_slice_in_dim(rows, start, size, 1)
        return acc + quantized.matmul(part, piece(start, size))

    def over_outputs(start, size, acc):
        y = quantized.matmul(rows, piece(start, size))
        return jax.lax.dynamic_update_slice_in_dim(acc, y, start, 1)

    acc = jnp.zeros((rows.shape[0], n), F32)
    return _in_chunks(length, size, over_inputs if along == "in" else over_outputs, acc)


def _method(w, method: str) -> str:
    """ "loop" or "ragged" for `method` "auto": quantized experts loop too (ragged_dot would
    dequantize them all), and on CPU everything does (its ragged_dot is a dense masked
    product slower than running every expert)."""
    if method == "auto":
        return "loop" if platform.is_cpu() or quantized.is_quantized(w) else "ragged"
    return method


def _block_loop(xz, layout: _Layout, experts: Experts, act: Callable, block: int, along: str):
    """Each block in use through its expert: its rows gathered, both products, the biases and
    the activation, one block at a time. Only the blocks in use cost anything: the padded
    layout has room for every expert's last partial block (256 rows for gpt-oss-20b's eight
    rows of a decode step, 4 in use at batch 1), and gathering, adding biases and activating
    all of it cost a tenth of a decode step there. `along`: how w1 is read on CPU
    (`expert_product`); elsewhere each expert whole."""
    w1, w2, copy = experts.w1, experts.w2, experts.copy
    cpu = platform.is_cpu()
    out = jnp.zeros((layout.token.shape[0], w2.shape[-1]), F32)
    absent = xz.shape[0] - 1  # the zero row, which the padding rows of the layout read

    def body(b, out):
        token = jax.lax.dynamic_slice_in_dim(layout.token, b * block, block)
        scale = jax.lax.dynamic_slice_in_dim(layout.scale, b * block, block)
        e = layout.expert[b]
        live = jnp.sum(token < absent, dtype=jnp.int32)  # a group's rows come first in a block
        rows = (xz[token] * scale[:, None]).astype(w1.dtype)
        h = expert_product(rows, w1, e, along if cpu else None, copy, live)
        h = h + experts.b1[e].astype(F32) if experts.b1 is not None else h
        y = expert_product(act(h).astype(w2.dtype), w2, e, "out" if cpu else None, copy, live)
        y = y + experts.b2[e].astype(F32) if experts.b2 is not None else y
        return jax.lax.dynamic_update_slice_in_dim(out, y, b * block, 0)

    return jax.lax.fori_loop(0, layout.used, body, out)


def _ragged(xz, layout: _Layout, experts: Experts, act: Callable, block: int):
    """Both products as `lax.ragged_dot` over the padded groups (GPU / TPU)."""
    rows = xz[layout.token] * layout.scale[:, None]
    expert_of_row = jnp.repeat(layout.expert, block, total_repeat_length=rows.shape[0])

    def grouped(lhs, w):
        w = quantized.dense(w if experts.copy is None else w[experts.copy])
        lhs = lhs.astype(w.dtype)
        return jax.lax.ragged_dot(
            lhs, w, layout.sizes, precision=quantized.precision(w.dtype), preferred_element_type=F32
        )

    h = grouped(rows, experts.w1)
    h = h + experts.b1.astype(F32)[expert_of_row] if experts.b1 is not None else h
    out = grouped(act(h), experts.w2)
    return out + experts.b2.astype(F32)[expert_of_row] if experts.b2 is not None else out


def routed(
    x, routing: Routing, experts: Experts, act: Callable, *, block=None, method: str = "auto"
):
    """Each token through its own k experts only (`method`: auto | loop | ragged). In
    batch-invariant mode every block has ROW_TILE rows and runs the loop: one product shape."""
    t, e = x.shape[0], experts.count
    k = routing.experts.shape[1]
    if invariant.on():
        block, method = invariant.ROW_TILE, "loop"
    block = block or block_rows(t * k, e)
    layout = _layout(routing, t, e, block)
    xz = jnp.concatenate([x.astype(F32), jnp.zeros((1, x.shape[-1]), F32)])
    if _method(experts.w1, method) == "ragged":
        out = _ragged(xz, layout, experts, act, block)
    else:
        # w1's chunks run along the hidden axis; an MXFP4 w1 has none there (see
        # `expert_product`), so it runs in chunks of its outputs where they are not split over
        # devices: decoded a cache-sized chunk at a time (one token's block at gpt-oss-20b's
        # shapes, bfloat16: 0.031 -> 0.018 s; benchmarks/README.md, "Routed experts, float and
        # MXFP4").
        mxfp4 = isinstance(experts.w1, quantized.Mxfp4)
        along = "out" if mxfp4 and not tensor_split.on() else "in"
        out = _block_loop(xz, layout, experts, act, block, along)
    picked = out.at[layout.slot].get(mode="fill", fill_value=0).reshape(t, k, -1)
    weight = routing.weight.astype(F32)
    if invariant.on():  # the choices added in order, elementwise: no product over k
        y = sum(weight[:, j, None] * picked[:, j] for j in range(k))
    else:
        y = jnp.einsum("tk,tkh->th", weight, picked, precision=HIGHEST)
    return y.astype(x.dtype)
