"""Built-in model configurations: real published configs (attention-relevant fields) and tiny ones.

Each published preset is written in the form of its hub `config.json` and goes through the same
parser as a user's file, so a preset exercises `config.parse_hf_config` exactly as a download would.
Only the fields that decide the attention / KV layout are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swajax.config import HybridConfig, parse_hf_config


def _alternating(n: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


def _gpt_oss(num_layers: int, experts: int) -> dict[str, Any]:
    # huggingface.co/openai/gpt-oss-20b and /gpt-oss-120b config.json: the two differ only in
    # num_hidden_layers (24 / 36) and num_local_experts (32 / 128). Experts ship in MXFP4.
    return {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "hidden_size": 2880,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": _alternating(num_layers),
        "rope_theta": 150000,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        "max_position_embeddings": 131072,
        "vocab_size": 201088,
        "intermediate_size": 2880,
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "mxfp4"},
    }


# huggingface.co/XiaomiMiMo/MiMo-V2-Flash config.json: 48 layers, full attention at layers
# 0, 5, 11, ..., 47 (hybrid_layer_pattern 0), SWA elsewhere; SWA 8 KV heads, full 4.
_MIMO_FULL = {0, 5, 11, 17, 23, 29, 35, 41, 47}
MIMO_V2_FLASH = {
    "model_type": "mimo_v2_flash",
    "architectures": ["MiMoV2FlashForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 48,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 192,
    "v_head_dim": 128,
    "swa_num_attention_heads": 64,
    "swa_num_key_value_heads": 8,
    "swa_head_dim": 192,
    "swa_v_head_dim": 128,
    "sliding_window_size": 128,
    "hybrid_layer_pattern": [0 if i in _MIMO_FULL else 1 for i in range(48)],
    "add_swa_attention_sink_bias": True,
    "add_full_attention_sink_bias": False,
    "vocab_size": 151936,
    # Layer 0 dense, the rest 256 experts top-8; projections and experts in 128x128 block FP8.
    "intermediate_size": 16384,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "mlp_layer_types": ["dense"] + ["sparse"] * 47,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}

# huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (text_config): 48 layers,
# every 4th layer NoPE + global attention, the rest chunked with attention_chunk_size 8192.
LLAMA_4_SCOUT = {
    "model_type": "llama4",
    "architectures": ["Llama4ForConditionalGeneration"],
    "text_config": {
        "model_type": "llama4_text",
        "hidden_size": 5120,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(48)],
        "rope_theta": 500000.0,
        "vocab_size": 202048,
        "intermediate_size": 8192,  # per expert; 16 experts top-1 plus a shared one, every layer
        "intermediate_size_mlp": 16384,
        "num_local_experts": 16,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1,
        "tie_word_embeddings": False,
    },
}

# huggingface.co/google/gemma-3-27b-it config.json (text_config): 62 layers, 5 sliding : 1 full,
# sliding_window 1024, 32 query heads over 16 KV heads of dim 128.
GEMMA_3_27B = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 168,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "vocab_size": 262208,
        "intermediate_size": 21504,
    },
}


# Gemma 4 (google/gemma-4-31B-it, /gemma-4-26B-A4B-it, /gemma-4-E4B-it config.json, text_config):
# 5 sliding : 1 full; sliding layers 256-dim heads, full layers 512-dim heads whose keys are
# their values (31B, 26B) over fewer KV heads; the E4B reads the KV of its last 18 layers from
# earlier layers.
def _gemma4(n, hidden, heads, kv, global_kv, window, **extra) -> dict[str, Any]:
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": hidden,
            "num_hidden_layers": n,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "num_global_key_value_heads": global_kv,
            "head_dim": 256,
            "global_head_dim": 512,
            "sliding_window": window,
            "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (n // 6),
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1000000.0,
                    "rope_type": "proportional",
                },
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "final_logit_softcapping": 30.0,
            "vocab_size": 262144,
            **extra,
        },
    }


GEMMA_4_31B = _gemma4(60, 5376, 32, 16, 4, 1024, attention_k_eq_v=True, intermediate_size=21504)
GEMMA_4_26B_A4B = _gemma4(
    30,
    2816,
    16,
    8,
    2,
    1024,
    attention_k_eq_v=True,
    enable_moe_block=True,
    num_experts=128,
    top_k_experts=8,
    moe_intermediate_size=704,
)
GEMMA_4_E4B = _gemma4(
    42,
    2560,
    8,
    2,
    None,
    512,
    attention_k_eq_v=False,
    num_kv_shared_layers=18,
    hidden_size_per_layer_input=256,
)

# huggingface.co/stepfun-ai/Step-3.5-Flash config.json: 45 layers, full attention every 4th
# (from layer 0), sliding window 512; sliding layers have 96 query heads, full ones 64, both
# over 8 KV heads ("num_attention_groups") of dim 128.
STEP_3_5_FLASH = {
    "model_type": "step3p5",
    "architectures": ["Step3p5ForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 45,
    "num_attention_heads": 64,
    "num_attention_groups": 8,
    "head_dim": 128,
    "sliding_window": 512,
    "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(45)],
    "attention_other_setting": {"num_attention_heads": 96, "num_attention_groups": 8},
    "vocab_size": 128896,
    # Layers 0-2 dense, then 288 experts top-8 plus a shared expert, as the hub lists them.
    "intermediate_size": 11264,
    "moe_num_experts": 288,
    "moe_top_k": 8,
    "moe_intermediate_size": 1280,
    "share_expert_dim": 1280,
    "moe_layers_enum": ",".join(str(i) for i in range(3, 45)),
}

# huggingface.co/deepseek-ai/DeepSeek-V4-Flash config.json: 43 layers, every one attends a
# 128-token window (shared-KV MQA: one 512-dim head, K = V, sinks); layers 0-1 only that,
# then CSA (an entry per 4 tokens, plus a 128-dim indexer key) and HCA (an entry per 128
# tokens) alternate. The hub form: compress_ratios with a trailing 0 for the MTP layer.
DEEPSEEK_V4_FLASH = {
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "index_head_dim": 128,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)] + [0],
    "compress_rope_theta": 160000,
    "rope_theta": 10000,
    "vocab_size": 129280,
}

# Tiny configs for tests and the embedded default: 4 layers, W = 7 (HF sliding_window 8).
TINY_HYBRID = {
    "model_type": "gpt_oss",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 8,
    "layer_types": _alternating(4),
    "vocab_size": 128,
}
TINY_MIMO = {
    **MIMO_V2_FLASH,
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "head_dim": 24,
    "v_head_dim": 16,
    "swa_head_dim": 24,
    "swa_v_head_dim": 16,
    "sliding_window_size": 8,
    "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0],
    "vocab_size": 128,
}
TINY_ALL_SWA = {
    "model_type": "mistral",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 8,
    "vocab_size": 128,
}

PRESETS: Mapping[str, Mapping[str, Any]] = {
    "gpt-oss-20b": _gpt_oss(24, 32),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "mimo-v2-flash": MIMO_V2_FLASH,
    "llama-4-scout": LLAMA_4_SCOUT,
    "gemma-3-27b": GEMMA_3_27B,
    "gemma-4-31b": GEMMA_4_31B,
    "gemma-4-26b-a4b": GEMMA_4_26B_A4B,
    "gemma-4-e4b": GEMMA_4_E4B,
    "step-3.5-flash": STEP_3_5_FLASH,
    "deepseek-v4-flash": DEEPSEEK_V4_FLASH,
    "tiny-hybrid": TINY_HYBRID,
    "tiny-mimo": TINY_MIMO,
    "tiny-all-swa": TINY_ALL_SWA,
}


def at_depth(cfg: Mapping[str, Any], layers: int | None) -> dict[str, Any]:
    """A copy of a config.json-shaped dict at its first `layers` layers (None: all): the text
    model's depth and every per-layer list cut, the widths unchanged."""
    import json

    cfg = json.loads(json.dumps(cfg))
    text = cfg.get("text_config", cfg)  # a multimodal wrapper's text model, edited in place
    n = text["num_hidden_layers"]
    layers = layers or n
    if layers > n:
        raise ValueError(f"{layers} layers is more than the model's {n}")
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == n:
            text[key] = value[:layers]
    text["num_hidden_layers"] = layers
    return cfg


def preset_names() -> list[str]:
    return sorted(PRESETS)


def hf_preset(name: str) -> Mapping[str, Any]:
    """The config.json-shaped dict of a preset."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return PRESETS[name]


def load_preset(name: str) -> HybridConfig:
    """The layer layout of a published model or a tiny test config, by name (`PRESETS`)."""
    return parse_hf_config(hf_preset(name))
