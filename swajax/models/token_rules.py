"""A request's token rules inside the step's jit: logit bias, allowed tokens, banned tokens and
bad words, applied to the raw logits before the penalties (vLLM's order: these are its
allowed-token, bad-word, min-tokens and logit-bias processors).

Each sampled row carries up to B rule entries (`serving/token_rules.py` builds them): a bias
added to the token's logit (-inf bans it) while the drawn position is below the entry's
`until` (min_tokens bans the stop tokens until its position; INT32_MAX: always), and whether
the token is allowed. An id may have several entries: their biases add up. A row with any
allowed entry keeps only those tokens.

A bad word of several tokens bans its last token where the output so far ends with the others.
Rows carry their words right-aligned in L places (-1: a place any token matches; a padding
word bans an id past the vocabulary) and the last L - 1 output tokens (`history`, -2 before
the output's start: matches no word token); a speculative round's row j appends the j
proposals before it.
"""

from __future__ import annotations

import jax.numpy as jnp


def apply_rules(x, ids, values, until, allow, positions, bad_words, history):
    """Logits x f32[S, V] with the rules applied. ids / values / until / allow: [S, B] (ids past
    the vocabulary where a row has fewer entries: their scatters are dropped); positions
    i32[S]: the position each row draws; bad_words i32[S, W, L]; history i32[S, L - 1]."""
    rows = jnp.arange(x.shape[0])[:, None]
    if ids.shape[1]:
        live = positions[:, None] < until
        bias = jnp.where(live, values, 0.0)
        # An id may have several entries (a bias, and a ban until min_tokens): biases add up,
        # and it is listed if any entry allows it.
        listed = jnp.zeros(x.shape, jnp.int32).at[rows, ids].max(allow, mode="drop") > 0
        restrict = jnp.any(allow > 0, axis=1, keepdims=True)
        x = jnp.where(restrict & ~listed, -jnp.inf, x.at[rows, ids].add(bias, mode="drop"))
    if bad_words.shape[1] and bad_words.shape[2] > 1:
        prefix, last = bad_words[:, :, :-1], bad_words[:, :, -1]
        match = jnp.all((prefix == -1) | (prefix == history[:, None, :]), axis=-1)
        x = x.at[rows, jnp.where(match, last, x.shape[1])].set(-jnp.inf, mode="drop")
    return x
