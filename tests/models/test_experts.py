"""Routed experts (each token through its top-k only) against the all-experts reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES, rel_err

from swajax.models import experts as ex, load_decoder


def _case(t, e, k, h=16, f=12, seed=0, ties=False, scale=False, bias=True):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(t, h)), jnp.float32)
    weights = ex.Experts(
        jnp.asarray(rng.normal(size=(e, h, 2 * f)) * 0.3, jnp.float32),
        jnp.asarray(rng.normal(size=(e, 2 * f)), jnp.float32) if bias else None,
        jnp.asarray(rng.normal(size=(e, f, h)) * 0.3, jnp.float32),
        jnp.asarray(rng.normal(size=(e, h)), jnp.float32) if bias else None,
    )
    # Integer router logits in a small range: many tokens have tied top-k choices.
    logits = rng.integers(0, 3, size=(t, e)) if ties else rng.normal(size=(t, e))
    top, idx = jax.lax.top_k(jnp.asarray(logits, jnp.float32), k)
    routing = ex.Routing(idx, jax.nn.sigmoid(top) if scale else None, jax.nn.softmax(top, -1))
    return x, routing, weights


def act(h):
    i = h.shape[-1] // 2
    return jax.nn.silu(h[..., :i]) * h[..., i:]


@pytest.mark.parametrize("method", ["loop", "ragged"])
@pytest.mark.parametrize(
    "t, e, k, ties, scale, bias",
    [
        (1, 4, 2, False, False, True),  # one decode token
        (24, 4, 2, True, False, True),  # ties in the top-k
        (37, 8, 3, True, True, False),  # Llama 4 style input scaling, odd sizes
        (64, 32, 4, False, False, True),  # GPT-OSS shape: many experts, some unused
        (5, 8, 8, False, True, True),  # every expert chosen by every token
    ],
)
def test_routed_equals_all_experts(method, t, e, k, ties, scale, bias):
    x, routing, weights = _case(t, e, k, ties=ties, scale=scale, bias=bias)
    want = ex.dense(x, routing, weights, act)
    got = jax.jit(lambda x: ex.routed(x, routing, weights, act, method=method))(x)
    assert rel_err(np.asarray(got), np.asarray(want)) < 1e-5


def test_block_size_does_not_change_the_result():
    x, routing, weights = _case(40, 8, 2, ties=True)
    outs = [ex.routed(x, routing, weights, act, block=b, method="loop") for b in (1, 8, 64)]
    for out in outs[1:]:
        assert rel_err(np.asarray(out), np.asarray(outs[0])) < 1e-6


# Chunks along the hidden axis (40): w1 [40, 24] 8 or 20 input rows at a time (40 = 5 x 8,
# 2 x 20), w2 [12, 40] 16 output columns at a time (40 = 2 x 16 + 8), then whole.
@pytest.mark.parametrize("chunk_bytes, rows", [(8 * 24 * 4, [8, 16]), (20 * 24 * 4, [20, 40])])
def test_weights_read_a_chunk_at_a_time_give_the_same_result(monkeypatch, chunk_bytes, rows):
    # Weights too large for one cache-sized chunk are read (and multiplied) a chunk at a time.
    x, routing, weights = _case(24, 8, 2, h=40, f=12, ties=True)
    want = ex.routed(x, routing, weights, act, method="loop")
    monkeypatch.setattr(ex, "CHUNK_BYTES", chunk_bytes)
    assert [ex.k_rows(40, 24, 4), ex.k_rows(40, 12, 4)] == rows
    got = jax.jit(lambda x: ex.routed(x, routing, weights, act, method="loop"))(x)
    assert rel_err(np.asarray(got), np.asarray(want)) < 1e-6
    assert rel_err(np.asarray(got), np.asarray(ex.dense(x, routing, weights, act))) < 1e-5


@pytest.mark.parametrize("family, layer", [("gpt_oss", 0), ("mimo_v2_flash", 1), ("llama4", 1)])
def test_family_moe_blocks_routed_equal_dense(family, layer):
    routed = load_decoder(FIXTURES / family, moe="routed").layers[layer].mlp
    dense = load_decoder(FIXTURES / family, moe="dense").layers[layer].mlp
    x = np.random.default_rng(1).normal(size=(19, routed.spec.hidden)).astype(np.float32)
    x[5] = x[4]  # identical tokens route identically
    x[7] = 0.0  # a token whose router scores are all bias: ties broken the same way
    want, got = np.asarray(dense(jnp.asarray(x))), np.asarray(routed(jnp.asarray(x)))
    assert rel_err(got, want) < 1e-5


def test_auto_routes_only_when_most_experts_are_skipped():
    import dataclasses

    spec = load_decoder(FIXTURES / "gpt_oss").spec  # 4 experts, top-2: dense is cheaper
    assert not spec.routed_experts
    assert dataclasses.replace(spec, num_experts=32, top_k=4).routed_experts  # gpt-oss-20b
    assert dataclasses.replace(spec, moe="routed").routed_experts
    assert load_decoder(FIXTURES / "llama4").spec.routed_experts  # 4 experts, top-1


@pytest.mark.parametrize("method", ["loop", "ragged"])
def test_padding_rows_run_no_expert(method):
    """A batch padded to its bucket (one decode token in eight rows, the padding alike): with
    the padding mask the padding rows run through no expert and give 0, the real rows what
    they give alone, and the loop runs only the real rows' blocks."""
    x, routing, weights = _case(8, 8, 2, seed=3)
    x = x.at[1:].set(0.0)  # the padding rows: all alike, so they choose the same experts
    idx = jnp.zeros((8, 2), jnp.int32).at[1:].set(jnp.array([6, 7]))  # the padding's choices
    idx = idx.at[0].set(jnp.array([0, 3]))  # the real row's, other experts
    valid = jnp.arange(8) < 1
    masked = routing._replace(experts=idx, valid=valid)
    got = jax.jit(lambda x: ex.routed(x, masked, weights, act, method=method))(x)
    alone = ex.Routing(idx[:1], None, routing.weight[:1])
    want = ex.dense(x[:1], alone, weights, act)
    assert rel_err(np.asarray(got[:1]), np.asarray(want)) < 1e-5
    np.testing.assert_array_equal(np.asarray(got[1:]), 0.0)
    np.testing.assert_array_equal(np.asarray(ex.dense(x, masked, weights, act)[1:]), 0.0)
    block = ex.block_rows(16, 8)
    used = ex._layout(masked, 8, 8, block).used
    assert int(used) == 2  # the real row's two experts, one block each
    assert int(ex._layout(masked._replace(valid=None), 8, 8, block).used) == 4


