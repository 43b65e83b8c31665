"""Quantized checkpoints stay quantized on the device: MXFP4 experts (GPT-OSS) and block-FP8
projections and experts (MiMo-V2-Flash) hold the checkpoint's bytes, compute the logits that
dequantizing at load computes, and export back to the very tensors they were read from."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from helpers import FIXTURES
from test_models import rel_err, run_engine

from swajax.models import load_decoder
from swajax.models.checkpoint import Checkpoint, LoadError, read_header
from swajax.models.decoder import Decoder
from swajax.models.export import hf_tensors, write_safetensors
from swajax.models.footprint import footprint
from swajax.models.loading import decoder_spec, read_config
from swajax.models.sharding import kv_mesh

QUANTIZED = ["gpt_oss_mxfp4", "mimo_v2_flash_fp8"]


def device_bytes(decoder) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(nnx.state(decoder)))


def tensor_bytes(folder) -> int:
    total = 0
    for file in folder.glob("*.safetensors"):
        _, header = read_header(file)
        total += sum(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values())
    return total


@pytest.mark.parametrize("name", QUANTIZED)
def test_the_device_holds_the_checkpoints_bytes(name):
    path = FIXTURES / name
    kept = device_bytes(load_decoder(path))
    assert abs(kept / tensor_bytes(path) - 1) <= 0.03
    # Dequantized at load (float32 here) the same model is more than twice the size.
    assert device_bytes(load_decoder(path, dequantize_weights=True)) > 2 * kept


@pytest.mark.parametrize("name", QUANTIZED)
def test_kept_quantized_computes_what_dequantizing_at_load_computes(name):
    path = FIXTURES / name
    kept, out_kept, greedy, _ = run_engine(path)
    loaded, out_loaded, _, _ = run_engine(path, dequantize_weights=True)
    assert rel_err(kept, loaded) <= 1e-6
    assert rel_err(kept, np.load(path / "logits.npy")) <= 1e-4  # transformers' dequantized
    assert out_kept == out_loaded == greedy


@pytest.mark.parametrize("name", QUANTIZED)
def test_export_writes_back_the_tensors_it_read(name):
    path = FIXTURES / name
    written = hf_tensors(load_decoder(path))
    stored = Checkpoint([path / "model.safetensors"])
    assert sorted(written) == stored.names()
    for n in stored.names():
        a, b = written[n], stored.array(n)
        assert a.dtype == b.dtype and a.shape == b.shape, n
        assert a.tobytes() == b.tobytes(), n


def test_sharded_quantized_weights_match_one_device():
    """Float8 kernels split like their float forms; block scales split where the grid divides
    over the devices and are replicated where it does not (`sharding.fitted`)."""
    path = FIXTURES / "mimo_v2_flash_fp8"
    one, out_one, _, _ = run_engine(path)
    mesh = kv_mesh(2)
    decoder = load_decoder(path, mesh=mesh)
    kernel = decoder.layers[0].self_attn.q_proj.kernel.get_value()
    assert kernel.dtype == jnp_fp8 and len(kernel.sharding.device_set) == 2
    two, out_two, _, _ = run_engine(path, mesh=mesh)
    assert rel_err(two, one) <= 1e-5 and out_two == out_one


jnp_fp8 = np.dtype(ml_dtypes.float8_e4m3fn)


def test_a_plain_tensor_where_the_config_says_fp8_is_named(tmp_path):
    src = FIXTURES / "mimo_v2_flash_fp8"
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_bytes((src / "config.json").read_bytes())
    stored = Checkpoint([src / "model.safetensors"])
    tensors = {n: np.asarray(stored.array(n)) for n in stored.names()}
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].astype(np.float32) * tensors.pop(f"{name}_scale_inv")[0, 0]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(LoadError, match=rf"{name}.*not float8.*dequantize_weights"):
        load_decoder(folder)
    load_decoder(folder, dequantize_weights=True)  # the escape hatch reads it in any form


MID_SIZE = {
    "gpt_oss_mxfp4": dict(
        hidden_size=512,
        intermediate_size=512,
        num_local_experts=16,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=2048,
    ),
    "mimo_v2_flash_fp8": dict(
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        n_routed_experts=16,
        vocab_size=2048,
    ),
}


def _random_like(path, x, rng):
    name = "/".join(str(getattr(p, "key", p)) for p in path)
    if x.dtype == np.uint8:  # MXFP4 scales near 2^0; blocks any byte
        low, high = (120, 128) if "scales" in name else (0, 256)
        return rng.integers(low, high, x.shape).astype(np.uint8)
    values = rng.normal(0, 0.05, x.shape)
    if name.endswith("scale"):  # FP8 block scales
        values = rng.uniform(0.5, 2.0, x.shape) / 448
    return values.astype(x.dtype)


@pytest.mark.parametrize("name", QUANTIZED)
def test_a_mid_size_checkpoint_holds_its_published_bytes(tmp_path, name):
    """A synthetic checkpoint of ~20 MB in the hub's form (quantized tensors as the method
    packs them, everything else bfloat16) loads within 3% of its tensor bytes, where
    dequantizing to bfloat16 would take far more (MXFP4: 3x here, FP8: 1.8x)."""
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    cfg.update(MID_SIZE[name], dtype="bfloat16")
    if name.startswith("mimo"):
        cfg["quantization_config"]["weight_block_size"] = [128, 128]
    decoder = Decoder(decoder_spec(cfg, dtype="bfloat16"))
    rng = np.random.default_rng(0)
    graphdef, state = nnx.split(decoder)
    state = jax.tree_util.tree_map_with_path(
        lambda p, x: _random_like(p, np.asarray(x), rng), state
    )
    tensors = hf_tensors(nnx.merge(graphdef, state))
    quantized_dtypes = (np.uint8, ml_dtypes.float8_e4m3fn)
    tensors = {
        n: v
        if v.dtype in quantized_dtypes or n.endswith("scale_inv")
        else v.astype(ml_dtypes.bfloat16)
        for n, v in tensors.items()
    }
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    write_safetensors(folder / "model.safetensors", tensors)
    on_disk = tensor_bytes(folder)
    assert on_disk > 10e6
    kept = device_bytes(load_decoder(folder, dtype="bfloat16"))
    assert abs(kept / on_disk - 1) <= 0.03, (kept, on_disk)
    assert footprint(decoder_spec(cfg, dtype="bfloat16")).weight_bytes == kept
    full = footprint(decoder_spec(cfg, dtype="bfloat16", dequantize_weights=True)).weight_bytes
    assert full > {"gpt_oss_mxfp4": 2.5, "mimo_v2_flash_fp8": 1.6}[name] * kept, full / kept


@pytest.mark.parametrize("name", [*QUANTIZED, "gemma3_vl", "llama4", "step3p7"])
@pytest.mark.parametrize("dequantize", [False, True])
def test_the_footprint_counts_what_a_load_holds(name, dequantize):
    """One truth for weight bytes: the abstract decoder's, exactly what the load holds."""
    path = FIXTURES / name
    spec = decoder_spec(read_config(path), dtype="bfloat16", dequantize_weights=dequantize)
    held = device_bytes(load_decoder(path, dtype="bfloat16", dequantize_weights=dequantize))
    assert footprint(spec).weight_bytes == held


def test_generate_reports_the_bytes_it_holds(cli):
    """`generate --json` reports the parameters' device bytes; --dequantize-weights the old
    path's, with the same greedy tokens."""
    runs = []
    for flags in ([], ["--dequantize-weights"]):
        code, out, _ = cli(
            "generate",
            "--model",
            FIXTURES / "gpt_oss_mxfp4",
            "--prompt-ids",
            "1,2,3,4,5",
            "--max-tokens",
            "4",
            "--json",
            *flags,
        )
        assert code == 0
        lines = [json.loads(line) for line in out.splitlines()]
        runs.append((lines[0]["tokens"], lines[-1]["summary"]["weight_bytes"]))
    (kept_tokens, kept), (tokens, dequantized) = runs
    assert kept_tokens == tokens
    assert kept == footprint(decoder_spec(read_config(FIXTURES / "gpt_oss_mxfp4"))).weight_bytes
    assert dequantized > 2 * kept
