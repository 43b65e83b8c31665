"""The checkpoint loader: every tensor used or knowingly ignored, quantized formats, errors that
name what is wrong, and a load whose host memory stays near one tensor."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from helpers import FIXTURES, ROOT
from safetensors.numpy import load_file, save_file

from swajax.config import ConfigError
from swajax.models import LoadError, load_decoder, quantization as q
from swajax.models.checkpoint import Checkpoint


def _copy(tmp_path, family):
    dst = tmp_path / family
    shutil.copytree(FIXTURES / family, dst)
    return dst


def _edit(folder, fn):
    weights = load_file(str(folder / "model.safetensors"))
    fn(weights)
    save_file(weights, str(folder / "model.safetensors"))


def _edit_config(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_a_tensor_the_model_does_not_read_is_an_error(tmp_path):
    """What made Qwen 2 silently wrong: bias tensors present, never read."""
    dst = _copy(tmp_path, "mistral")
    _edit(dst, lambda w: w.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(64, "f4")}))
    with pytest.raises(LoadError, match=r"does not use.*model.layers.0.self_attn.q_proj.bias"):
        load_decoder(dst)


def test_tensors_transformers_ignores_are_ignored(tmp_path):
    dst = _copy(tmp_path, "mimo_v2_flash")
    extra = {
        "model.mtp.layers.0.proj.weight": np.zeros((4, 4), "f4"),  # MiMo's MTP head
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(8, "f4"),  # old RoPE buffer
    }
    _edit(dst, lambda w: w.update(extra))
    load_decoder(dst)
    tied = _copy(tmp_path, "gemma3")  # tied embeddings with a stored copy of the head
    _edit(tied, lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"]}))
    load_decoder(tied)


def test_unknown_quantization_method_is_named(tmp_path):
    dst = _copy(tmp_path, "qwen3")
    _edit_config(dst, lambda c: c.update(quantization_config={"quant_method": "gptq"}))
    with pytest.raises(ConfigError, match="quant_method 'gptq' is not supported"):
        load_decoder(dst)


@pytest.mark.parametrize("block", [[16], [0, 16], "16x16", [16.0, 16]])
def test_bad_fp8_block_size_is_named(tmp_path, block):
    dst = _copy(tmp_path, "mimo_v2_flash_fp8")
    _edit_config(dst, lambda c: c["quantization_config"].update(weight_block_size=block))
    with pytest.raises(ConfigError, match="weight_block_size"):
        load_decoder(dst)


def test_fp8_scales_that_do_not_fit_the_blocks(tmp_path):
    dst = _copy(tmp_path, "mimo_v2_flash_fp8")
    _edit_config(dst, lambda c: c["quantization_config"].update(weight_block_size=[32, 32]))
    with pytest.raises(LoadError, match=r"scale grid .* 32x32 blocks"):
        load_decoder(dst)


def test_fp8_without_its_scale(tmp_path):
    dst = _copy(tmp_path, "mimo_v2_flash_fp8")
    # safetensors.numpy cannot read float8: rename the scale inside the header (same length).
    data = (dst / "model.safetensors").read_bytes()
    name = b"model.layers.0.self_attn.q_proj.weight_scale_inv"
    assert data.count(name) == 1
    (dst / "model.safetensors").write_bytes(data.replace(name, name[:-3] + b"xyz"))
    with pytest.raises(LoadError, match="q_proj.weight_scale_inv"):
        load_decoder(dst)


def test_mxfp4_blocks_need_the_mxfp4_method(tmp_path):
    dst = _copy(tmp_path, "gpt_oss_mxfp4")
    _edit_config(dst, lambda c: c.pop("quantization_config"))
    with pytest.raises(LoadError, match="MXFP4 blocks"):
        load_decoder(dst)


def test_mxfp4_dequantization_by_hand():
    """Two values per byte, low nibble first; scale 2^(s - 127); output transposed."""
    blocks = np.zeros((1, 2, 1, 16), np.uint8)
    blocks[0, 0, 0, 0] = 0x2F  # low nibble 15 (-6.0), high nibble 2 (1.0)
    blocks[0, 1, 0, 15] = 0x70  # low 0 (0.0), high 7 (6.0)
    scales = np.array([[[128], [125]]], np.uint8)  # x2 and x1/4
    out = q.mxfp4(blocks, scales, np.float32)
    assert out.shape == (1, 32, 2)
    want = np.zeros((1, 32, 2), np.float32)
    want[0, 0, 0], want[0, 1, 0] = -12.0, 2.0
    want[0, 31, 1] = 1.5
    np.testing.assert_array_equal(out, want)


def test_block_fp8_with_partial_blocks():
    """DeepSeek-style grids cover a ragged edge with ceil(rows / bm) x ceil(cols / bn) scales."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 7)).astype(ml_dtypes.float8_e4m3fn)
    s = rng.uniform(0.5, 2.0, size=(3, 2)).astype(np.float32)
    out = q.block_fp8(w, s, (2, 4), np.float32)
    for i in range(5):
        for j in range(7):
            assert out[i, j] == np.float32(w[i, j]) * s[i // 2, j // 4]


def test_a_tensor_in_two_files_is_refused(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"x": np.zeros(2, "f4")}, str(a))
    save_file({"x": np.ones(2, "f4")}, str(b))
    with pytest.raises(LoadError, match="'x' appears in both"):
        Checkpoint([a, b])


