"""The engine with params and both KV pools sharded over KV heads on 4 fake CPU devices
(tests/conftest.py requests them before jax starts) gives the same outputs as one device."""

import jax
import numpy as np
import pytest
from helpers import FIXTURES

from swajax import sizing
from swajax.models import HybridLM, load_decoder
from swajax.models.sharding import kv_mesh
from swajax.serving.engine import Engine, EngineOptions
from swajax.serving.request import SamplingParams


def run(path, mesh):
    model = HybridLM(load_decoder(path), mesh=mesh)
    cfg = model.spec.hybrid
    sizes = sizing.solve_pool_sizes(cfg, 256, ratio=0.5, page_size=4)
    engine = Engine(
        cfg,
        model,
        sizes,
        EngineOptions(max_running=4, max_context=64, chunk_size=8, eviction_interval=1),
    )
    prompt = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27, 88, 11, 60, 45]
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6), keep_logits=True)
    engine.run()
    req = engine.requests[rid]
    return req.output, np.stack(req.logits), engine.runner.pools


@pytest.mark.parametrize("family", ["gpt_oss", "mimo_v2_flash"])
def test_sharded_engine_matches_one_device(family):
    assert len(jax.devices()) >= 4
    heads = 2  # the fixtures have 2 (full) KV heads: split them over 2 of the 4 devices
    out_1, logits_1, _ = run(FIXTURES / family, None)
    out_n, logits_n, pools = run(FIXTURES / family, kv_mesh(heads))
    assert out_1 == out_n
    np.testing.assert_allclose(logits_n, logits_1, rtol=1e-5, atol=1e-5)
    shards = pools.full_k.addressable_shards
    assert len(shards) == heads and shards[0].data.shape[2] == pools.full_k.shape[2] // heads


def test_heads_must_divide_the_mesh():
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        HybridLM(load_decoder(FIXTURES / "qwen3"), mesh=kv_mesh(4))
