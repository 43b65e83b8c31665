"""`swajax convert --to hf`: the decoder written back as a Hugging Face checkpoint.

Each load layout is inverted (`weights.Layout`), so an exported checkpoint holds the original's
tensors bit for bit under the original names (quantized ones dequantized, as the decoder holds
them); transformers itself loads every fixture's export to the fixture's logits within 1.2e-5
(`tools/check_hf_export.py`, run in the fixture environment: see BUILD_NOTES.md). Here: the
tensors, a sharded export, and the CLI round trip HF -> orbax -> HF -> logits.
"""

import json

import numpy as np
import pytest
from helpers import FIXTURES

from swajax.models import load_decoder
from swajax.models.checkpoint import Checkpoint
from swajax.models.export import hf_tensors, save_hf
from swajax.models.loading import checkpoint_files, ignored_patterns, read_config, spec_of

# Every load layout: stacked experts + sinks (gpt_oss), per-expert tensors (mimo), joined
# projections (step3p7), swapped pairs (gemma4), fused gate_up (llama4), plain (qwen3).
FAMILIES = ["gpt_oss", "mimo_v2_flash", "step3p7", "gemma4", "llama4", "qwen3", "gemma3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_export_holds_the_original_tensors(family):
    """Every tensor the loader does not skip by name comes back, bit for bit."""
    folder = FIXTURES / family
    exported = hf_tensors(load_decoder(folder))
    skipped = ignored_patterns(spec_of(folder), read_config(folder))
    source = Checkpoint(checkpoint_files(folder), skipped)
    for name, value in exported.items():
        np.testing.assert_array_equal(value, source.array(name), err_msg=name)
    assert source.unconsumed() == []


def test_quantized_weights_come_back_dequantized_on_request():
    exported = hf_tensors(load_decoder(FIXTURES / "gpt_oss_mxfp4", dequantize_weights=True))
    plain = hf_tensors(load_decoder(FIXTURES / "gpt_oss"))  # the same weights, unquantized
    assert set(exported) == set(plain)
    assert not any(n.endswith(("_blocks", "_scales")) for n in exported)


def test_a_sharded_export_loads_back(tmp_path):
    decoder = load_decoder(FIXTURES / "qwen3")
    save_hf(decoder, FIXTURES / "qwen3", tmp_path / "out", dtype="float32", max_shard_bytes=100_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    again = hf_tensors(load_decoder(tmp_path / "out"))
    for name, value in hf_tensors(decoder).items():
        np.testing.assert_array_equal(again[name], value)


@pytest.mark.parametrize("dequantize", [False, True])
def test_cli_round_trip_keeps_the_logits(cli, tmp_path, dequantize):
    """Published FP8 -> orbax -> Hugging Face: packed all the way (the config keeps its
    quantization_config), or dequantized by the first convert (--dequantize-weights); an
    orbax folder of packed weights cannot be dequantized later, which is a named error."""
    fixture = FIXTURES / "mimo_v2_flash_fp8"
    case = json.loads((fixture / "greedy.json").read_text())
    flags = ["--dequantize-weights"] if dequantize else []
    assert cli("convert", fixture, tmp_path / "orbax", *flags)[0] == 0
    code, out, _ = cli("convert", tmp_path / "orbax", tmp_path / "hf", "--to", "hf")
    assert code == 0 and "(hf, float32)" in out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert ("quantization_config" in config) != dequantize and config["dtype"] == "float32"
    ids = ",".join(map(str, case["prompt"]))
    code, _, _ = cli(
        "logits", "--model", tmp_path / "hf", "--prompt-ids", ids, "--out", tmp_path / "l.npy"
    )
    assert code == 0
    np.testing.assert_allclose(
        np.load(tmp_path / "l.npy"), np.load(fixture / "logits.npy"), atol=1e-4, rtol=0
    )
    if not dequantize:
        code, _, err = cli(
            "convert", tmp_path / "orbax", tmp_path / "again", "--to", "hf", "--dequantize-weights"
        )
        assert code == 2 and "dequantize them when converting" in err
