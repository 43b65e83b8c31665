"""Model hyper-parameters from a Hugging Face config, per family (what `HybridConfig` leaves out).

Families: gpt_oss, mimo_v2_flash, llama4_text, gemma3_text (and gemma2's soft caps), qwen3 /
qwen2, mistral, olmo3, exaone4, cohere2. The layer kinds and windows come from `swajax.config`;
this adds norms, RoPE, projections and feed-forward blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from swajax.config import (
    ConfigError,
    HybridConfig,
    LayerKind,
    LayerSpec,
    parse_hf_config,
    text_config,
)
from swajax.hf_fields import positive_int
from swajax.models.rope import RopeSpec

FAMILIES = {
    "gpt_oss": "gpt_oss",
    "mimo_v2_flash": "mimo",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "qwen2": "llama",
    "qwen3": "llama",
    "mistral": "llama",
    "olmo3": "olmo",
    "exaone4": "olmo",
    "cohere2": "cohere",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "step3p5": "step3",
    "step3p7": "step3",
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    family: str
    hybrid: HybridConfig
    vocab_size: int
    hidden: int
    eps: float
    act: str  # silu | gelu_tanh
    norm_plus_one: bool  # Gemma: x * (1 + w)
    block: str  # pre | sandwich (Gemma) | post (Olmo 3, Exaone 4) | parallel (Cohere 2)
    qk_norm: str  # none | weight (per head, before RoPE) | full (whole projection) | l2 (Llama 4)
    qkv_bias: bool
    o_bias: bool
    embed_scale: float
    scales: tuple[float, ...]  # attention scale per layer
    ropes: tuple[RopeSpec | None, ...]  # per layer (None: NoPE)
    mlps: tuple[str, ...]  # per layer: dense | gpt_oss_moe | llama4_moe | mimo_moe
    intermediate: tuple[int, ...]  # per layer dense width
    num_experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    attn_soft_cap: float | None = None
    final_soft_cap: float | None = None
    tie_embeddings: bool = False
    value_scale: float = 1.0
    attn_temperature: tuple[float, float] | None = None  # Llama 4 NoPE: (attn_scale, floor_scale)
    routed_scale: float = 1.0
    norm_topk: bool = True
    norm: str = "rms"  # rms | layer (Cohere: mean-centered, weight only)
    logit_scale: float = 1.0  # Cohere multiplies the logits
    dtype: str = "float32"  # parameters and activations (norms, softmax, router stay float32)
    moe: str = "auto"  # auto | routed | dense (every expert on every token: the reference)
    moe_block: bool = False  # Gemma 4: an MoE block beside every layer's dense MLP
    ple_dim: int = 0  # Gemma 4 per-layer inputs: width per layer (0: none)
    ple_vocab: int = 0
    attn_gate: bool = False  # Step 3.x: a sigmoid gate per query head on the attention output
    # Step 3.x SwiGLU clamps per layer (None: none): dense and shared-expert MLPs, routed experts
    mlp_limits: tuple[float | None, ...] = ()
    expert_limits: tuple[float | None, ...] = ()
    shared_intermediate: int = 0
    # The longest context the checkpoint was trained for (None: the config does not say).
    max_position: int | None = None

    @property
    def routed_experts(self) -> bool:
        """`auto` routes when a token skips at least three quarters of the experts (E >= 4k):
        below that, sorting and gathering cost more than the experts they skip (measured on
        the 4-expert fixtures: routed made the MoE test runs 18% slower)."""
        if self.moe == "auto":
            return self.num_experts >= 4 * self.top_k
        return self.moe == "routed"

    @property
    def num_layers(self) -> int:
        return self.hybrid.num_layers


def _rope(layer: LayerSpec, head_dim: int, default_theta: float, interleaved=False) -> RopeSpec:
    """The layer's RoPE from what `swajax.config` parsed (the only reader of the JSON fields)."""
    params = dict(layer.rope_params)
    theta = layer.rope_theta if layer.rope_theta is not None else default_theta
    kind = params.get("rope_type", params.get("type", "default"))
    partial = float(params.get("partial_rotary_factor", 1.0))
    proportional = kind == "proportional"  # Gemma 4: the whole head, some pairs unrotated
    dim = head_dim if proportional else int(head_dim * partial) // 2 * 2
    return RopeSpec(
        theta=float(theta),
        dim=dim,
        kind=kind,
        proportion=partial if proportional else 1.0,
        factor=float(params.get("factor", 1.0)),
        interleaved=interleaved,
        original_max_position=int(params.get("original_max_position_embeddings", 4096)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast", 32.0)),
        beta_slow=float(params.get("beta_slow", 1.0)),
        truncate=bool(params.get("truncate", True)),
        attention_factor=params.get("attention_factor"),
    )


def _qkv_bias(model_type: str, text) -> bool:
    """transformers' rule: Qwen 2 always has q/k/v biases and Mistral never, whatever
    `attention_bias` says; the other families follow the field."""
    if model_type == "qwen2":
        return True
    no_bias = ("mistral", "exaone4")
    return model_type not in no_bias and bool(text.get("attention_bias", False))


def _o_bias(model_type: str, text) -> bool:
    if model_type in ("qwen2", "mistral", "mimo_v2_flash", "exaone4"):
        return False
    return bool(text.get("attention_bias", False))


def _require_vocab(hybrid: HybridConfig) -> int:
    if not hybrid.vocab_size:
        raise ConfigError("config field 'vocab_size' is required to build a model")
    return hybrid.vocab_size


def model_spec(cfg: Mapping[str, Any]) -> ModelSpec:
    """Parse a Hugging Face config.json dict; `ConfigError` names what is missing or unknown."""
    hybrid = parse_hf_config(cfg)
    _, text = text_config(cfg)
    family = FAMILIES.get(hybrid.model_type)
    if family is None:
        raise ConfigError(
            f"model_type {hybrid.model_type!r} has no model implementation; "
            f"supported: {sorted(FAMILIES)}"
        )
    n, hidden = hybrid.num_layers, hybrid.hidden_size
    layers = hybrid.layers

    def head_dim(layer):
        return (hybrid.swa_attention if layer.kind.is_local else hybrid.full_attention).head_dim

    common = dict(
        family=family,
        hybrid=hybrid,
        vocab_size=_require_vocab(hybrid),
        hidden=hidden,
        eps=float(text.get("rms_norm_eps", 1e-6)),
        act="silu",
        norm_plus_one=False,
        block="pre",
        qk_norm="none",
        qkv_bias=_qkv_bias(hybrid.model_type, text),
        o_bias=_o_bias(hybrid.model_type, text),
        embed_scale=1.0,
        scales=tuple(head_dim(la) ** -0.5 for la in layers),
        mlps=("dense",) * n,
        intermediate=(int(text.get("intermediate_size", 0)),) * n,
        tie_embeddings=bool(text.get("tie_word_embeddings", False)),
        max_position=positive_int(text, "max_position_embeddings", None),
    )
    rope = lambda la, theta, **kw: _rope(la, head_dim(la), theta, **kw)  # noqa: E731
    if family == "llama":
        qk = "weight" if hybrid.model_type == "qwen3" else "none"
        return ModelSpec(
            **{**common, "qk_norm": qk, "ropes": tuple(rope(la, 1e4) for la in layers)}
        )
    if family == "olmo":
        # Post-norm blocks. Olmo 3 norms q and k over the whole projection and ropes every
        # layer; Exaone 4 norms per head and, when it has sliding layers, ropes only those.
        exaone = hybrid.model_type == "exaone4"
        local_only = exaone and text.get("sliding_window") is not None  # transformers' test
        return ModelSpec(
            **{
                **common,
                "block": "post",
                "qk_norm": "weight" if exaone else "full",
                "ropes": tuple(
                    rope(la, 1e4) if la.kind.is_local or not local_only else None for la in layers
                ),
            }
        )
    if family == "cohere":
        # Parallel blocks over one mean-centered norm; interleaved RoPE on the sliding layers
        # only (the full ones are NoPE); logits times logit_scale; tied head.
        return ModelSpec(
            **{
                **common,
                "block": "parallel",
                "norm": "layer",
                "eps": float(text.get("layer_norm_eps", 1e-5)),
                "ropes": tuple(
                    rope(la, 1e4, interleaved=True) if la.kind.is_local else None for la in layers
                ),
                "logit_scale": float(text.get("logit_scale", 0.0625)),
                "tie_embeddings": bool(text.get("tie_word_embeddings", True)),
            }
        )
    if family == "gpt_oss":
        return ModelSpec(
            **{
                **common,
                "ropes": tuple(rope(la, 150000.0) for la in layers),
                "mlps": ("gpt_oss_moe",) * n,
                "num_experts": int(text["num_local_experts"]),
                "top_k": int(text["num_experts_per_tok"]),
                "expert_intermediate": int(text["intermediate_size"]),
                "swiglu_limit": float(text.get("swiglu_limit", 7.0)),
                "swiglu_alpha": float(text.get("swiglu_alpha", 1.702)),
            }
        )
    if family == "gemma":
        scale = float(text.get("query_pre_attn_scalar", head_dim(layers[0]))) ** -0.5
        return ModelSpec(
            **{
                **common,
                "act": "gelu_tanh",
                "norm_plus_one": True,
                "block": "sandwich",
                "qk_norm": "weight" if hybrid.model_type != "gemma2" else "none",
                "embed_scale": float(hidden) ** 0.5,
                "scales": (scale,) * n,
                "ropes": tuple(
                    rope(la, 1e6 if la.kind is LayerKind.FULL else 1e4) for la in layers
                ),
                "attn_soft_cap": text.get("attn_logit_softcapping"),
                "final_soft_cap": text.get("final_logit_softcapping"),
                "tie_embeddings": bool(text.get("tie_word_embeddings", True)),
            }
        )
    if family == "gemma4":
        return _gemma4(common, hybrid, text, rope)
    if family == "step3":
        return _step3(common, hybrid, text, rope)
    if family == "llama4":
        step = int(text.get("interleave_moe_layer_step", 1))
        mlps = tuple("llama4_moe" if (i + 1) % step == 0 else "dense" for i in range(n))
        width = tuple(int(text["intermediate_size_mlp"]) for _ in range(n))
        temp = None
        if text.get("attn_temperature_tuning", True):
            temp = (float(text.get("attn_scale", 0.1)), float(text.get("floor_scale", 8192)))
        return ModelSpec(
            **{
                **common,
                "qk_norm": "l2" if text.get("use_qk_norm", True) else "none",
                "ropes": tuple(
                    rope(la, 500000.0, interleaved=True) if la.uses_rope else None for la in layers
                ),
                "mlps": mlps,
                "intermediate": width,
                "num_experts": int(text["num_local_experts"]),
                "top_k": int(text["num_experts_per_tok"]),
                "expert_intermediate": int(text["intermediate_size"]),
                "attn_temperature": temp,
            }
        )
    # MiMo-V2-Flash
    kinds = text.get("mlp_layer_types") or ["dense"] * n
    return ModelSpec(
        **{
            **common,
            "ropes": tuple(rope(la, 1e4) for la in layers),
            "mlps": tuple("mimo_moe" if k == "sparse" else "dense" for k in kinds[:n]),
            "num_experts": int(text.get("n_routed_experts", 0)),
            "top_k": int(text.get("num_experts_per_tok", 0)),
            "expert_intermediate": int(text.get("moe_intermediate_size", 0)),
            "value_scale": float(text.get("attention_value_scale", 1.0)),
            "routed_scale": float(text.get("routed_scaling_factor", 1.0)),
            "norm_topk": bool(text.get("norm_topk_prob", True)),
        }
    )


def _gemma4(common: dict, hybrid: HybridConfig, text, rope) -> ModelSpec:
    """Gemma 4: sandwich blocks with plain-weight norms, q/k norms and a weightless v norm
    instead of a softmax scale, proportional RoPE on full layers; KV-shared layers may have
    double-width MLPs; optional MoE block and per-layer inputs (the small E-size models)."""
    if text.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' is not causal: it cannot be served")
    n = hybrid.num_layers
    width = int(text.get("intermediate_size", 0))
    double = bool(text.get("use_double_wide_mlp", False))
    shared = [layer.kv_source is not None for layer in hybrid.layers]
    moe = bool(text.get("enable_moe_block", False))
    return ModelSpec(
        **{
            **common,
            "act": "gelu_tanh",
            "block": "sandwich",
            "qk_norm": "weight",
            "embed_scale": float(hybrid.hidden_size) ** 0.5,
            "scales": (1.0,) * n,
            "ropes": tuple(
                rope(la, 1e6 if la.kind is LayerKind.FULL else 1e4) for la in hybrid.layers
            ),
            "intermediate": tuple(width * (2 if double and s else 1) for s in shared),
            "final_soft_cap": text.get("final_logit_softcapping"),
            "tie_embeddings": bool(text.get("tie_word_embeddings", True)),
            "moe_block": moe,
            "num_experts": int(text.get("num_experts") or 0) if moe else 0,
            "top_k": int(text.get("top_k_experts") or 0) if moe else 0,
            "expert_intermediate": int(text.get("moe_intermediate_size") or 0) if moe else 0,
            "ple_dim": int(text.get("hidden_size_per_layer_input") or 0),
            "ple_vocab": int(text.get("vocab_size_per_layer_input") or hybrid.vocab_size),
        }
    )


def _limits(text, field: str, n: int) -> tuple[float | None, ...]:
    values = text.get(field) or [None] * n
    if not isinstance(values, list) or len(values) < n:
        raise ConfigError(f"config field {field!r} must list {n} per-layer limits, got {values!r}")
    return tuple(float(v) if v else None for v in values[:n])  # 0 / None: no clamp


def _step3(common: dict, hybrid: HybridConfig, text, rope) -> ModelSpec:
    """Step 3.x: Gemma-style (1 + w) norms, per-head q/k norms, a sigmoid gate per query head,
    sliding layers with their own head count; dense MLP or sigmoid-routed MoE plus a shared
    expert, with per-layer SwiGLU clamps."""
    if text.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention is not causal: it cannot be served")
    n = hybrid.num_layers
    kinds = text.get("mlp_layer_types") or ["dense"] * n
    scalar = text.get("query_pre_attn_scalar") or hybrid.full_attention.head_dim
    return ModelSpec(
        **{
            **common,
            "norm_plus_one": True,
            "qk_norm": "weight",
            "scales": (float(scalar) ** -0.5,) * n,
            "ropes": tuple(rope(la, 1e4) for la in hybrid.layers),
            "mlps": tuple("step3_moe" if k == "sparse" else "dense" for k in kinds[:n]),
            "num_experts": int(text.get("n_routed_experts") or text.get("moe_num_experts") or 0),
            "top_k": int(text.get("num_experts_per_tok") or text.get("moe_top_k") or 0),
            "expert_intermediate": int(text.get("moe_intermediate_size") or 0),
            "shared_intermediate": int(text.get("share_expert_dim") or 0),
            "routed_scale": float(text.get("moe_router_scaling_factor", 1.0)),
            "attn_gate": True,
            "mlp_limits": _limits(text, "swiglu_limits_shared", n),
            "expert_limits": _limits(text, "swiglu_limits", n),
        }
    )
