"""Build the Hugging Face oracle fixtures in tests/fixtures/ (tiny random models + their logits).

Run in a separate environment; the project itself never needs torch:

    python3 -m venv .hfenv
    .hfenv/bin/pip install torch==2.13.0          # CPU build, from local disk; install first
    .hfenv/bin/pip install transformers==5.24.0 safetensors numpy
    .hfenv/bin/python tools/make_fixtures.py

For each family it builds a tiny model (hidden 64, 2-4 layers, window 4-8 or chunk 4), draws
every weight again from N(0, 0.3^2) so that routing and windows matter, saves it with
`save_pretrained` (the hub's file layout), and records in float32 the logits of a fixed 24-token
prompt (`logits.npy`, [24, vocab]) and a greedy 8-token continuation (`greedy.json`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
import transformers as tf

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
PROMPT = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27, 88, 11, 60, 45, 77, 30,
          119, 9]  # fmt: skip
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)  # fmt: skip
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
    yield "mistral", tf.MistralConfig(**BASE, num_hidden_layers=2, sliding_window=6)
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


def build(cfg, seed=0):
    cfg = copy.deepcopy(cfg)  # from_config mutates the config it is given
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    ).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def main() -> None:
    for name, cfg in configs():
        model = build(cfg)
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        ids = torch.tensor([PROMPT])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float().numpy()
            out = model.generate(
                ids,
                max_new_tokens=8,
                do_sample=False,
                min_new_tokens=8,
                eos_token_id=None,
                pad_token_id=0,
            )
        np.save(folder / "logits.npy", logits.astype(np.float32))
        greedy = out[0, len(PROMPT) :].tolist()
        (folder / "greedy.json").write_text(json.dumps({"prompt": PROMPT, "greedy": greedy}))
        for extra in ("generation_config.json",):
            (folder / extra).unlink(missing_ok=True)
        print(name, logits.shape, greedy)


if __name__ == "__main__":
    main()
