"""Sampling inside the jit, against references we did not write.

- transformers' own logits processors (repetition penalty, temperature, top-k, top-p, min-p, in
  `generate`'s order) applied to fixed logits: `tests/fixtures/sampling`, made by
  `tools/make_sampling_fixtures.py`;
- OpenAI's presence / frequency penalty formula (as vLLM implements it), written out here;
- sampled distributions against the processed distribution (chi-square);
- greedy rows are the argmax whether or not another row samples, and a sampled row draws the
  same token alone or in a batch (the key is its seed and position).
"""

import json
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swajax.models.sampling import (
    SampleMode,
    init_penalties,
    penalize,
    processed,
    sample,
    seed_penalties,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sampling"
CASES = json.loads((FIXTURES / "cases.json").read_text())
ARRAYS = np.load(FIXTURES / "processors.npz")
sample_jit = jax.jit(sample, static_argnames="mode")


class Fields(NamedTuple):
    """The per-row sampling fields a step's batch carries (a pytree, as in the engine)."""

    temperature: jax.Array
    top_p: jax.Array
    top_k: jax.Array
    min_p: jax.Array
    repetition_penalty: jax.Array
    presence_penalty: jax.Array
    frequency_penalty: jax.Array
    seeds: jax.Array
    sample_positions: jax.Array
    sample_rows: jax.Array


def batch(n, **fields):
    """A batch's per-row sampling fields: neutral values unless given."""
    base = dict(
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        seeds=0,
        sample_positions=0,
        sample_rows=0,
    )
    base.update(fields)
    types = dict(
        top_k=jnp.int32, seeds=jnp.uint32, sample_positions=jnp.int32, sample_rows=jnp.int32
    )
    return Fields(
        **{
            k: jnp.broadcast_to(jnp.asarray(v, types.get(k, jnp.float32)), (n,))
            for k, v in base.items()
        }
    )


def counts_of(ids: np.ndarray, prompt: int, vocab: int):
    """The device counts of rows whose tokens are `ids` [rows, L], the first `prompt` of each
    the prompt and the rest output (loaded as an admission loads them)."""
    rows = np.repeat(np.arange(len(ids)), ids.shape[1])
    is_output = np.tile(np.arange(ids.shape[1]) >= prompt, len(ids)).astype(np.int32)
    pen = init_penalties(len(ids), vocab)
    reset = jnp.arange(len(ids), dtype=jnp.int32)
    return seed_penalties(
        pen,
        reset,
        jnp.asarray(rows, jnp.int32),
        jnp.asarray(ids.reshape(-1), jnp.int32),
        jnp.asarray(is_output),
    )


def ours(case, logits, ids):
    n, v = logits.shape
    x = jnp.asarray(logits)
    if case["repetition_penalty"] is not None:
        pen = counts_of(ids, CASES["prompt"], v)
        rep = jnp.full(n, case["repetition_penalty"], jnp.float32)
        x = penalize(x, pen, jnp.arange(n), rep, jnp.zeros(n), jnp.zeros(n))
    if case["temperature"] is None:
        return np.asarray(x)
    full = lambda value, neutral, dtype=jnp.float32: jnp.full(  # noqa: E731
        n, neutral if value is None else value, dtype
    )
    out = processed(
        x,
        full(case["temperature"], 1.0),
        full(case["top_k"], 0, jnp.int32),
        full(case["top_p"], 1.0),
        full(case["min_p"], 0.0),
    )
    return np.asarray(out)


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["name"])
def test_processing_matches_transformers(case):
    name = case["name"]
    logits, ids, expected = (ARRAYS[f"{name}.{k}"] for k in ("logits", "ids", "out"))
    got = ours(case, logits, ids)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))  # the same tokens kept
    keep = np.isfinite(expected)
    np.testing.assert_allclose(got[keep], expected[keep], rtol=1e-6, atol=1e-6)


def test_presence_and_frequency_penalties_follow_openai():
    rng = np.random.default_rng(3)
    n, v, prompt = 4, 30, 5
    logits = rng.normal(size=(n, v)).astype(np.float32) * 3
    ids = rng.integers(0, v, size=(n, prompt + 12))
    presence, frequency = np.asarray([0.0, 0.5, 1.0, -0.4]), np.asarray([0.3, 0.0, 0.7, 0.2])
    pen = counts_of(ids, prompt, v)
    got = penalize(
        jnp.asarray(logits),
        pen,
        jnp.arange(n),
        jnp.ones(n),
        jnp.asarray(presence, jnp.float32),
        jnp.asarray(frequency, jnp.float32),
    )
    # mu[j] - c[j] * frequency - (c[j] > 0) * presence, c counting output tokens only
    counts = np.stack([np.bincount(row[prompt:], minlength=v) for row in ids])
    expected = logits - counts * frequency[:, None] - (counts > 0) * presence[:, None]
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)


