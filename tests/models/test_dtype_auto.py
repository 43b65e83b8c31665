"""`dtype="auto"` (the default): a checkpoint loads in its own dtype, so its weights take the
bytes its files do; `dtype=` still overrides."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from test_models import run_engine

from swajax import LLM, SamplingParams
from swajax.models import load_decoder
from swajax.models.export import save_hf
from swajax.models.loading import checkpoint_dtype


def _bf16_checkpoint(tmp_path, name="qwen3"):
    src = FIXTURES / name
    out = tmp_path / f"{name}_bf16"
    save_hf(load_decoder(src, dtype="bfloat16"), src, out, dtype="bfloat16")
    return out


def test_a_bfloat16_checkpoint_loads_as_bfloat16_and_weighs_its_files(tmp_path):
    folder = _bf16_checkpoint(tmp_path)
    assert checkpoint_dtype(folder) == "bfloat16"
    llm = LLM(str(folder), kv_budget_gib=0.01, max_model_len=128)
    assert llm.engine.model.spec.dtype == "bfloat16"
    files = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    weights = llm.summary()["weight_bytes"]
    assert abs(weights - files) <= 0.03 * files, (weights, files)
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3


def test_dtype_overrides_auto_and_a_config_without_one_is_float32(tmp_path):
    folder = _bf16_checkpoint(tmp_path)
    assert load_decoder(folder, dtype="float32").spec.dtype == "float32"
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    decoder = load_decoder(folder)
    assert decoder.spec.dtype == "float32"
    leaves = jax.tree.leaves(decoder.embed[...])
    assert all(x.dtype == np.float32 for x in leaves)


def test_a_converted_folder_says_the_dtype_it_was_converted_to(tmp_path):
    from swajax.models import save_orbax

    src = FIXTURES / "qwen3"
    out = tmp_path / "converted"
    save_orbax(load_decoder(src, dtype="bfloat16"), src, out)
    assert checkpoint_dtype(out) == "bfloat16"
    assert load_decoder(out).spec.dtype == "bfloat16"


@pytest.mark.parametrize(
    "family", ["gpt_oss_mxfp4", pytest.param("gemma3", marks=pytest.mark.slow)]
)
def test_bfloat16_scanned_is_as_close_to_float32_as_unrolled(family):
    """In bfloat16 the scan's stacks and the KV pools are held as their bits on CPU
    (`memory.bits`), the unrolled layers' weights as bfloat16: both are as far from the float32
    model as bfloat16 makes them, no further (MoE with sinks and MXFP4 experts; a dense sliding
    family)."""
    exact = run_engine(FIXTURES / family)[0]
    runs = [
        run_engine(FIXTURES / family, dtype="bfloat16", kv="bf16", scan=scan) for scan in (1, 0)
    ]
    (scanned, _, _, engine), (unrolled, _, _, _) = runs
    pools = engine.runner.pools
    assert pools.full_k.dtype == jnp.uint16 and pools.stacked(False)[0].dtype == jnp.bfloat16
    err_scanned, err_unrolled = (float(np.abs(x - exact).max()) for x in (scanned, unrolled))
    assert 0 < err_scanned <= 1.5 * err_unrolled + 1e-3, (err_scanned, err_unrolled)
