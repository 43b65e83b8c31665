"""A batch's token rules as arrays (host code): what `models/token_rules.py` reads on the device.

Per sampled request, its rule entries (one per bias, allowed token, banned token; min_tokens
bans its stop tokens until the position that many tokens into the output), its bad words of
several tokens right-aligned, and the last output tokens they are matched against. Sizes are
bucketed (powers of two) so batches with similar rules share a program.
"""

from __future__ import annotations

import numpy as np

from swajax.arith import bucket

NO_TOKEN = 2**30  # an id past any vocabulary: the device drops what is written to it
ALWAYS = 2**31 - 1  # an entry's `until` when it never expires
ANY, BEFORE = -1, -2  # a bad word's padding place; history before the output's first token


def entries(params, prompt_len: int) -> list[tuple[int, float, int, int]]:
    """A request's rule entries: (token id, bias, until, allowed)."""
    out = [(int(t), float(v), ALWAYS, 0) for t, v in (params.logit_bias or {}).items()]
    out += [(int(t), 0.0, ALWAYS, 1) for t in params.allowed_token_ids or ()]
    out += [(w[0], -np.inf, ALWAYS, 0) for w in params.bad_words_token_ids if len(w) == 1]
    if params.min_tokens:
        until = prompt_len + params.min_tokens
        out += [(int(t), -np.inf, until, 0) for t in params.stop_token_ids]
    return out


def rule_fields(reqs) -> dict[str, np.ndarray]:
    """The rule arrays of requests (their `params`, `prompt`, `output`), one row each; empty
    (B = 0, W = 0) when none has a rule."""
    rows = [entries(r.params, len(r.prompt)) for r in reqs]
    words = [[w for w in r.params.bad_words_token_ids if len(w) > 1] for r in reqs]
    n = len(reqs)
    b = bucket(max(map(len, rows), default=0), 4) if any(rows) else 0
    ids, values = np.full((n, b), NO_TOKEN, np.int32), np.zeros((n, b), np.float32)
    until, allow = np.zeros((n, b), np.int32), np.zeros((n, b), np.int32)
    for i, row in enumerate(rows):
        for j, (t, v, u, a) in enumerate(row):
            ids[i, j], values[i, j], until[i, j], allow[i, j] = t, v, u, a
    w = bucket(max(map(len, words)), 2) if any(words) else 0
    length = bucket(max(len(x) for ws in words for x in ws), 2) if w else 0
    bad = np.full((n, w, length), ANY, np.int32)
    bad[:, :, -1:] = NO_TOKEN  # padding words ban nothing
    history = np.full((n, max(length - 1, 0)), BEFORE, np.int32)
    for i, (req, ws) in enumerate(zip(reqs, words)):
        for j, word in enumerate(ws):
            bad[i, j, length - len(word) :] = word
        tail = req.output[-(length - 1) :] if length > 1 else []
        if tail:
            history[i, length - 1 - len(tail) :] = tail
    return dict(
        rule_ids=ids,
        rule_values=values,
        rule_until=until,
        rule_allow=allow,
        bad_words=bad,
        history=history,
    )


def has_rules(params) -> bool:
    """Whether a request's sampling reads rule arrays."""
    return bool(
        params.logit_bias
        or params.allowed_token_ids
        or params.bad_words_token_ids
        or (params.min_tokens and params.stop_token_ids)
    )


def needs_history(params) -> bool:
    """Whether its rules read the output's last tokens (a bad word of several tokens): a step
    planned before the previous one's token is known cannot carry them."""
    return any(len(w) > 1 for w in params.bad_words_token_ids)