def test_sampled_tokens_follow_the_processed_distribution():
    """20 000 draws of one row (keys differ by position) against transformers' processed
    distribution of the small-vocabulary chain case: a chi-square test at p = 1e-3."""
    case = next(c for c in CASES["cases"] if c["name"] == "chain_small_vocab")
    logits, ids, expected = (ARRAYS[f"chain_small_vocab.{k}"] for k in ("logits", "ids", "out"))
    draws = 20_000
    pen = counts_of(ids[:1], CASES["prompt"], logits.shape[1])
    b = batch(
        draws,
        temperature=case["temperature"],
        top_k=case["top_k"],
        top_p=case["top_p"],
        min_p=case["min_p"],
        repetition_penalty=case["repetition_penalty"],
        seeds=11,
        sample_positions=jnp.arange(draws),
    )
    rows = jnp.broadcast_to(jnp.asarray(logits[:1]), (draws, logits.shape[1]))
    sampled, _ = sample_jit(rows, b, pen, mode=SampleMode(penalize=True))
    observed = np.bincount(np.asarray(sampled.tokens), minlength=logits.shape[1])
    p = np.exp(expected[0].astype(np.float64) - expected[0].max())
    p /= p.sum()
    assert observed[p == 0].sum() == 0  # a filtered token is never drawn
    live = p > 0
    chi2 = stats.chisquare(observed[live], p[live] * draws)
    assert chi2.pvalue > 1e-3, (observed, p * draws)


def test_greedy_rows_take_the_penalized_argmax_and_counts_grow():
    logits = jnp.asarray([[5.0, 4.9, 0.0, -1.0]] * 2)
    pen = counts_of(np.asarray([[0], [1]]), 0, 4)  # row 0 has output token 0, row 1 token 1
    b = batch(2, repetition_penalty=2.0, sample_rows=jnp.asarray([0, 1]))
    sampled, pen = sample_jit(logits, b, pen, mode=SampleMode(penalize=True))
    assert np.asarray(sampled.tokens).tolist() == [1, 0]  # each avoids the token it produced
    assert np.asarray(pen.output)[[0, 1], [1, 0]].tolist() == [1, 1]  # the new ones counted


def test_top_logprobs_are_the_raw_distribution_ranked():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(3, 20)), jnp.float32)
    sampled, _ = sample_jit(
        logits, batch(3, repetition_penalty=3.0), None, mode=SampleMode(top_logprobs=4)
    )
    raw = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    order = np.argsort(-raw, axis=-1)[:, :4]
    np.testing.assert_array_equal(np.asarray(sampled.top_ids)[:, :4], order)
    np.testing.assert_allclose(
        np.asarray(sampled.top_logprobs)[:, :4], np.take_along_axis(raw, order, -1), rtol=1e-6
    )
    # The last column: the sampled token's logprob and its rank in the whole distribution
    # (drawn at a high temperature: most draws are not the likeliest, many not in the top 4).
    hot = batch(3, temperature=20.0, seeds=jnp.asarray([1, 2, 3]))
    sampled, _ = sample_jit(logits, hot, None, mode=SampleMode(top_logprobs=4))
    chosen = raw[np.arange(3), np.asarray(sampled.tokens)]
    np.testing.assert_allclose(np.asarray(sampled.top_logprobs)[:, 4], chosen, rtol=1e-6)
    ranks = 1 + np.sum(raw > chosen[:, None], axis=-1)
    np.testing.assert_array_equal(np.asarray(sampled.top_ids)[:, 4], ranks)
    assert ranks.max() > 4, ranks


def test_greedy_and_sampled_rows_mix():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 50)), jnp.float32)
    mixed = dict(
        temperature=jnp.asarray([0.0, 1.5, 0.0]),
        top_p=jnp.asarray([1.0, 0.9, 1.0]),
        seeds=jnp.asarray([1, 7, 3]),
        sample_positions=jnp.asarray([4, 9, 2]),
    )
    sampled, _ = sample_jit(logits, batch(3, **mixed), None, mode=SampleMode())
    tokens = np.asarray(sampled.tokens)
    greedy = np.argmax(np.asarray(logits), axis=-1)
    assert tokens[0] == greedy[0] and tokens[2] == greedy[2]
    alone = {k: v[1:2] for k, v in mixed.items()}
    one, _ = sample_jit(logits[1:2], batch(1, **alone), None, mode=SampleMode())
    assert tokens[1] == int(one.tokens[0])
    expected = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(3), tokens]
    np.testing.assert_allclose(np.asarray(sampled.logprobs), np.asarray(expected), rtol=1e-6)


def test_draws_depend_on_seed_and_position_only():
    logits = jnp.zeros((1, 1000), jnp.float32)  # uniform: the draw is the key's alone

    def draw(seed, pos):
        b = batch(1, temperature=1.0, seeds=seed, sample_positions=pos)
        return int(sample_jit(logits, b, None, mode=SampleMode())[0].tokens[0])

    assert len({draw(s, q) for s in range(4) for q in range(4)}) > 8
    assert draw(5, 3) == draw(5, 3)
