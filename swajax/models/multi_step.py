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
pages holding only positions after it back (`Scheduler._take_round`, which a verify
round with every proposal accepted shares): a request that stops early costs the steps it
computed past its stop, never a token. The loop's trip count is the round's longest request,
on device; N (the setting, `Scheduler._decode_lens`) only sizes the outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from swajax.attention.metadata import metadata_core, metadata_shape


def decode_round(forward, params, pools, r2t, alloc, meta, batch, rows, *, steps: int, shape, mode):
    """Up to `steps` decode steps (traced inside the runner's jit), as a `fori_loop` over one
    step's body: compiled once whatever the steps. Request r takes n_r = seq_r - prefix_r of
    them (its flat tokens, n_r of them from offset sum(n_<r), start with its pending token; its
    sampling fields are entry r). At step j the requests with j < n_r are the batch, compacted
    into the first rows as a plain step's requests are. Returns (pools, (tokens i32[R, steps],
    logprobs f32[R, steps], accepted i32[R] = n_r - 1: every step a request took is kept, the
    host cuts at stops))."""
    prefix, n_rows, s = meta.prefix_lens, rows.shape[0], shape.num_tokens
    n = meta.seq_lens - prefix  # steps of each request (0: a padding row)
    start = jnp.cumsum(n) - n
    index0 = jnp.arange(s, dtype=jnp.int32)

    def step(j, carry):
        pools, current, tokens, logprobs = carry
        active = (j < n).astype(jnp.int32)
        pre = prefix + jnp.minimum(j, n)
        m = metadata_core(r2t, alloc, rows, pre, pre + active, shape)
        live = jnp.sum(active)
        flat = jnp.cumsum(active) - 1  # each active request's row in the step
        (order,) = jnp.nonzero(active, size=s, fill_value=0)  # the request of each row
        index = jnp.where(index0 < live, index0, 0)  # padding rows read row 0, as a plain step's
        fields = {name: getattr(batch, name)[order] for name in batch._fields[3:]}
        fields["sample_positions"] = fields["sample_positions"] + j
        one = type(batch)(
            tokens=jnp.where(index < live, current[order], 0),
            logit_index=index,
            sample_index=index,
            **fields,
        )
        pools, _, sampled = forward(params, pools, one, m, False, None, mode)
        mine, on = jnp.clip(flat, 0, s - 1), active > 0
        current = jnp.where(on, sampled.tokens[mine], current)
        tokens = tokens.at[:, j].set(current)
        logprobs = logprobs.at[:, j].set(jnp.where(on, sampled.logprobs[mine], 0.0))
        return pools, current, tokens, logprobs

    current = jnp.take(batch.tokens, start, mode="clip")  # each request's pending token
    carry = (
        pools,
        current,
        jnp.zeros((n_rows, steps), jnp.int32),
        jnp.zeros((n_rows, steps), jnp.float32),
    )
    pools, _, tokens, logprobs = jax.lax.fori_loop(0, jnp.max(n), step, carry)
    accepted = jnp.maximum(n - 1, 0).astype(jnp.int32)
    return pools, (tokens, logprobs, accepted)


def round_shape(prefix_lens, seq_lens, *, page_size: int, window: int, min_tokens: int):
    """One metadata shape for every single-token forward of a round: a plain decode step's at
    the round's last lengths, which covers every step before it (so a round's program depends
    on N and this shape only, not on when each request sits out: few programs)."""
    return metadata_shape(
        seq_lens - 1, seq_lens, page_size=page_size, window=window, min_tokens=min_tokens
    )
