"""`commit_step`: a step's whole memory update in one jitted call.

In order: the deferred releases (SWA frees, then full frees), the allocation (extend or decode,
both pools checked), the `req_to_token` writes (re-pointed prefix ranges, then the new tail
only: never a whole row), and the attention metadata of the batch. It returns the new states and
one small int32 vector (status, both pools' free counts, new slots), which the host reads
together with the sampled tokens: one device->host read per step. Its inputs arrive packed in
one int32 buffer (`runner.packing`): one upload per step.

On a failed allocation (`status != OK`, which the host's free-count mirror should make
impossible) the allocator is unchanged and no tail slot is written, so the step's forward only
touches the dummy page; the host reports the failure.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from swajax.attention.metadata import MetadataShape, metadata_core
from swajax.memory import allocator as A
from swajax.memory.padding import token_positions
from swajax.memory.req_to_token import ReqToToken
from swajax.memory.step_codes import FREE_FULL, FREE_SWA, LAST_LOC_ON_DEVICE, REPOINT
from swajax.runner.packing import Layout, unpack


class StepInputs(NamedTuple):
    """A step's memory inputs, padded to buckets by the runner.

    Releases and re-pointed `req_to_token` entries travel as one list of *edits*, so that a
    step's program depends on one bucketed size for all of them, not one per kind.
    """

    rows: jax.Array  # i32[R]: req_to_token row of each request
    prefix_lens: jax.Array  # i32[R]: tokens the request held before this step
    seq_lens: jax.Array  # i32[R]: after it (= prefix for padding)
    last_loc: jax.Array  # i32[R]: full slot of token prefix - 1, -1, or LAST_LOC_ON_DEVICE
    num_reqs: jax.Array  # i32[]: real requests
    edit_kind: jax.Array  # i32[E]: FREE_SWA, FREE_FULL, REPOINT or 0
    edit_slot: jax.Array  # i32[E]: the full slot released, or written
    edit_row: jax.Array  # i32[E]: REPOINT: the row and position written
    edit_pos: jax.Array  # i32[E]


def write_tail(table, x: StepInputs, slots, ok, *, decode: bool):
    """Store the new tokens' slots at positions [prefix, seq) of each row (nothing if not ok)."""
    drop = table.shape[0]  # an out-of-range row: the write is dropped
    if decode:
        valid = (jnp.arange(x.rows.shape[0]) < x.num_reqs) & ok
        target = jnp.where(valid, x.rows, drop)
        return table.at[target, jnp.maximum(x.seq_lens - 1, 0)].set(slots, mode="drop")
    req, pos, valid = token_positions(x.prefix_lens, x.seq_lens, slots.shape[0])
    target = jnp.where(valid & ok, x.rows[req], drop)
    return table.at[target, pos].set(slots, mode="drop")


@functools.partial(
    jax.jit,
    static_argnames=("layout", "decode", "num_tokens", "meta_shape"),
    donate_argnums=(0, 1),
)
def commit_step(
    alloc: A.AllocatorState,
    r2t: ReqToToken | None,
    packed: jax.Array,
    *,
    layout: Layout,
    decode: bool,
    num_tokens: int,
    meta_shape: MetadataShape | None,
):
    """Apply a step's memory changes.

    `packed` holds the `StepInputs` fields and any other arrays of the step (the model's
    inputs), packed by `runner.packing`. Returns (alloc, r2t, output vector, metadata or None,
    the other arrays, unpacked). `num_tokens` is the padded token count of an extend's
    allocation (ignored for decode). Without `r2t` (a model that reads no KV) only the
    allocator is updated.
    """
    arrays = unpack(packed, layout)
    x = StepInputs(**{name: arrays.pop(name) for name in StepInputs._fields})
    full_src = arrays.pop("full_src", None)  # only in a step that rebuilds an SWA tail
    kind = x.edit_kind
    full = jnp.where(kind == FREE_FULL, x.edit_slot, 0)
    alloc = A.release_core(alloc, jnp.where(kind == FREE_SWA, x.edit_slot, 0), full)
    last_loc, table = x.last_loc, None
    if r2t is not None:
        row = jnp.where(kind == REPOINT, x.edit_row, r2t.table.shape[0])
        table = r2t.table.at[row, x.edit_pos].set(x.edit_slot, mode="drop")
        on_device = table[x.rows, jnp.maximum(x.prefix_lens - 1, 0)]
        last_loc = jnp.where(last_loc == LAST_LOC_ON_DEVICE, on_device, last_loc)
    if decode:
        alloc, result = A.alloc_decode_core(alloc, x.seq_lens, last_loc, x.num_reqs)
    else:
        alloc, result = A.alloc_extend_core(alloc, x.prefix_lens, x.seq_lens, last_loc, num_tokens)
    ok = result.status == A.OK
    meta = None
    if r2t is not None:
        r2t = ReqToToken(write_tail(table, x, result.full_slots, ok, decode=decode))
        if meta_shape is not None:
            meta = metadata_core(
                r2t, alloc, x.rows, x.prefix_lens, x.seq_lens, meta_shape, full_src=full_src
            )
    avail = A.available(alloc)
    head = jnp.stack([result.status, avail.full, avail.swa]).astype(jnp.int32)
    return alloc, r2t, jnp.concatenate([head, result.full_slots]), meta, arrays


@functools.partial(jax.jit, donate_argnums=0)
def apply_releases(alloc, free_swa, free_full, move_dst, move_src):
    """Releases that must precede a move (or a move itself), outside a step's commit."""
    alloc = A.release_core(alloc, free_swa, free_full)
    return A.move_swa_core(alloc, move_dst, move_src)


@functools.partial(jax.jit, donate_argnums=0)
def repoint(r2t: ReqToToken, rows, positions, slots):
    """Re-pointed `req_to_token` entries a step could not carry (a server's fixed shapes),
    written before it: the same writes as the step's own (rows past the table: dropped)."""
    return ReqToToken(r2t.table.at[rows, positions].set(slots, mode="drop"))
