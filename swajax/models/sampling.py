"""Token sampling inside the step's jit: the request's token rules (`token_rules.py`: logit bias,
allowed and banned tokens, bad words, min_tokens), penalties, then greedy or temperature /
top-k / top-p / min-p sampling keyed by (seed, position).

The order and each rule are transformers' (`RepetitionPenaltyLogitsProcessor`, then the
`Temperature`, `TopK`, `TopP` and `MinP` warpers, in the order `generate` chains them), with
OpenAI's presence and frequency penalties beside the repetition penalty (vLLM's definition);
`tests/models/test_sampling.py` checks each against transformers' processors on the same logits.

Keying each draw by the request's seed and the position makes generation reproducible across
batching and retraction: a recomputed request draws exactly the tokens it drew before.

The penalties need each request's token counts: `Penalties` keeps them on the device, one row per
`req_to_token` row, seeded once when a request is admitted (its prompt and any output it already
had) and counted up by every sampled token inside the step, so nothing is re-uploaded per step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from swajax.models.token_rules import apply_rules

F32 = jnp.float32


class SampleMode(NamedTuple):
    """The static part of a step's sampling (part of the program's identity)."""

    penalize: bool = False  # some sampled request has a penalty: read and count its tokens
    top_logprobs: int = 0  # N > 0: the N most likely tokens' logprobs of every sampled row
    # Some row may have temperature > 0: the vocabulary sort and the draw are compiled in (a
    # fifth of a decode step's kernels, behind a runtime test of the batch). False: every row
    # is greedy, which the caller guarantees (the engine knows each request's temperature).
    draw: bool = True
    # Some sampled request has token rules (logit bias, allowed / banned tokens, bad words,
    # min_tokens): the batch's rule arrays are read (compiled in only then).
    rules: bool = False


class Penalties(NamedTuple):
    """Per-`req_to_token`-row token counts (device state, allocated when first needed)."""

    output: jax.Array  # i32[rows, V]: occurrences in the output
    prompt: jax.Array  # bool[rows, V]: occurs in the prompt


class Sampled(NamedTuple):
    """What a step samples (device arrays; `logits` and the top-N only when asked for)."""

    tokens: jax.Array  # i32[S]
    logprobs: jax.Array  # f32[S]: of the sampled token under the raw distribution
    logits: jax.Array | None = None  # f32[K, V]: every logit row (teacher forcing)
    top_ids: jax.Array | None = None  # i32[S, N]
    top_logprobs: jax.Array | None = None  # f32[S, N]


def init_penalties(rows: int, vocab: int) -> Penalties:
    return Penalties(jnp.zeros((rows, vocab), jnp.int32), jnp.zeros((rows, vocab), bool))


def seed_penalties(pen: Penalties, reset_rows, rows, tokens, is_output) -> Penalties:
    """Clear `reset_rows`, then count (row, token) pairs: output tokens into `output`, the rest
    into `prompt`. Out-of-range rows (padding) are dropped."""
    drop = pen.output.shape[0]
    output = pen.output.at[reset_rows].set(0, mode="drop")
    prompt = pen.prompt.at[reset_rows].set(False, mode="drop")
    output = output.at[jnp.where(is_output > 0, rows, drop), tokens].add(1, mode="drop")
    prompt = prompt.at[jnp.where(is_output > 0, drop, rows), tokens].set(True, mode="drop")
    return Penalties(output, prompt)


def penalize(logits, pen: Penalties, rows, repetition, presence, frequency, extra=None):
    """Logits [S, V] with each row's penalties applied: repetition (transformers': a logit of a
    token seen in the prompt or output is divided by the penalty if positive, multiplied if
    negative), then presence and frequency (OpenAI's: minus presence if the token occurs in
    the output, minus frequency per occurrence). `extra` i32[S, j]: tokens each row counts on
    top of its device counts (a speculative round's proposals before the row's position)."""
    counts = jnp.take(pen.output, rows, axis=0, mode="clip")
    prompt = jnp.take(pen.prompt, rows, axis=0, mode="clip")
    rep, pres, freq = (v[:, None] for v in (repetition, presence, frequency))
    x = _penalty(logits, counts, prompt, rep, pres, freq)
    if extra is None or not extra.shape[1]:
        return x
    # Only the extra tokens' logits change: recount them (a token proposed twice counts twice).
    c = jnp.take_along_axis(counts, extra, axis=1)
    c += jnp.sum(extra[:, :, None] == extra[:, None, :], axis=-1)
    p = jnp.take_along_axis(prompt, extra, axis=1)
    raw = jnp.take_along_axis(logits, extra, axis=1)
    fixed = _penalty(raw, c, p, rep, pres, freq)
    return x.at[jnp.arange(x.shape[0])[:, None], extra].set(fixed)


def _penalty(x, counts, prompt, rep, presence, frequency):
    """The three penalties of logits `x` whose tokens occur `counts` times in the output and
    (`prompt`) in the prompt; elementwise, the per-row values broadcast."""
    seen = prompt | (counts > 0)
    x = jnp.where(seen, jnp.where(x < 0, x * rep, x / rep), x)
    occurs = (counts > 0).astype(F32)
    return x - frequency * counts.astype(F32) - presence * occurs


def adjusted(logits, b, pen: Penalties | None, mode: SampleMode, step: int = 0, extra=None):
    """The logits every rule of the batch `b` shapes, before temperature and the filters: token
    rules, then penalties. `step` j and `extra` (i32[S, j]): a speculative round's row j, which
    draws the token j positions after `b`'s and counts the j proposals before it."""
    x = logits.astype(F32)
    if mode.rules:
        history = b.history
        if extra is not None and history.shape[1]:  # the proposals extend the output
            history = jnp.concatenate([history, extra], axis=1)[:, -history.shape[1] :]
        x = apply_rules(
            x,
            b.rule_ids,
            b.rule_values,
            b.rule_until,
            b.rule_allow,
            b.sample_positions + step,
            b.bad_words,
            history,
        )
    if mode.penalize:
        fields = (b.repetition_penalty, b.presence_penalty, b.frequency_penalty)
        x = penalize(x, pen, b.sample_rows, *fields, extra=extra)
    return x