def test_engine_layers_give_their_moe_the_padding_mask(monkeypatch):
    """Every MoE layer the engine runs routes with the batch's padding mask (a decode step of
    one request runs rows of padding too: two rows here, eight by default)."""
    from swajax import sizing
    from swajax.api import engine_for
    from swajax.models.decoder import HybridLM
    from swajax.serving.options import EngineOptions
    from swajax.serving.sampling_params import SamplingParams

    seen = []
    original = ex.routed

    def routed(x, routing, *args, **kwargs):
        seen.append((x.shape[0], routing.valid is not None))
        return original(x, routing, *args, **kwargs)

    monkeypatch.setattr(ex, "routed", routed)
    model = HybridLM(load_decoder(FIXTURES / "gpt_oss", moe="routed"))
    sizes = sizing.solve_pool_sizes(model.spec.hybrid, 256, ratio=0.5, page_size=4)
    options = EngineOptions(max_running=2, max_context=64, chunk_size=8)
    engine = engine_for(model.spec.hybrid, model, sizes, options)
    engine.add_request(list(range(1, 9)), SamplingParams(temperature=0.0, max_tokens=3))
    engine.run()
    assert seen and all(masked for _, masked in seen)
    assert 2 in {rows for rows, _ in seen}  # a decode step: one request, one padding row


def test_the_loop_works_only_on_the_blocks_in_use():
    """The padded layout holds every expert's last partial block (256 rows for a decode step
    of eight rows over 32 experts); the loop gathers, multiplies, adds biases and activates
    one block in use at a time, so nothing outside it has a row per layout row and a column
    per expert output."""
    x, routing, weights = _case(8, 32, 4, h=16, f=12)
    block = ex.block_rows(32, 32)
    size = ex._layout(routing, 8, 32, block).token.shape[0]
    assert size == 256
    jaxpr = jax.make_jaxpr(lambda x: ex.routed(x, routing, weights, act, method="loop"))(x)
    outside = [v.aval.shape for eqn in jaxpr.eqns for v in eqn.outvars]
    assert (size, 24) not in outside and (size, 12) not in outside  # w1's outputs, act's
