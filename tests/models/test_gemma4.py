"""Gemma 4's memory rules, checked by hand on the fixtures (tools/make_fixtures.py):

gemma4    layers S F S F S F; full layers: 1 KV head of 32 whose keys are their values; the last
          two layers read layers 2 and 3's KV (num_kv_shared_layers = 2).
gemma4_e  layers S S F S F; full layers: 2 KV heads of 32, K and V; layers 3, 4 read 1, 2.
Sliding layers: 2 KV heads of 16. float32 KV (4 bytes).
"""

import numpy as np
import pytest
from helpers import FIXTURES
from models.test_models import rel_err, run_engine

from swajax import sizing
from swajax.config import load_hf_config
from swajax.memory import pool as pool_lib


def test_shared_layers_store_nothing_and_keys_that_are_values_are_stored_once():
    cfg = load_hf_config(FIXTURES / "gemma4")
    assert [la.kv_source for la in cfg.layers] == [None, None, None, None, 2, 3]
    assert cfg.full_layer_ids == (1, 3) and cfg.swa_layer_ids == (0, 2)
    assert sizing.layer_bytes(cfg, "fp32") == (1 * 32 * 4, 2 * (16 + 16) * 4)
    assert sizing.token_bytes(cfg, "fp32") == (2 * 128, 2 * 256)
    sizes = sizing.PoolSizes("hybrid", 64, 32, 4)
    pools = pool_lib.init_pools(cfg, sizes, "fp32")
    assert pools.full_k.shape == (2, 64 + 4, 1 * 32) and pools.full_v.shape[0] == 0
    assert pools.swa_k.shape == pools.swa_v.shape == (2, 32 + 4, 2 * 16)
    assert pool_lib.bytes_allocated(pools) == (64 + 4) * 2 * 128 + (32 + 4) * 2 * 256
    # layer 4 (sliding) reads layer 2's rows, layer 5 (full) layer 3's
    assert pools.layers == ((0, True), (0, False), (1, True), (1, False), (1, True), (1, False))
    k, v = pools.layer(5)
    assert k is v or (k.shape == v.shape)


def test_shared_layers_without_keys_equal_values():
    cfg = load_hf_config(FIXTURES / "gemma4_e")
    assert [la.kv_source for la in cfg.layers] == [None, None, None, 1, 2]
    assert cfg.full_layer_ids == (2,) and cfg.swa_layer_ids == (0, 1)
    assert sizing.token_bytes(cfg, "fp32") == (1 * 2 * (32 + 32) * 4, 2 * 2 * (16 + 16) * 4)


def test_pallas_runs_beside_keys_derived_from_values():
    """Layers whose keys are derived from the stored values run the XLA path; the others the
    kernels (interpret mode): transformers' logits either way."""
    path = FIXTURES / "gemma4"
    logits, output, greedy, _ = run_engine(path, attention="pallas")
    assert rel_err(logits, np.load(path / "logits.npy")) <= 1e-4 and output == greedy


@pytest.mark.parametrize("bad", [{"num_kv_shared_layers": 6}, {"num_kv_shared_layers": -1}])
def test_bad_sharing_is_named(bad):
    import json

    from swajax.config import ConfigError, parse_hf_config

    cfg = json.loads((FIXTURES / "gemma4" / "config.json").read_text()) | bad
    with pytest.raises(ConfigError, match="num_kv_shared_layers"):
        parse_hf_config(cfg)


def test_a_shared_kind_needs_an_owner():
    import json

    from swajax.config import ConfigError, parse_hf_config

    cfg = json.loads((FIXTURES / "gemma4" / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention"] * 5 + ["full_attention"], num_kv_shared_layers=1)
    cfg.pop("per_layer_config")
    with pytest.raises(ConfigError, match="no layer before"):
        parse_hf_config(cfg)
