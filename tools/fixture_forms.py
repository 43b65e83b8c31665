"""The forms the hub ships a family in, made from a fixture transformers saved: legacy config
spellings, MXFP4 and block-FP8 weights (packed by our own code), and the multimodal
`*ForConditionalGeneration` wrappers in both key layouts. Used by tools/make_fixtures.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers as tf


def legacy_gemma3(folder: Path) -> None:
    """The config form of the Gemma 3 hub checkpoints: a sliding pattern, a local RoPE base and
    one `rope_scaling` (which applies to the global layers only), no layer_types."""
    cfg = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "_sliding_window_pattern"):
        cfg.pop(key, None)
    cfg.update(
        sliding_window_pattern=3,  # layers 0, 1, 3 sliding, 2 global: the same SSFS
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def legacy_gpt_oss(folder: Path) -> None:
    """gpt-oss as published: `rope_scaling` + `rope_theta` instead of `rope_parameters`."""
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


FP4 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)


def pack_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., R, C] float -> blocks [..., R, C/32, 16] uint8 (low nibble first) and e8m0 scales
    [..., R, C/32]: each group of 32 scaled by 2^e so that its largest value fits 6."""
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.maximum(np.abs(groups).max(-1), 1e-30)
    e = np.ceil(np.log2(amax / 6.0)).astype(np.int32)
    scaled = groups / np.exp2(e)[..., None]
    codes = np.abs(scaled[..., None] - FP4[None, :8] * np.sign(scaled)[..., None]).argmin(-1)
    codes = np.where(np.signbit(scaled) & (codes > 0), codes + 8, codes).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (e + 127).astype(np.uint8)


def mxfp4_gpt_oss(folder: Path) -> None:
    """GPT-OSS as published: expert weights in MXFP4 (`*_blocks` / `*_scales`)."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = weights.pop(name)  # [E, in, out] as transformers holds it; stored [E, out, in]
        blocks, scales = pack_mxfp4(np.swapaxes(w, 1, 2))
        weights[f"{name}_blocks"], weights[f"{name}_scales"] = blocks, scales
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


FP8_BLOCK = (16, 16)


def fp8_mimo(folder: Path) -> None:
    """MiMo-V2-Flash as published: linear weights in float8 e4m3, one float32 inverse scale per
    16x16 block (`weight_scale_inv`); router, norms, embeddings and head stay float."""
    _block_fp8(folder, lambda name: name.endswith("proj.weight"))


def fp8_deepseek_v4(folder: Path) -> None:
    """DeepSeek-V4 in block FP8 as published: attention projections (wq_a, wq_b, wkv, wo_a,
    wo_b, the indexer's wq_b) and every expert in float8 e4m3 with an inverse scale per 16x16
    block; the compressors' and indexer's KV / gate / weight projections, routers, norms,
    embeddings and head stay float (transformers' `_keep_in_fp32_modules` lists the former)."""
    import re

    kept = re.compile(
        r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|indexer\.wq_b|experts\.\d+\.w[123]"
        r"|shared_experts\.w[123])\.weight$"
    )
    _block_fp8(folder, lambda name: bool(kept.search(name)) and ".compressor." not in name)


def _block_fp8(folder: Path, quantized) -> None:
    """Rewrite the tensors `quantized(name)` picks in float8 e4m3 with a float32 inverse scale
    per FP8_BLOCK block, and say so in config.json's `quantization_config`."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    bm, bn = FP8_BLOCK
    for name in list(weights):
        if not quantized(name):
            continue
        w = weights[name].float()
        rows, cols = w.shape
        grid = w.reshape(rows // bm, bm, cols // bn, bn)
        scale = grid.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        q = (grid / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
        weights[name], weights[f"{name}_scale_inv"] = q, scale.float().contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(FP8_BLOCK),
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


SIGLIP = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)


def wrapped(built: dict):
    """The published multimodal forms: each text fixture's config inside its family's
    `*ForConditionalGeneration` wrapper with a tiny vision (and audio) tower. transformers 5.24
    saves Gemma 3 and Llama 4 in the hub's layout (`language_model.model.*`, towers at the top)
    and Gemma 4 as its modules (`model.language_model.*`); the weights are drawn afresh."""
    yield (
        "gemma3_vl",
        tf.Gemma3Config(
            text_config=built["gemma3"].to_dict(), vision_config=SIGLIP, mm_tokens_per_image=4
        ),
    )
    vision = dict(SIGLIP, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    yield "llama4_vl", tf.Llama4Config(text_config=built["llama4"].to_dict(), vision_config=vision)
    yield (
        "gemma4_vl",
        tf.Gemma4Config(
            text_config=built["gemma4_e"].to_dict(),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
                patch_size=4,
                position_embedding_size=64,
            ),
            audio_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                subsampling_conv_channels=[8, 4],
                output_proj_dims=32,
            ),
        ),
    )


def module_layout(folder: Path) -> None:
    """The wrapper's other layout in the wild: its module paths as transformers 5 names them
    (`model.language_model.*`, `model.vision_tower.*`, `model.multi_modal_projector.*`,
    `lm_head.*`), where `save_pretrained` writes the hub's `language_model.model.*`."""
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    renamed = {}
    for name, value in load_file(file).items():
        if name.startswith("language_model.model."):
            name = "model.language_model." + name[len("language_model.model.") :]
        elif name.startswith("language_model.lm_head."):
            name = name[len("language_model.") :]
        else:
            name = "model." + name
        renamed[name] = value
    save_file(renamed, file, metadata={"format": "pt"})
