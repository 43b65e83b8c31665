"""`req_to_token`: the full-pool slot of every position of every running request (device state).

It only ever holds full slots; SWA slots are derived through the allocator's mapping.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from swajax.arith import bucket
from swajax.memory.padding import pad, token_positions
from swajax.memory.zeros import zeros


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReqToToken:
    table: jax.Array  # i32[max_running_requests, max_context_len]; 0 = no slot

    @staticmethod
    def init(max_requests: int, max_context: int) -> ReqToToken:
        if max_requests < 1 or max_context < 1:
            raise ValueError(
                f"req_to_token needs max_requests >= 1 and max_context >= 1, "
                f"got {max_requests} x {max_context}"
            )
        (table,) = zeros(((max_requests, max_context), "int32"))
        return ReqToToken(table)

    @property
    def max_context(self) -> int:
        return self.table.shape[1]


@functools.partial(jax.jit, donate_argnums=0)
def _write(r2t, req_rows, prefix_lens, seq_lens, slots):
    req, pos, valid = token_positions(prefix_lens, seq_lens, slots.shape[0])
    rows = jnp.where(valid, req_rows[req], r2t.table.shape[0])  # padding falls off the table
    return ReqToToken(r2t.table.at[rows, pos].set(slots, mode="drop"))


def write(r2t: ReqToToken, req_rows, prefix_lens, seq_lens, slots) -> ReqToToken:
    """Store `slots` (flattened, request after request, as alloc_extend returns them).

    Request i fills positions [prefix_lens[i], seq_lens[i]) of row req_rows[i]. `slots` may be
    padded past the real tokens (alloc results are); `req_rows` etc. are host lists or arrays.
    """
    pre, seq = np.asarray(prefix_lens, np.int32), np.asarray(seq_lens, np.int32)
    if np.any(seq > r2t.max_context):
        raise ValueError(f"sequence length {int(seq.max())} exceeds max_context {r2t.max_context}")
    n = bucket(len(pre), 8)
    return _write(r2t, pad(req_rows, n), pad(pre, n), pad(seq, n), jnp.asarray(slots, jnp.int32))


@jax.jit
def last_loc(r2t: ReqToToken, req_rows: jax.Array, lengths: jax.Array) -> jax.Array:
    """Slot of token lengths[i] - 1 of row req_rows[i], or -1 for an empty prefix."""
    slot = r2t.table[req_rows, jnp.maximum(lengths - 1, 0)]
    return jnp.where(lengths > 0, slot, -1)
