"""The device programs a step runs (jitted): `fused_step` (commit_step, the model's forward and
sampling in one program), `fused_verify` (a speculative round), `fused_round` (multi-step
decode), and the small ones beside them. `DeviceRunner` (device_runner.py) chooses and calls
them; they hold no bookkeeping of their own."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from swajax.models.multi_step import decode_round
from swajax.models.sampling import seed_penalties
from swajax.models.speculative import verify_round
from swajax.runner.commit import commit_step
from swajax.runner.step_inputs import SEEDS
from swajax.serving.batch import ForwardBatch

_COMMIT = ("layout", "decode", "num_tokens", "meta_shape")  # commit_step's static arguments


@functools.partial(jax.jit, static_argnames=("start", "size"))
def fill_placeholders(packed, prev_tokens, accepted=None, *, start: int, size: int):
    """A step planned while the previous one ran names each not-yet-sampled input token as
    -(1 + its row in the previous step's sampled tokens); fill them in on device, in a program
    of its own, so the step's program (and its numerics) is the one a plain step runs. After a
    multi-step round (`prev_tokens` [R, N], `accepted` [R]) a row's token is its last step's."""
    if accepted is not None:
        prev_tokens = jnp.take_along_axis(prev_tokens, accepted[:, None], axis=1)[:, 0]
    tokens = packed[start : start + size]
    row = jnp.clip(-tokens - 1, 0, prev_tokens.shape[0] - 1)
    return packed.at[start : start + size].set(jnp.where(tokens < 0, prev_tokens[row], tokens))


def _seeded(pen, extra: dict):
    """The penalty counts with a step's seeds loaded (if it carries any)."""
    if SEEDS[0] not in extra:
        return pen
    return seed_penalties(pen, *(extra.pop(name) for name in SEEDS))


@functools.partial(
    jax.jit,
    static_argnames=("forward", "draft", "return_logits", "mode", *_COMMIT),
    donate_argnums=(0, 1, 2, 3, 4),
)
def fused_step(
    alloc,
    r2t,
    pools,
    d_pools,
    pen,
    packed,
    weights,
    d_weights,
    *,
    forward,
    draft,
    return_logits,
    mode,
    **commit,
):
    """commit_step then the model's forward (a static `Forward`) and sampling, traced into one
    program; a speculative draft (`draft`, or None) writes its KV of the same tokens."""
    alloc, r2t, out, meta, extra = commit_step(alloc, r2t, packed, **commit)
    rows = extra.pop("request_rows", None)  # a draft's steps carry their requests' rows
    pen = _seeded(pen, extra)
    batch = ForwardBatch(**extra)
    hidden = getattr(draft, "needs_hidden", False)  # an MTP draft reads the target's hidden states
    pools, pen, sampled, *h = forward(
        weights, pools, batch, meta, return_logits, pen, mode, hidden=hidden
    )
    if hidden:
        args = (d_weights, weights, d_pools, batch.tokens, h[0], meta, r2t, alloc, rows)
        d_pools = draft.extend(*args, commit["meta_shape"])
    elif draft is not None:
        _, d_pools = draft.logits(d_weights, d_pools, batch.tokens, meta, batch.logit_index[:1])
    return alloc, r2t, pools, d_pools, pen, out, sampled


@functools.partial(
    jax.jit,
    static_argnames=("forward", "draft", "k", "draft_shapes", "mode", "return_logits", *_COMMIT),
    donate_argnums=(0, 1, 2, 3, 4),
)
def fused_verify(
    alloc,
    r2t,
    pools,
    d_pools,
    pen,
    packed,
    weights,
    d_weights,
    *,
    forward,
    draft,
    k,
    draft_shapes,
    mode,
    return_logits,
    **commit,
):
    """commit_step (k + 1 positions per decoding request) then a speculative round."""
    alloc, r2t, out, meta, extra = commit_step(alloc, r2t, packed, **commit)
    rows = extra.pop("request_rows")
    pen = _seeded(pen, extra)
    pools, d_pools, pen, verified = verify_round(
        forward,
        draft,
        weights,
        d_weights,
        pools,
        d_pools,
        pen,
        r2t,
        alloc,
        meta,
        ForwardBatch(**extra),
        rows,
        k=k,
        draft_shapes=draft_shapes,
        mode=mode,
        return_logits=return_logits,
    )
    return alloc, r2t, pools, d_pools, pen, out, verified


@functools.partial(
    jax.jit,
    static_argnames=("forward", "draft", "steps", "shape", "mode", *_COMMIT),
    donate_argnums=(0, 1, 2, 3, 4),
)
def fused_round(
    alloc,
    r2t,
    pools,
    d_pools,
    pen,
    packed,
    weights,
    d_weights,
    *,
    forward,
    draft,
    steps,
    shape,
    mode,
    **commit,
):
    """commit_step (up to `steps` positions per decoding request) then those decode steps
    (multi-step decode)."""
    alloc, r2t, out, meta, extra = commit_step(alloc, r2t, packed, **commit)
    rows = extra.pop("request_rows")
    batch = ForwardBatch(**extra)
    pools, decoded = decode_round(
        forward, weights, pools, r2t, alloc, meta, batch, rows, steps=steps, shape=shape, mode=mode
    )
    return alloc, r2t, pools, d_pools, pen, out, decoded


@jax.jit
def seed_only(pen, reset_rows, rows, tokens, is_output):
    return seed_penalties(pen, reset_rows, rows, tokens, is_output)
