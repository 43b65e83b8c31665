"""What a Hugging Face config means when it leaves a field out: transformers 5.24's config-class
defaults for the fields swajax reads, per model type. A config is read with these filled in
wherever it omits the field (and every spelling of it), so an omitted field means here what it
means to transformers (tested per family on the smallest configs transformers accepts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
}
_GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150_000.0,
}
_MIMO_ROPE = {
    "full_attention": {
        "rope_type": "default",
        "rope_theta": 5_000_000.0,
        "partial_rotary_factor": 0.334,
    },
    "sliding_attention": {
        "rope_type": "default",
        "rope_theta": 10_000.0,
        "partial_rotary_factor": 0.334,
    },
}
_OLMO3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 500_000.0},
    "full_attention": {"rope_type": "default", "rope_theta": 500_000.0},
}

# Per model type: field -> default, applied when the config has none of the field's spellings.
_LLAMA4 = {"rms_norm_eps": 1e-5, "attention_chunk_size": 8192}
_GEMMA4 = {
    "sliding_window": 512,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1_000_000.0,
        },
    },
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt_oss": {
        "sliding_window": 128,
        "rope_parameters": _GPT_OSS_ROPE,
        "rms_norm_eps": 1e-5,
        "attention_bias": True,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "intermediate_size": 2880,
    },
    "gemma2": {
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    "gemma3": {
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "rope_parameters": _GEMMA3_ROPE,
    },
    "gemma3_text": {
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "rope_parameters": _GEMMA3_ROPE,
    },
    "olmo3": {"sliding_window": 4096, "rope_parameters": _OLMO3_ROPE, "rms_norm_eps": 1e-5},
    "exaone4": {"sliding_window": 4096, "rms_norm_eps": 1e-5},
    "cohere2": {"sliding_window": 4096, "layer_norm_eps": 1e-5, "logit_scale": 0.0625},
    "mistral": {"sliding_window": 4096},
    "mimo_v2_flash": {
        "sliding_window": 129,
        "rope_parameters": _MIMO_ROPE,
        "rms_norm_eps": 1e-5,
        "attention_value_scale": 0.707,
    },
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "gemma4": _GEMMA4,
    "gemma4_text": _GEMMA4,
}

# The spellings of a field: if the config names any (even as null, which transformers keeps),
# the field is not omitted.
SPELLINGS = {
    "sliding_window": ("sliding_window", "sliding_window_size"),
    "rope_parameters": ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq"),
}


def with_defaults(model_type: str, text: Mapping[str, Any]) -> Mapping[str, Any]:
    """`text` (a decoder's config fields) with transformers' defaults for what it omits."""
    missing = {
        field: value
        for field, value in DEFAULTS.get(model_type, {}).items()
        if not any(s in text for s in SPELLINGS.get(field, (field,)))
    }
    return {**text, **missing} if missing else text
