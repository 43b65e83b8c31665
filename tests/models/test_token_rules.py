"""Token rules on the device (`models/token_rules.py`, from the arrays `serving/token_rules.py`
builds) against the rules as vLLM documents them, written out per token here: logit bias adds,
allowed tokens keep only themselves, a one-token bad word is banned, a longer one bans its last
token where the output ends with the rest, min_tokens bans the stop tokens until the output has
that many (its boundary on both sides), and rows without rules are untouched."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swajax.models.token_rules import apply_rules
from swajax.serving.sampling_params import SamplingParams
from swajax.serving.token_rules import has_rules, needs_history, rule_fields

V = 40


def req(prompt_len, output, **fields):
    params = SamplingParams(max_tokens=50, **fields)
    return types.SimpleNamespace(params=params, prompt=[1] * prompt_len, output=list(output))


def expected(logits, r, position):
    """The rules of one request for the token drawn at `position`, token by token."""
    p, x = r.params, logits.astype(np.float64).copy()
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    if p.allowed_token_ids is not None:
        x[[t for t in range(V) if t not in p.allowed_token_ids]] = -np.inf
    for word in p.bad_words_token_ids:
        *before, last = word
        if not before or (len(r.output) >= len(before) and r.output[-len(before) :] == before):
            x[last] = -np.inf
    if position - len(r.prompt) < p.min_tokens:  # the output's length before this token
        x[list(p.stop_token_ids)] = -np.inf
    return x


CASES = [
    req(5, [3, 4], logit_bias={2: 3.5, 7: -1.25}),
    req(5, [3, 4], allowed_token_ids=(1, 2, 9), logit_bias={9: -2.0, 30: 5.0}),
    req(4, [11, 12, 13], bad_words_token_ids=((12, 13, 20), (13, 21), (5,), (9, 22))),
    req(4, [11, 12], bad_words_token_ids=((12, 13, 20),)),  # the prefix does not match
    req(3, [8], bad_words_token_ids=((7, 8, 9, 23),)),  # a word longer than the output
    req(6, [1, 2], min_tokens=3, stop_token_ids=(0, 5), logit_bias={5: 1.0}),
    req(6, [1, 2, 3], min_tokens=3, stop_token_ids=(0, 5), logit_bias={5: 1.0}),
    req(2, [1]),  # no rule at all
]


@pytest.mark.parametrize("rows", [CASES, CASES[2:5], CASES[7:]])
def test_rules_match_their_definitions(rows):
    rng = np.random.default_rng(len(rows))
    logits = rng.normal(size=(len(rows), V)).astype(np.float32) * 3
    f = rule_fields(rows)
    positions = np.asarray([len(r.prompt) + len(r.output) for r in rows], np.int32)
    got = jax.jit(apply_rules)(
        jnp.asarray(logits),
        f["rule_ids"],
        f["rule_values"],
        f["rule_until"],
        f["rule_allow"],
        positions,
        f["bad_words"],
        f["history"],
    )
    got = np.asarray(got)
    for i, r in enumerate(rows):
        want = expected(logits[i], r, positions[i])
        np.testing.assert_array_equal(np.isinf(got[i]), np.isinf(want), err_msg=str(i))
        live = np.isfinite(want)
        np.testing.assert_allclose(got[i][live], want[live], rtol=1e-6, atol=1e-6)


def test_the_min_tokens_boundary():
    """The stop token is banned for the min_tokens-th token and allowed for the next."""
    r = req(6, [], min_tokens=2, stop_token_ids=(5,))
    f = rule_fields([r])
    zero = jnp.zeros((1, V))
    for drawn, banned in ((6, True), (7, True), (8, False)):  # output lengths 0, 1, 2
        x = apply_rules(
            zero,
            *(f[k] for k in ("rule_ids", "rule_values", "rule_until")),
            f["rule_allow"],
            jnp.asarray([drawn]),
            f["bad_words"],
            f["history"],
        )
        assert bool(jnp.isinf(x[0, 5])) is banned, drawn


def test_which_requests_read_rules():
    assert not has_rules(SamplingParams())
    assert not has_rules(SamplingParams(min_tokens=3))  # no stop token to hold back
    assert has_rules(SamplingParams(min_tokens=3, stop_token_ids=(2,)))
    assert has_rules(SamplingParams(logit_bias={"4": 1}))  # a JSON key
    assert needs_history(SamplingParams(bad_words_token_ids=((1, 2),)))
    assert not needs_history(SamplingParams(bad_words_token_ids=((1,),)))
    empty = rule_fields([req(3, [1])])
    assert empty["rule_ids"].shape == (1, 0) and empty["bad_words"].shape[1] == 0