def test_a_bad_header_entry_is_named(tmp_path):
    header = json.dumps({"x": {"dtype": "F32", "shape": "big", "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(LoadError, match="bad header entry for tensor 'x'"):
        Checkpoint([path])


LAZY = textwrap.dedent(
    """
    import json, sys
    from swajax.models import load_decoder
    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    load_decoder(sys.argv[1] + "/warm")  # imports, first programs: not the load under test
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = rss("VmRSS:")
    decoder = load_decoder(sys.argv[1] + "/big", dtype="bfloat16")
    print(json.dumps({"growth": rss("VmHWM:") - before}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_a_large_checkpoint_loads_one_tensor_at_a_time(tmp_path):
    """A 4-file, ~320 MB bf16 checkpoint loaded as bf16: the parameters themselves stay in host
    memory (the CPU is the device here), so the peak may exceed them only by about one tensor;
    reading the files whole, as the loader once did, would add the whole checkpoint again."""
    hidden, vocab, layers = 1024, 32768, 8
    cfg = json.loads((FIXTURES / "mistral" / "config.json").read_text())
    cfg.update(
        hidden_size=hidden,
        intermediate_size=4096,
        vocab_size=vocab,
        num_hidden_layers=layers,
        head_dim=64,
        num_attention_heads=16,
        num_key_value_heads=4,
    )
    warm = tmp_path / "warm"
    shutil.copytree(FIXTURES / "mistral", warm)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (1024, hidden),
                p + "self_attn.k_proj.weight": (256, hidden),
                p + "self_attn.v_proj.weight": (256, hidden),
                p + "self_attn.o_proj.weight": (hidden, 1024),
                p + "mlp.gate_proj.weight": (4096, hidden),
                p + "mlp.up_proj.weight": (4096, hidden),
                p + "mlp.down_proj.weight": (hidden, 4096),
            }
        )
    names = sorted(shapes)
    files = {f"model-{k + 1:05d}-of-00004.safetensors": names[k::4] for k in range(4)}
    for file, keys in files.items():
        save_file(
            {
                k: rng.standard_normal(shapes[k], np.float32).astype(ml_dtypes.bfloat16)
                for k in keys
            },
            str(big / file),
        )
    index = {"weight_map": {k: f for f, keys in files.items() for k in keys}}
    (big / "model.safetensors.index.json").write_text(json.dumps(index))
    total = sum(2 * int(np.prod(s)) for s in shapes.values())
    largest = 2 * max(int(np.prod(s)) for s in shapes.values())
    script = tmp_path / "lazy.py"
    script.write_text(LAZY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    # bf16 params (= total) + one tensor converted + allocator slack
    assert growth <= total + 2 * largest + 64 * 2**20, (growth / 2**20, total / 2**20)


class _Rows:
    """A stored [out, in] tensor that records which of its rows each read asks for."""

    def __init__(self, value, log):
        self.value, self.log, self.shape = value, log, value.shape

    def __getitem__(self, rows):
        self.log.append(np.asarray(rows).tolist())
        return self.value[rows]


def test_stacked_experts_read_only_each_shards_rows():
    """Per-expert gate / up tensors stacked, interleaved in pairs and split over two devices:
    each device's shard reads only the stored rows that land in it, and the result is the
    whole-tensor stacking's."""
    from flax import nnx

    from swajax.models.sharding import kv_mesh
    from swajax.models.weights import PAIRED, WeightLoader, interleave_halves

    experts, hidden, inter = 3, 4, 8
    rng = np.random.default_rng(0)
    gates = [rng.normal(size=(inter, hidden)).astype(np.float32) for _ in range(experts)]
    ups = [rng.normal(size=(inter, hidden)).astype(np.float32) for _ in range(experts)]
    log: list = []
    stored = [[_Rows(g, log), _Rows(u, log)] for g, u in zip(gates, ups)]

    class Holder(nnx.Module):
        def __init__(self):
            self.mlp = nnx.Module()
            self.mlp.gate_up = nnx.Param(np.zeros((experts, hidden, 2 * inter), np.float32))

    holder = Holder()
    loader = WeightLoader(Checkpoint([]), holder, mesh=kv_mesh(2))
    names = [["g", "u"]] * experts
    loader._put_stacked(holder.mlp.gate_up, names, stored, PAIRED, check=True)
    got = np.asarray(holder.mlp.gate_up[...])
    want = np.stack([interleave_halves(np.concatenate([g.T, u.T], -1)) for g, u in zip(gates, ups)])
    np.testing.assert_array_equal(got, want)
    # Each device holds 8 of 16 interleaved columns: rows 0-3 (device 0) or 4-7 (device 1) of
    # both gate and up; no read asks for rows of the other half.
    assert sorted(map(tuple, log)) == sorted([(0, 1, 2, 3)] * 6 + [(4, 5, 6, 7)] * 6)
