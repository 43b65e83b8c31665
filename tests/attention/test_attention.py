"""Attention: mask pictures, metadata, and the XLA implementation against a dense oracle."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers.attention_case import check, jitted, make_case

from swajax.attention import attention, picture
from swajax.config import LayerKind, LayerSpec

FULL = LayerSpec(LayerKind.FULL)
SLIDING = LayerSpec(LayerKind.SLIDING, 8)
CHUNKED = LayerSpec(LayerKind.CHUNKED, 8)


def test_mask_pictures():
    assert picture(6, LayerSpec(LayerKind.SLIDING, 2)) == [
        "1.....",
        "11....",
        "111...",
        ".111..",
        "..111.",
        "...111",
    ]
    assert picture(6, LayerSpec(LayerKind.CHUNKED, 3)) == [
        "1.....",
        "11....",
        "111...",
        "...1..",
        "...11.",
        "...111",
    ]
    assert picture(4, FULL) == ["1...", "11..", "111.", "1111"]


def run(case, layer, sinks=None, **kw):
    k, v = case.pages["swa" if layer.kind.is_local else "full"]
    return jitted(layer, implementation="xla", **kw)(case.q, k, v, case.meta, sinks=sinks)


def test_bf16_within_documented_tolerance():
    """bf16 pools and queries: compared with the fp32 oracle to 2e-2 relative."""
    rng = np.random.default_rng(3)
    case = make_case(rng, ps=4, prefix=[10, 0], seq=[11, 24], dtype=jnp.bfloat16)
    case.keys = [np.asarray(jnp.asarray(k, jnp.bfloat16), np.float32) for k in case.keys]
    case.values = [np.asarray(jnp.asarray(v, jnp.bfloat16), np.float32) for v in case.values]
    out = run(case, SLIDING, scale=0.25)
    assert out.dtype == jnp.bfloat16
    check(case, SLIDING, out, scale=0.25, tol=2e-2)


@pytest.mark.parametrize("mode", ["single", "all_swa"])
def test_other_pool_modes(mode):
    rng = np.random.default_rng(11)
    case = make_case(rng, ps=4, prefix=[0, 20], seq=[30, 21], mode=mode)
    check(case, SLIDING, run(case, SLIDING, scale=0.25), scale=0.25)


def test_metadata_translates_once_and_truncates_to_window():
    rng = np.random.default_rng(5)
    case = make_case(rng, ps=4, prefix=[100], seq=[101], window=8)
    meta = case.meta
    # Decode at position 100 with W = 8 reads positions 92..100: logical pages 23..25.
    assert int(meta.swa_first_page[0]) == 23
    live = np.asarray(meta.swa_page_table[0])
    assert (live[:3] > 0).all() and not live[3:].any()
    assert (
        meta.full_page_table.shape[1] >= 26 and (np.asarray(meta.full_page_table[0, :26]) > 0).all()
    )
    assert int(meta.write.swa[0]) > 0 and int(meta.write.full[0]) > 0


def test_validation_errors():
    rng = np.random.default_rng(1)
    case = make_case(rng, ps=4, prefix=[0], seq=[5])
    k, v = case.pages["full"]
    with pytest.raises(ValueError, match="sinks must have shape"):
        attention(case.q, k, v, case.meta, FULL, scale=1.0, sinks=jnp.zeros(3))
    with pytest.raises(ValueError, match="implementation"):
        attention(case.q, k, v, case.meta, FULL, scale=1.0, implementation="cuda")
    with pytest.raises(ValueError, match="tokens"):
        attention(case.q[:3], k, v, case.meta, FULL, scale=1.0)
    with pytest.raises(ValueError, match="head dims"):
        attention(case.q[..., :8], k, v, case.meta, FULL, scale=1.0)


def test_token_by_token_decode_equals_one_prefill():
    """Decoding positions one at a time through the paged pools equals one dense forward pass."""
    from swajax.attention import build_metadata

    rng = np.random.default_rng(12)
    n = 30
    case = make_case(rng, ps=4, prefix=[0], seq=[n], evict=False)
    for layer in (FULL, SLIDING, CHUNKED):
        k, v = case.pages["swa" if layer.kind.is_local else "full"]
        fn = jitted(layer, scale=0.25)
        prefill = np.asarray(fn(case.q, k, v, case.meta))
        for i in range(0, n, 7):
            meta = build_metadata(case.r2t, case.alloc, [0], [i], [i + 1], window=8)
            q = jnp.zeros((meta.num_tokens,) + case.q.shape[1:]).at[0].set(case.q[i])
            step = np.asarray(fn(q, k, v, meta))[0]
            np.testing.assert_allclose(step, prefill[i], rtol=1e-5, atol=1e-6)
