"""DeepSeek-V4's KV compressors over the pools (`memory/compressed_pool.py`).

A compressor projects each token to KV and gate vectors and, once a window of `rate` tokens is
complete, pools the window: entry = norm(sum_j softmax_j(gate_j + ape_j) * kv_j), per channel,
then RoPE at the window's first position. HCA windows do not overlap. CSA projects two series
per token (a, b): entry w pools series b of window w with series a of window w - 1 (nothing
before window 0), over 2 * rate slots. The Lightning Indexer runs a CSA compressor of its own
(`index_head_dim` wide) whose entries are the keys it scores queries against.

A step writes every new token's projections (pending) at its SWA slot, then makes the entry of
each window that ends in the batch from the pending rows of its span, read back through the
batch's SWA page table: the tokens of this batch and the ones before it alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from swajax.memory.compressed_pool import CompressedPools
from swajax.models.layers import F32, Linear, RMSNorm, param
from swajax.models.rope import RopeSpec, apply_rope


def rope_tail(x, positions, rope: RopeSpec):
    """RoPE on the last `rope.dim` dims of x [T, heads, D] (DeepSeek-V4 lays heads out as
    [nope | rope]); negative positions rotate back."""
    d = x.shape[-1] - rope.dim
    return jnp.concatenate([x[..., :d], apply_rope(x[..., d:], positions, rope)], axis=-1)


class Compressor(nnx.Module):
    """One compressor: `dim`-wide entries every `rate` tokens, overlapping windows or not."""

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool, eps: float, dtype):
        self.dim, self.rate, self.overlap = dim, rate, overlap
        width = (2 if overlap else 1) * dim
        self.wkv = Linear(hidden, width, dtype=dtype)
        self.wgate = Linear(hidden, width, dtype=dtype)
        self.ape = param((rate, width))
        self.norm = RMSNorm(dim, eps)

    @property
    def pending_width(self) -> int:
        return 2 * self.wkv.kernel.shape[1]

    def load(self, w, prefix: str) -> None:
        self.wkv.load(w, f"{prefix}.wkv")
        self.wgate.load(w, f"{prefix}.wgate")
        w.fill(self.ape, f"{prefix}.ape")
        self.norm.load(w, f"{prefix}.norm.weight")

    def project(self, x):
        """The pending row of each token [T, pending_width]: its KV, then its gate."""
        return jnp.concatenate([self.wkv(x).astype(F32), self.wgate(x).astype(F32)], axis=-1)

    def pool(self, rows, first_pos, rope: RopeSpec):
        """Entries [N, dim] from the pending rows [N, span, pending_width] of N windows (the
        span's last `rate` rows are the window; CSA's first `rate`, the window before it, are
        NaN-free zeros where there is none: `first_pos` < rate), window starts `first_pos`."""
        r, d, width = self.rate, self.dim, self.pending_width // 2
        ape = jnp.tile(self.ape[...], (rows.shape[1] // r, 1))  # each window's slot j: ape[j]
        kv, gate = rows[..., :width], rows[..., width:] + ape
        if self.overlap:  # slots: series a of the window before, series b of this one
            kv = jnp.concatenate([kv[:, :r, :d], kv[:, r:, d:]], axis=1)
            before = jnp.where((first_pos >= r)[:, None, None], gate[:, :r, :d], -jnp.inf)
            gate = jnp.concatenate([before, gate[:, r:, d:]], axis=1)
        weights = jax.nn.softmax(gate, axis=1)
        entry = self.norm(jnp.sum(kv * weights, axis=1))
        return rope_tail(entry[:, None, :], first_pos, rope)[:, 0, :]


def span_slots(meta, rows, span: int):
    """SWA slots of the `span + 1` positions ending at each given token ([N, span + 1]) and
    whether each position exists (>= 0). `rows`: flat token indices into the batch."""
    ps = meta.page_size
    req, pos = meta.token_req[rows], meta.positions[rows]
    p = pos[:, None] - span + jnp.arange(span + 1, dtype=jnp.int32)[None, :]
    col = jnp.maximum(p, 0) // ps - meta.swa_first_page[req][:, None]
    table = meta.swa_page_table
    pages = table[req[:, None], jnp.clip(col, 0, table.shape[1] - 1)]
    return pages * ps + jnp.maximum(p, 0) % ps, p >= 0


def update(
    compressors: list[Compressor], pools: CompressedPools, layer: int, x, meta, rope: RopeSpec
) -> CompressedPools:
    """Write the batch's pending projections of a compressed layer (its compressors side by
    side in one row) and make the entries of the windows that end in it."""
    i = pools.layer(layer)
    rate = pools.rates[i]
    rows = jnp.concatenate([c.project(x) for c in compressors], axis=-1)
    pending = pools.pending[i].at[meta.write.swa].set(rows.astype(pools.pending[i].dtype))
    # The windows ending in this batch: at most one per `rate` tokens, plus one per request.
    t, r = x.shape[0], meta.prefix_lens.shape[0]
    ends = meta.token_valid & ((meta.positions + 1) % rate == 0)
    n = min(t, t // rate + r)
    (end_rows,) = jnp.nonzero(ends, size=n, fill_value=0)
    real = jnp.arange(n) < jnp.sum(ends)
    overlap = compressors[0].overlap
    span = (2 if overlap else 1) * rate - 1
    slots, exists = span_slots(meta, end_rows, span)
    gathered = jnp.where(exists[..., None], pending[slots].astype(F32), 0.0)
    first = meta.positions[end_rows] + 1 - rate
    parts, start = [], 0
    for c in compressors:
        width = c.pending_width
        window = gathered[..., start : start + width]
        if not overlap:
            window = window[:, -rate:]
        parts.append(c.pool(window, first, rope))
        start += width
    entries = jnp.concatenate(parts, axis=-1)
    full = jnp.where(real, meta.write.full[end_rows], 0)
    if meta.write.full_src is not None:  # a tail rebuild keeps the prefix cache's entries
        src = jnp.where(real, meta.write.full_src[end_rows], 0)
        kept = pools.entries[i][pools.entry_slot(i, src)].astype(F32)
        entries = jnp.where((src > 0)[:, None], kept, entries)
    store = pools.entries[i]
    store = store.at[pools.entry_slot(i, full)].set(entries.astype(store.dtype))
    return pools.replace(i, entries=store, pending=pending)
