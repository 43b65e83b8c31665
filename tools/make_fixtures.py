"""Build the Hugging Face oracle fixtures in tests/fixtures/ (tiny random models + their logits).

Run in a separate environment; the project itself never needs torch:

    python3 -m venv .hfenv
    .hfenv/bin/pip install torch==2.13.0          # CPU build, from local disk; install first
    .hfenv/bin/pip install transformers==5.24.0 safetensors numpy
    .hfenv/bin/python tools/make_fixtures.py

For each family it builds a tiny model (hidden 64, 2-4 layers, window 4-8 or chunk 4), draws
every weight again from N(0, 0.3^2) so that routing and windows matter, saves it with
`save_pretrained` (the hub's file layout), then optionally rewrites the folder into another form
the hub ships (a legacy config.json; MXFP4 or block-FP8 weights, packed here by our own code),
loads the folder back through transformers and records, from that reloaded model, in float32
the logits of a fixed 24-token prompt (`logits.npy`, [24, vocab]) and a greedy 8-token
continuation (`greedy.json`). So the oracle is always transformers' own reading of the files.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers as tf
from fixture_forms import (  # noqa: E402 - beside this script
    fp8_deepseek_v4,
    fp8_mimo,
    legacy_gemma3,
    legacy_gpt_oss,
    module_layout,
    mxfp4_gpt_oss,
    wrapped,
)

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
PROMPT = [
    5,
    17,
    99,
    3,
    42,
    64,
    8,
    120,
    33,
    71,
    2,
    90,
    15,
    56,
    101,
    27,
    88,
    11,
    60,
    45,
    77,
    30,
    119,
    9,
]
# DeepSeek-V4's compressors need a prompt that crosses many windows and compression boundaries.
LONG_PROMPT = [(7 * i * i + 3 * i + 11) % 125 + 3 for i in range(80)]
BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
TYPES = {"S": "sliding_attention", "F": "full_attention"}


def configs():
    yield (
        "qwen3",
        tf.Qwen3Config(
            **BASE,
            num_hidden_layers=3,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
            tie_word_embeddings=False,
        ),
    )
    yield from deepseek_v4_configs()
    yield "mistral", tf.MistralConfig(**BASE, num_hidden_layers=2, sliding_window=6)
    yield (
        "qwen2",
        tf.Qwen2Config(
            **BASE,
            num_hidden_layers=3,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
            tie_word_embeddings=False,
        ),
    )
    yield (
        "gpt_oss",
        tf.GptOssConfig(
            **{**BASE, "intermediate_size": 32, "max_position_embeddings": 131072},
            num_hidden_layers=4,
            sliding_window=6,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=[TYPES[c] for c in "SFSF"],
        ),
    )
    yield (
        "gemma3",
        tf.Gemma3TextConfig(
            **BASE,
            num_hidden_layers=4,
            sliding_window=6,
            query_pre_attn_scalar=16,
            layer_types=[TYPES[c] for c in "SSFS"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        ),
    )
    yield (
        "llama4",
        tf.Llama4TextConfig(
            **{**BASE, "intermediate_size": 32},
            intermediate_size_mlp=128,
            num_hidden_layers=4,
            attention_chunk_size=4,
            no_rope_layers=[1, 0, 1, 0],
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            floor_scale=8,
            attn_scale=0.1,
        ),
    )
    yield (
        "olmo3",
        tf.Olmo3Config(
            **BASE, num_hidden_layers=4, sliding_window=6, layer_types=[TYPES[c] for c in "SSFS"]
        ),
    )
    yield (
        "exaone4",
        tf.Exaone4Config(
            **BASE, num_hidden_layers=4, sliding_window=6, layer_types=[TYPES[c] for c in "SSSF"]
        ),
    )
    yield (
        "cohere2",
        tf.Cohere2Config(
            **BASE,
            num_hidden_layers=4,
            sliding_window=6,
            layer_types=[TYPES[c] for c in "SFSS"],
            logit_scale=0.25,
        ),
    )
    gemma4 = dict(
        **{**BASE, "head_dim": 16},
        sliding_window=6,
        global_head_dim=32,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=128,
        final_logit_softcapping=30.0,
    )
    # Every memory rule at once: full layers whose keys are their values (one global KV head),
    # the last two layers reading layers 2 and 3's KV, an MoE block, double-width MLPs.
    yield (
        "gemma4",
        tf.Gemma4TextConfig(
            **gemma4,
            num_hidden_layers=6,
            layer_types=[TYPES[c] for c in "SFSFSF"],
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
        ),
    )
    # The small E-size form: per-layer inputs and KV sharing, separate K and V on full layers.
    yield (
        "gemma4_e",
        tf.Gemma4TextConfig(
            **gemma4,
            num_hidden_layers=5,
            layer_types=[TYPES[c] for c in "SSFSF"],
            num_kv_shared_layers=2,
        ),
    )
    # No KV-shared layers and no per-layer inputs (the 26B / 31B form): the layers repeat
    # (S S F x 2), so they are scanned; a window wider than the chunks and pages of the tests.
    yield (
        "gemma4_unshared",
        tf.Gemma4TextConfig(
            **{**gemma4, "sliding_window": 10, "hidden_size_per_layer_input": 0},
            num_hidden_layers=6,
            layer_types=[TYPES[c] for c in "SSFSSF"],
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            num_kv_shared_layers=0,
        ),
    )
    # Step 3.x ships as a vision-language checkpoint: a tiny vision tower rides along (the text
    # model must ignore it). Sliding layers have 8 query heads, full ones 4; MoE layers 1-2
    # with a shared expert; per-layer SwiGLU clamps and RoPE bases / partial factors.
    yield (
        "step3p7",
        tf.Step3p7Config(
            text_config=dict(
                **BASE,
                num_hidden_layers=4,
                layer_types=[TYPES[c] for c in "FSSF"],
                sliding_window=6,
                num_sliding_attention_heads=8,
                mlp_layer_types=["dense", "sparse", "sparse", "dense"],
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                share_expert_dim=32,
                swiglu_limits=[None, 0.5, None, None],
                swiglu_limits_shared=[None, 0.5, 0.4, None],
                moe_router_scaling_factor=2.0,
                rope_theta=[5e6, 1e4, 1e4, 5e6],
                partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
            ),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
        ),
    )
    yield (
        "mimo_v2_flash",
        tf.MiMoV2FlashConfig(
            **{**BASE, "head_dim": 24},
            v_head_dim=16,
            num_hidden_layers=3,
            sliding_window_size=5,
            layer_types=[TYPES[c] for c in "FSS"],
            mlp_layer_types=["dense", "sparse", "sparse"],
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
        ),
    )


# DeepSeek-V4: every layer slides (sliding_window 8 / 10: W = 7 / 9); compressed layers add an
# entry per `compress_rate` tokens. Rates 4 and 8 divide the test page sizes; 3 and 6 divide
# neither them nor the chunk sizes. `index_topk` below the entries a long prompt makes, so the
# Lightning Indexer's choice matters; YaRN on the compressed rope of the first.
V4 = dict(
    vocab_size=128,
    hidden_size=64,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    q_lora_rank=32,
    partial_rotary_factor=0.25,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=8,
    index_head_dim=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    hc_mult=3,
    max_position_embeddings=4096,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


def deepseek_v4_configs():
    yield (
        "deepseek_v4",
        tf.DeepseekV4Config(
            **V4,
            num_hidden_layers=3,
            sliding_window=8,
            index_topk=3,
            layer_types=[HCA, CSA, SWA],
            mlp_layer_types=["hash_moe", "moe", "moe"],
            compress_rates={CSA: 4, HCA: 8},
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        ),
    )
    yield (
        "deepseek_v4_odd",
        tf.DeepseekV4Config(
            **V4,
            num_hidden_layers=4,
            sliding_window=10,
            index_topk=4,
            layer_types=[CSA, HCA, SWA, CSA],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            compress_rates={CSA: 3, HCA: 6},
        ),
    )
    # Windows two to four times the rates (W = 15 / 23): a query's window covers several
    # compressed windows, so entries and window keys overlap in position. The first repeats
    # C H after its first layer (scanned); top-k below the entries of the long prompt.
    yield (
        "deepseek_v4_wide",
        tf.DeepseekV4Config(
            **V4,
            num_hidden_layers=5,
            sliding_window=16,
            index_topk=5,
            layer_types=[SWA, CSA, HCA, CSA, HCA],
            mlp_layer_types=["hash_moe"] + ["moe"] * 4,
            compress_rates={CSA: 4, HCA: 8},
        ),
    )
    yield (
        "deepseek_v4_wide_odd",
        tf.DeepseekV4Config(
            **V4,
            num_hidden_layers=4,
            sliding_window=24,
            index_topk=4,
            layer_types=[CSA, HCA, HCA, CSA],
            mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
            compress_rates={CSA: 3, HCA: 12},
        ),
    )


# Fixtures that are another family's model rewritten into a form the hub ships.
VARIANTS = {
    "gemma3_legacy": ("gemma3", legacy_gemma3),
    "gpt_oss_legacy": ("gpt_oss", legacy_gpt_oss),
    "gpt_oss_mxfp4": ("gpt_oss", mxfp4_gpt_oss),
    "mimo_v2_flash_fp8": ("mimo_v2_flash", fp8_mimo),
    "deepseek_v4_fp8": ("deepseek_v4", fp8_deepseek_v4),
    "gemma3_vl_modules": ("gemma3_vl", module_layout),
}
WRAPPERS = ("gemma3", "gemma4", "llama4")  # model types loaded as image-text-to-text


def auto_class(model_type: str):
    # Step 3.x exists in transformers only as a vision-language model; the wrappers' configs
    # name the multimodal model type.
    vl = model_type == "step3p7" or model_type in WRAPPERS
    return tf.AutoModelForImageTextToText if vl else tf.AutoModelForCausalLM


def build(cfg, seed=0):
    cfg = copy.deepcopy(cfg)  # from_config mutates the config it is given
    torch.manual_seed(seed)
    model = (
        auto_class(cfg.model_type)
        .from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        if cfg.model_type in ("step3p7", "deepseek_v4"):  # routers' choice bias: a buffer
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(torch.randn(b.shape, generator=gen) * 0.3)
                if name.endswith("tid2eid"):  # hash routing: distinct experts per token id
                    rows = [torch.randperm(cfg.n_routed_experts, generator=gen) for _ in b]
                    b.copy_(torch.stack(rows)[:, : b.shape[1]])
    return model


def reload(folder: Path):
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    return (
        auto_class(model_type)
        .from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )


# Four KV heads (eight query heads) of another fixture's config: tensor parallel over four
# devices, in one process or across two (tests/multihost); one MoE family, one dense.
KV4 = {"gpt_oss_kv4": "gpt_oss", "qwen3_kv4": "qwen3"}


# Every family's window also wider than the tests' chunks (8) and pages (4) and two thirds of
# the prompt (the base fixtures' windows, 5 to 6 tokens, are narrower than all of those).
WIDE = (
    "qwen3",
    "qwen2",
    "mistral",
    "gpt_oss",
    "gemma3",
    "olmo3",
    "exaone4",
    "cohere2",
    "mimo_v2_flash",
    "step3p7",
    "gemma4_e",
    "llama4",
)
WIDE_WINDOW = 16


def widened(cfg):
    """A copy of `cfg` whose sliding window (or attention chunk) is WIDE_WINDOW tokens."""
    cfg = copy.deepcopy(cfg)
    target = getattr(cfg, "text_config", None) or cfg
    found = False
    for attr in ("sliding_window", "sliding_window_size", "attention_chunk_size"):
        if getattr(target, attr, None) is not None:
            setattr(target, attr, WIDE_WINDOW)
            found = True
    if not found:
        raise SystemExit(f"{cfg.model_type}: no window field to widen")
    return cfg


def fixtures():
    """(folder name, model built from config, rewrite of the saved folder or None)."""
    built = dict(configs())
    for name, base in KV4.items():
        built[name] = copy.deepcopy(built[base])
        built[name].num_attention_heads, built[name].num_key_value_heads = 8, 4
    for name in WIDE:
        built[f"{name}_wide"] = widened(built[name])
    built.update(wrapped(built))
    for name, cfg in built.items():
        yield name, cfg, None
    for name, (base, rewrite) in VARIANTS.items():
        yield name, built[base], rewrite


def check_indexer_ties(model, ids) -> None:
    """The Lightning Indexer keeps the top-k scores; where the k-th and the next tie (every
    head's ReLU at 0 gives exact zeros) torch breaks the tie its own way. A fixture must not
    depend on that: fail if any query of the forward or the greedy run has such a tie."""
    seen = []
    for layer in model.model.layers:
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            rate, k = comp.compress_rate, comp.indexer.index_topk
            hook = lambda mod, args, out, rate=rate, k=k: seen.append((out[0], rate, k))  # noqa
            comp.indexer.scorer.register_forward_hook(hook)
    with torch.no_grad():
        model(input_ids=ids)
        model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    for scores, rate, k in seen:
        start = ids.shape[1] - scores.shape[0] if scores.shape[0] > 1 else None
        for row, s in enumerate(scores):
            n = (row + 1) // rate if start is not None else s.shape[0]
            top = torch.sort(s[:n], descending=True).values
            if n > k and top[k - 1] == top[k]:
                raise SystemExit(f"indexer tie at query row {row}: {top[: k + 1].tolist()}")


def check_causal(model, ids, logits) -> None:
    """The oracle must be causal: each position's logits from the whole prompt equal those of
    the prompt cut after it and those of a token-by-token run through transformers' cache
    (its cached generation). Fail if not, naming the first position that differs."""
    with torch.no_grad():
        cut = [model(input_ids=ids[:, : t + 1]).logits[0, -1] for t in range(ids.shape[1])]
        out = model(input_ids=ids[:, :1], use_cache=True)
        steps, cache = [out.logits[0, -1]], out.past_key_values
        for t in range(1, ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits[0, -1])
            cache = out.past_key_values
    for label, rows in (("prefix-by-prefix", cut), ("token-by-token", steps)):
        err = (torch.stack(rows).numpy() - logits).__abs__().max(axis=1)
        if err.max() > 1e-4:
            raise SystemExit(f"{label} logits differ from the full forward at {err.argmax()}")


def main() -> None:
    only = set(sys.argv[1:])  # optional: the fixtures to rebuild (default: all)
    for name, cfg, rewrite in fixtures():
        if only and name not in only:
            continue
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        build(cfg).save_pretrained(folder)
        if rewrite is not None:
            rewrite(folder)
        model = reload(folder)
        if name.startswith("llama4_vl"):
            # transformers 5.24's Llama4ForConditionalGeneration.forward fails without an image
            # (it reads `image_outputs` from a text-only output): run its language model, as
            # loaded from the same files, instead.
            model = model.language_model
        prompt = LONG_PROMPT if name.startswith("deepseek_v4") else PROMPT
        ids = torch.tensor([prompt])
        # transformers 5.24's Gemma 4 runs KV-shared layers only with hidden states requested
        # (the same math; it skips a slicing shortcut)
        extra = {"output_hidden_states": True} if name.startswith("gemma4") else {}
        with torch.no_grad():
            logits = model(input_ids=ids, **extra).logits[0].float().numpy()
            out = model.generate(
                ids,
                **extra,
                max_new_tokens=8,
                do_sample=False,
                min_new_tokens=8,
                eos_token_id=None,
                pad_token_id=0,
            )
        if name.startswith("deepseek_v4"):
            check_indexer_ties(model, ids)
            check_causal(model, ids, logits)
        np.save(folder / "logits.npy", logits.astype(np.float32))
        greedy = out[0, len(prompt) :].tolist()
        (folder / "greedy.json").write_text(json.dumps({"prompt": prompt, "greedy": greedy}))
        for extra in ("generation_config.json",):
            (folder / extra).unlink(missing_ok=True)
        print(name, logits.shape, greedy)


if __name__ == "__main__":
    main()
