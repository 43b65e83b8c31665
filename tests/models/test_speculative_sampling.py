"""Speculative sampling keeps the target's distribution: the tokens a verify round keeps are
distributed as the target's own samples, whatever the draft proposes (chi-square on a tiny
vocabulary, against the target's processed distribution). And in the engine: with a sampling
temperature, the target as its own draft keeps every proposal, and a round is reproducible.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from scipy import stats

from swajax import sizing
from swajax.api import engine_for
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.models.sampling import processed
from swajax.models.speculative import _accept
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams

V, K, ROWS = 6, 2, 30_000


class Fields(NamedTuple):
    """The per-request fields `_accept` reads of a round's batch."""

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    seeds: jax.Array


def dist(logits, temperature, top_k):
    x = processed(
        jnp.asarray(logits)[None],
        jnp.asarray([temperature]),
        jnp.asarray([top_k], jnp.int32),
        jnp.ones(1),
        jnp.zeros(1),
    )
    probs = np.exp(np.asarray(x[0], np.float64) - float(np.max(x)))
    return probs / probs.sum()


def test_kept_tokens_follow_the_target():
    rng = np.random.default_rng(5)
    target = rng.normal(size=(K + 1, V)).astype(np.float32) * 1.5
    draft = rng.normal(size=(K, V)).astype(np.float32) * 1.5  # a different model
    t, top_k = 0.9, 5  # the target keeps its top 5; the draft proposes from all 6 tokens
    p = np.stack([dist(row, t, top_k) for row in target])
    q = np.stack([dist(row, t, 0) for row in draft])
    proposed = np.stack([rng.choice(V, size=ROWS, p=q[j]) for j in range(K)], 1)
    logits = jnp.broadcast_to(jnp.asarray(target), (ROWS, K + 1, V))
    fields = Fields(
        temperature=jnp.full(ROWS, t),
        top_k=jnp.full(ROWS, top_k, jnp.int32),
        top_p=jnp.ones(ROWS),
        min_p=jnp.zeros(ROWS),
        seeds=jnp.arange(ROWS, dtype=jnp.uint32),
    )
    q_probs = [jnp.broadcast_to(jnp.asarray(q[j], jnp.float32), (ROWS, V)) for j in range(K)]
    tokens, accepted = jax.jit(_accept, static_argnames="k")(
        logits, jnp.asarray(proposed, jnp.int32), q_probs, fields, jnp.full(ROWS, 7, jnp.int32), k=K
    )
    tokens, accepted = np.asarray(tokens), np.asarray(accepted)
    assert 0 < accepted.mean() < K  # some proposals kept, some rejected
    for j in range(K + 1):  # the j-th kept token, among rounds that reach it
        reach = accepted >= j
        observed = np.bincount(tokens[reach, j], minlength=V)
        assert observed[p[j] == 0].sum() == 0  # a token the target filters is never kept
        live = p[j] > 0
        expected = p[j][live] / p[j][live].sum() * reach.sum()
        assert stats.chisquare(observed[live], expected).pvalue > 1e-3, (j, observed, expected)
    # Kept proposals are the draft's own tokens.
    for j in range(K):
        kept = accepted > j
        np.testing.assert_array_equal(tokens[kept, j], proposed[kept, j])


@pytest.fixture(scope="module")
def target():
    return load_decoder(FIXTURES / "gpt_oss")


def sampled_run(decoder, draft, k):
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(0.002),
        ratio=0.5,
        page_size=4,
        dtype="fp32",
        draft=draft.spec.hybrid if draft else None,
    )
    options = EngineOptions(chunk_size=16, max_context=256, num_speculative_tokens=k)
    lm = HybridLM(decoder, dtype="fp32")
    engine = engine_for(
        cfg, lm, sizes, options, draft=HybridLM(draft, dtype="fp32") if draft else None
    )
    params = [SamplingParams(max_tokens=12, temperature=0.8, top_k=20, seed=s) for s in range(3)]
    rids = [engine.add_request([3, 1, 4, 1, 5, 9, 2, 6][: 5 + s], p) for s, p in enumerate(params)]
    engine.run()
    return [engine.requests[r].output for r in rids], engine


def test_the_target_as_its_own_draft_keeps_every_sampled_proposal(target):
    outputs, engine = sampled_run(target, target, 3)
    assert all(len(o) == 12 for o in outputs)
    rounds = [m for m in engine.metrics if m.kind == "decode"]
    # Every round keeps k + 1 tokens (p == q accepts always) until the length limit.
    assert engine.scheduler.accepted_tokens >= 3 * 3 * (len(rounds) - 3)
    again, _ = sampled_run(target, target, 3)
    assert again == outputs  # every draw is keyed: a rerun samples the same tokens