def filtered(scaled, top_k, top_p, min_p):
    """(masked logits sorted high to low, their token ids): the tokens outside top-k, then
    outside the smallest prefix reaching top_p, then below min_p times the top probability are
    -inf. The most likely token always stays. top_k 0, top_p 1 and min_p 0 keep everything."""
    order = jnp.argsort(-scaled, axis=-1)
    s = jnp.take_along_axis(scaled, order, axis=-1)
    kth = jnp.take_along_axis(s, jnp.clip(top_k - 1, 0, s.shape[-1] - 1)[:, None], axis=-1)
    keep = (top_k[:, None] <= 0) | (s >= kth)  # ties with the k-th stay, as in transformers
    s = jnp.where(keep, s, -jnp.inf)
    probs = jax.nn.softmax(s, axis=-1)
    keep &= (top_p[:, None] >= 1) | (jnp.cumsum(probs, axis=-1) - probs < top_p[:, None])
    s = jnp.where(keep, s, -jnp.inf)
    probs = jax.nn.softmax(s, axis=-1)
    keep &= probs >= min_p[:, None] * probs[:, :1]
    return jnp.where(keep, s, -jnp.inf), order


def processed(logits, temperature, top_k, top_p, min_p):
    """The sampling distribution's logits in vocabulary order (-inf where filtered out)."""
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    s, order = filtered(scaled, top_k, top_p, min_p)
    rows = jnp.arange(s.shape[0])[:, None]
    return jnp.full_like(s, -jnp.inf).at[rows, order].set(s)


def counted(pen: Penalties, rows, tokens, live=None) -> Penalties:
    """`pen` with tokens i32[S, j] counted into rows `rows` (where `live`, if given; padding
    rows are out of range: dropped)."""
    add = 1 if live is None else live.astype(jnp.int32)
    return pen._replace(output=pen.output.at[rows[:, None], tokens].add(add, mode="drop"))


def draw_keys(seeds, positions, salt=None):
    """One PRNG key per row from (seed, position[, salt]): a draw's identity. `salt` (an int or
    one per row) tells apart several draws at one position (speculative decoding's)."""
    keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, positions)
    if salt is None:
        return keys
    salt = jnp.broadcast_to(jnp.asarray(salt, jnp.uint32), positions.shape)
    return jax.vmap(jax.random.fold_in)(keys, salt)


def _draw(x, b, draw: bool):
    """Temperature rows sampled from the processed distribution of logits x; greedy rows
    argmax. A greedy-only batch skips the vocabulary sort (`draw` False: not even compiled)."""
    greedy = jnp.argmax(x, axis=-1).astype(jnp.int32)
    if not draw:
        return greedy

    def draw_all(_):
        scaled = x / jnp.maximum(b.temperature, 1e-6)[:, None]
        s, order = filtered(scaled, b.top_k, b.top_p, b.min_p)
        keys = draw_keys(b.seeds, b.sample_positions)
        idx = jax.vmap(jax.random.categorical)(keys, s)
        sampled = jnp.take_along_axis(order, idx[:, None], axis=-1)[:, 0].astype(jnp.int32)
        return jnp.where(b.temperature > 0, sampled, greedy)

    return jax.lax.cond(jnp.any(b.temperature > 0), draw_all, lambda _: greedy, None)


def sample(logits, b, pen: Penalties | None, mode: SampleMode):
    """(Sampled, penalties) for logits [S, V] and the batch `b`'s per-row sampling fields
    (temperature, top_k, top_p, min_p, the three penalties, seeds, sample_positions,
    sample_rows: each row's req_to_token row, and the token rules' arrays when `mode.rules`).
    Logprobs are of the raw distribution, before any rule. Traceable: the step's program
    calls it."""
    logprobs = jax.nn.log_softmax(logits.astype(F32), axis=-1)
    tokens = _draw(adjusted(logits, b, pen, mode), b, mode.draw)
    if mode.penalize:  # count the new token (padding rows are out of range: dropped)
        pen = counted(pen, b.sample_rows, tokens[:, None])
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    top_ids = top_lp = None
    if mode.top_logprobs:
        top_lp, top_ids = top_with_rank(logprobs, chosen, mode.top_logprobs)
    return Sampled(tokens, chosen, None, top_ids, top_lp), pen


def top_with_rank(logprobs, chosen, n: int):
    """(logprobs [..., N + 1], ids [..., N + 1]): the N likeliest tokens of each row, then, in
    the last column, the chosen token's logprob and its rank in the row (1 + the tokens more
    likely than it: vLLM's `Logprob.rank`, exact also outside the N)."""
    top_lp, top_ids = jax.lax.top_k(logprobs, n)
    rank = 1 + jnp.sum(logprobs > chosen[..., None], axis=-1, dtype=jnp.int32)
    top_lp = jnp.concatenate([top_lp, chosen[..., None]], axis=-1)
    return top_lp, jnp.concatenate([top_ids.astype(jnp.int32), rank[..., None]], axis=-1)
