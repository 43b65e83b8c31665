"""Multi-step decode's device half: N decode steps of the target in one program, read once.

After `commit_step` has allocated N positions [p, p + N - 1] for every decoding request (an
extend: the pages of all N tokens are taken up front, so nothing inside the loop can run out),
the target runs N single-token forwards, each sampling the token the next one reads, as N plain
decode steps would: the same sampling fields and draw keys (the position of the token drawn),
the requests still taking steps compacted into the first rows. One metadata shape serves every
step (a plain step's at the round's last lengths), so a round's program depends on N and that
shape, not on when each request sits out; the tokens are those of N = 1, the logprobs too to
float rounding (a step whose shape buckets differ from a plain step's reduces over a few more
masked keys; on the fixtures they are bit-identical).

The host keeps each request's tokens up to its first stop token or length limit and gives the
pages holding only positions after it back (`serving.speculation.take_round`, which a verify
round with every proposal accepted shares): a request that stops early costs the steps it
computed past its stop, never a token. The loop is unrolled (each step's metadata shape is
static and may differ), so N is kept small and a power of two (`Scheduler._decode_steps`).
"""

from __future__ import annotations

import jax.numpy as jnp

from swajax.attention.metadata import metadata_core, metadata_shape


def decode_round(forward, params, pools, r2t, alloc, meta, batch, rows, *, shapes, mode):
    """N = len(shapes) decode steps (traced inside the runner's jit). Request r takes
    n_r = seq_r - prefix_r <= N of them (its flat tokens, n_r of them from offset
    sum(n_<r), start with its pending token; its sampling fields are entry r). At step j the
    requests with j < n_r are the batch, compacted into the first rows as a plain step's
    requests are. Returns (pools, (tokens i32[R, N], logprobs f32[R, N], accepted i32[R] =
    n_r - 1: every step a request took is kept, the host cuts at stops))."""
    prefix = meta.prefix_lens
    n = meta.seq_lens - prefix  # steps of each request (0: a padding row)
    start = jnp.cumsum(n) - n
    current = jnp.take(batch.tokens, start, mode="clip")  # each request's pending token
    tokens, logprobs = [], []
    for j, shape in enumerate(shapes):
        active = (j < n).astype(jnp.int32)
        pre = prefix + jnp.minimum(j, n)
        m = metadata_core(r2t, alloc, rows, pre, pre + active, shape)
        s = shape.num_tokens
        live = jnp.sum(active)
        flat = jnp.cumsum(active) - 1  # each active request's row in the step
        (order,) = jnp.nonzero(active, size=s, fill_value=0)  # the request of each row
        index = jnp.arange(s, dtype=jnp.int32)
        index = jnp.where(index < live, index, 0)  # padding rows read row 0, as a plain step's
        fields = {name: getattr(batch, name)[order] for name in batch._fields[3:]}
        fields["sample_positions"] = fields["sample_positions"] + j
        step = type(batch)(tokens=jnp.where(index < live, current[order], 0),
                           logit_index=index, sample_index=index, **fields)  # fmt: skip
        pools, _, sampled = forward(params, pools, step, m, False, None, mode)
        mine = jnp.clip(flat, 0, s - 1)
        current = jnp.where(active > 0, sampled.tokens[mine], current)
        tokens.append(current)
        logprobs.append(jnp.where(active > 0, sampled.logprobs[mine], 0.0))
    accepted = jnp.maximum(n - 1, 0).astype(jnp.int32)
    return pools, (jnp.stack(tokens, 1), jnp.stack(logprobs, 1), accepted)


def round_shape(prefix_lens, seq_lens, *, page_size: int, window: int, min_tokens: int):
    """One metadata shape for every single-token forward of a round: a plain decode step's at
    the round's last lengths, which covers every step before it (so a round's program depends
    on N and this shape only, not on when each request sits out: few programs)."""
    return metadata_shape(seq_lens - 1, seq_lens, page_size=page_size, window=window,
                          min_tokens=min_tokens)  # fmt: skip
