"""FP8 KV pools: per-layer K / V scales as checkpoints ship them, folded into the attention
exactly (float64 oracle on the values the pools hold), the same through every implementation,
and read, written back and converted with the checkpoint."""

import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from helpers.attention_case import check, make_case
from test_models import rel_err, run_engine

from swajax.attention import AttentionMode
from swajax.config import LayerKind, LayerSpec
from swajax.memory.pool import KVPools
from swajax.models import load_decoder, save_orbax
from swajax.models.checkpoint import Checkpoint
from swajax.models.export import hf_tensors, write_safetensors
from swajax.models.layers import paged_attention
from swajax.sizing import PoolMode


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_scaled_fp8_pools_against_the_float64_oracle(dtype, implementation):
    """The pool holds fp8(K / k) and fp8(V / v); attention over it equals the float64 oracle
    on K' = k fp8(K / k), V' = v fp8(V / v), with sinks and a soft cap."""
    fp8, (k_scale, v_scale) = getattr(jnp, dtype), (0.37, 2.5)
    rng = np.random.default_rng(5)
    layer = LayerSpec(LayerKind.SLIDING, 8)
    for prefix, seq in (([8, 19], [9, 20]), ([0, 5], [26, 30])):  # decode, then extend
        case = make_case(rng, ps=4, prefix=prefix, seq=seq, hq=4, hkv=2)
        k_pages, v_pages = case.pages["swa"]
        stored = [
            (p.astype(jnp.float32) / s).astype(fp8)
            for p, s in ((k_pages, k_scale), (v_pages, v_scale))
        ]
        rows = [p.reshape(1, -1, p.shape[2] * p.shape[3]) for p in stored]  # heads side by side
        empty = rows[0][:0]
        pools = KVPools(
            empty, empty, rows[0], rows[1], ((0, True),), 4, PoolMode.HYBRID, heads=(2, 2)
        )

        def held(x, s):
            return np.asarray((jnp.asarray(x) / s).astype(fp8).astype(jnp.float32)) * s

        case.keys = [held(k, k_scale) for k in case.keys]
        case.values = [held(v, v_scale) for v in case.values]
        sinks = rng.normal(size=4).astype(np.float32)
        mode = AttentionMode(implementation, interpret=implementation == "pallas")
        out = paged_attention(
            case.q,
            pools,
            0,
            case.meta,
            layer,
            mode,
            kv_scales=(jnp.float32(k_scale), jnp.float32(v_scale)),
            scale=0.3,
            sinks=jnp.asarray(sinks),
            soft_cap=5.0,
        )
        check(case, layer, out, scale=0.3, sinks=sinks, soft_cap=5.0)


@pytest.mark.parametrize(
    "family", ["gpt_oss", pytest.param("gemma4", marks=pytest.mark.slow)]
)  # sinks; keys that are values (its FP8 rows widened before keys are derived)
def test_fp8_kv_is_the_same_through_xla_and_pallas(family):
    xla, out_xla, _, _ = run_engine(FIXTURES / family, kv="fp8_e4m3")
    pallas, out_pallas, _, _ = run_engine(FIXTURES / family, kv="fp8_e4m3", attention="pallas")
    assert rel_err(pallas, xla) <= 1e-5 and out_pallas == out_xla


@pytest.fixture
def scaled(tmp_path):
    """The qwen3 fixture with `self_attn.k_scale` / `v_scale` per layer, as FP8-KV checkpoints
    ship them (a scalar, or [1])."""
    src, folder = FIXTURES / "qwen3", tmp_path / "scaled"
    shutil.copytree(src, folder)
    stored = Checkpoint([src / "model.safetensors"])
    tensors = {n: np.asarray(stored.array(n)) for n in stored.names()}
    layers = sorted({int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.")})
    for i in layers:
        tensors[f"model.layers.{i}.self_attn.k_scale"] = np.float32(0.05 * (i + 1)).reshape(())
        tensors[f"model.layers.{i}.self_attn.v_scale"] = np.full((1,), 0.5, np.float32)
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def test_a_checkpoints_kv_scales_are_read_and_kept(scaled, tmp_path):
    decoder = load_decoder(scaled)
    assert decoder.spec.kv_scales
    assert float(decoder.layers[1].self_attn.k_scale[...]) == pytest.approx(0.1)
    assert float(decoder.layers[0].self_attn.v_scale[...]) == 0.5
    # Unused without an FP8 pool: the logits are those of the checkpoint without them.
    plain, _, _, _ = run_engine(FIXTURES / "qwen3")
    with_scales, _, _, _ = run_engine(scaled)
    np.testing.assert_array_equal(with_scales, plain)
    # With one, they change what the pool holds (small K scales saturate e4m3's range less
    # gracefully than none: the logits differ), and the run stays finite.
    fp8, _, _, _ = run_engine(scaled, kv="fp8_e4m3")
    unscaled, _, _, _ = run_engine(FIXTURES / "qwen3", kv="fp8_e4m3")
    assert np.isfinite(fp8).all() and not np.array_equal(fp8, unscaled)
    # Exported and converted with the checkpoint.
    written = hf_tensors(decoder)
    assert float(written["model.layers.1.self_attn.k_scale"][0]) == pytest.approx(0.1)  # as [1]
    save_orbax(decoder, scaled, tmp_path / "converted")
    shutil.copy(scaled / "greedy.json", tmp_path / "converted")
    again, _, _, _ = run_engine(tmp_path / "converted", kv="fp8_e4m3")
    np.testing.assert_array_equal(again, fp8)


def test_an_fp8_pool_saturates_instead_of_turning_nan():
    from swajax.memory.pool import stored

    x = jnp.asarray([1e6, -1e6, 3.0], jnp.float32)
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2):
        got = np.asarray(stored(x, dtype).astype(jnp.float32))
        top = float(jnp.finfo(dtype).max)
        np.testing.assert_array_equal(got, [top, -top, 3.0])
