"""Model hyper-parameters from a Hugging Face config, one builder per family (`FAMILY_SPECS`).

Families: gpt_oss, mimo_v2_flash, llama4_text, gemma3_text (and gemma2's soft caps), gemma4,
step3p5 / step3p7, qwen3 / qwen2, mistral, olmo3, exaone4, cohere2. The layer kinds and windows
come from `swajax.config`; each builder adds what its family needs, reading every field through
`swajax.config.hf_fields` (a missing or malformed field is a `ConfigError` naming it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from swajax.config import (
    ConfigError,
    HybridConfig,
    LayerKind,
    LayerSpec,
    parse_hf_config,
    text_config,
)
from swajax.config.hf_fields import flag, nonneg_int, number, positive_int
from swajax.models.deepseek_v4_spec import v4_fields
from swajax.models.rope import RopeSpec
from swajax.models.spec import Act, Block, Mlp, ModelSpec, Norm, QkNorm

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
    "deepseek_v4": "deepseek_v4",
}


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


Rope = Callable[..., RopeSpec]  # (layer, default theta, interleaved=...) -> the layer's RoPE


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
    n = hybrid.num_layers

    def head_dim(layer):
        return (hybrid.swa_attention if layer.kind.is_local else hybrid.full_attention).head_dim

    common = dict(
        family=family,
        hybrid=hybrid,
        vocab_size=_require_vocab(hybrid),
        hidden=hybrid.hidden_size,
        eps=number(text, "rms_norm_eps", 1e-6),
        act=Act.SILU,
        norm_plus_one=False,
        block=Block.PRE,
        qk_norm=QkNorm.NONE,
        qkv_bias=_qkv_bias(hybrid.model_type, text),
        o_bias=_o_bias(hybrid.model_type, text),
        embed_scale=1.0,
        scales=tuple(head_dim(la) ** -0.5 for la in hybrid.layers),
        mlps=(Mlp.DENSE,) * n,
        intermediate=(nonneg_int(text, "intermediate_size", 0),) * n,
        tie_embeddings=flag(text, "tie_word_embeddings", False),
        max_position=positive_int(text, "max_position_embeddings", None),
    )
    rope = lambda la, theta, **kw: _rope(la, head_dim(la), theta, **kw)  # noqa: E731
    return ModelSpec(**{**common, **FAMILY_SPECS[family](hybrid, text, rope)})


# Each builder returns the fields where its family differs from `model_spec`'s common ones.


def _llama(hybrid: HybridConfig, text, rope: Rope) -> dict:
    qk = QkNorm.WEIGHT if hybrid.model_type == "qwen3" else QkNorm.NONE
    return dict(qk_norm=qk, ropes=tuple(rope(la, 1e4) for la in hybrid.layers))


def _olmo(hybrid: HybridConfig, text, rope: Rope) -> dict:
    """Post-norm blocks. Olmo 3 norms q and k over the whole projection and ropes every layer;
    Exaone 4 norms per head and, when it has sliding layers, ropes only those."""
    exaone = hybrid.model_type == "exaone4"
    local_only = exaone and text.get("sliding_window") is not None  # transformers' test
    return dict(
        block=Block.POST,
        qk_norm=QkNorm.WEIGHT if exaone else QkNorm.FULL,
        ropes=tuple(
            rope(la, 1e4) if la.kind.is_local or not local_only else None for la in hybrid.layers
        ),
    )


def _cohere(hybrid: HybridConfig, text, rope: Rope) -> dict:
    """Parallel blocks over one mean-centered norm; interleaved RoPE on the sliding layers only
    (the full ones are NoPE); logits times logit_scale; tied head."""
    return dict(
        block=Block.PARALLEL,
        norm=Norm.LAYER,
        eps=number(text, "layer_norm_eps", 1e-5),
        ropes=tuple(
            rope(la, 1e4, interleaved=True) if la.kind.is_local else None for la in hybrid.layers
        ),
        logit_scale=number(text, "logit_scale", 0.0625),
        tie_embeddings=flag(text, "tie_word_embeddings", True),
    )


def _gpt_oss(hybrid: HybridConfig, text, rope: Rope) -> dict:
    return dict(
        ropes=tuple(rope(la, 150000.0) for la in hybrid.layers),
        mlps=(Mlp.GPT_OSS_MOE,) * hybrid.num_layers,
        num_experts=positive_int(text, "num_local_experts"),
        top_k=positive_int(text, "num_experts_per_tok"),
        expert_intermediate=positive_int(text, "intermediate_size"),
        swiglu_limit=number(text, "swiglu_limit", 7.0),
        swiglu_alpha=number(text, "swiglu_alpha", 1.702),
    )


def _gemma(hybrid: HybridConfig, text, rope: Rope) -> dict:
    first = hybrid.swa_attention if hybrid.layers[0].kind.is_local else hybrid.full_attention
    scale = number(text, "query_pre_attn_scalar", first.head_dim) ** -0.5
    return dict(
        act=Act.GELU_TANH,
        norm_plus_one=True,
        block=Block.SANDWICH,
        qk_norm=QkNorm.WEIGHT if hybrid.model_type != "gemma2" else QkNorm.NONE,
        embed_scale=float(hybrid.hidden_size) ** 0.5,
        scales=(scale,) * hybrid.num_layers,
        ropes=tuple(rope(la, 1e6 if la.kind is LayerKind.FULL else 1e4) for la in hybrid.layers),
        attn_soft_cap=number(text, "attn_logit_softcapping", None),
        final_soft_cap=number(text, "final_logit_softcapping", None),
        tie_embeddings=flag(text, "tie_word_embeddings", True),
    )


def _gemma4(hybrid: HybridConfig, text, rope: Rope) -> dict:
    """Gemma 4: sandwich blocks with plain-weight norms, q/k norms and a weightless v norm
    instead of a softmax scale, proportional RoPE on full layers; KV-shared layers may have
    double-width MLPs; optional MoE block and per-layer inputs (the small E-size models)."""
    if text.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' is not causal: it cannot be served")
    n = hybrid.num_layers
    width = nonneg_int(text, "intermediate_size", 0)
    double = flag(text, "use_double_wide_mlp", False)
    shared = [layer.kv_source is not None for layer in hybrid.layers]
    moe = flag(text, "enable_moe_block", False)
    return dict(
        act=Act.GELU_TANH,
        block=Block.SANDWICH,
        qk_norm=QkNorm.WEIGHT,
        embed_scale=float(hybrid.hidden_size) ** 0.5,
        scales=(1.0,) * n,
        ropes=tuple(rope(la, 1e6 if la.kind is LayerKind.FULL else 1e4) for la in hybrid.layers),
        intermediate=tuple(width * (2 if double and s else 1) for s in shared),
        final_soft_cap=number(text, "final_logit_softcapping", None),
        tie_embeddings=flag(text, "tie_word_embeddings", True),
        moe_block=moe,
        num_experts=nonneg_int(text, "num_experts", 0) if moe else 0,
        top_k=nonneg_int(text, "top_k_experts", 0) if moe else 0,
        expert_intermediate=nonneg_int(text, "moe_intermediate_size", 0) if moe else 0,
        ple_dim=nonneg_int(text, "hidden_size_per_layer_input", 0),
        ple_vocab=nonneg_int(text, "vocab_size_per_layer_input", 0) or hybrid.vocab_size,
    )


def _limits(text, field: str, n: int) -> tuple[float | None, ...]:
    values = text.get(field) or [None] * n
    if not isinstance(values, list) or len(values) < n:
        raise ConfigError(f"config field {field!r} must list {n} per-layer limits, got {values!r}")
    return tuple(float(v) if v else None for v in values[:n])  # 0 / None: no clamp


def _step3(hybrid: HybridConfig, text, rope: Rope) -> dict:
    """Step 3.x: Gemma-style (1 + w) norms, per-head q/k norms, a sigmoid gate per query head,
    sliding layers with their own head count; dense MLP or sigmoid-routed MoE plus a shared
    expert, with per-layer SwiGLU clamps."""
    if text.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention is not causal: it cannot be served")
    n = hybrid.num_layers
    kinds = text.get("mlp_layer_types") or _step3_moe_layers(text, n)
    scalar = number(text, "query_pre_attn_scalar", hybrid.full_attention.head_dim)
    # Step 3.5 and 3.7 name the expert counts differently.
    experts = nonneg_int(text, "n_routed_experts", 0) or nonneg_int(text, "moe_num_experts", 0)
    top_k = nonneg_int(text, "num_experts_per_tok", 0) or nonneg_int(text, "moe_top_k", 0)
    return dict(
        norm_plus_one=True,
        qk_norm=QkNorm.WEIGHT,
        scales=(scalar**-0.5,) * n,
        ropes=tuple(rope(la, 1e4) for la in hybrid.layers),
        mlps=tuple(Mlp.STEP3_MOE if k == "sparse" else Mlp.DENSE for k in kinds[:n]),
        num_experts=experts,
        top_k=top_k,
        expert_intermediate=nonneg_int(text, "moe_intermediate_size", 0),
        shared_intermediate=nonneg_int(text, "share_expert_dim", 0),
        routed_scale=number(text, "moe_router_scaling_factor", 1.0),
        attn_gate=True,
        mlp_limits=_limits(text, "swiglu_limits_shared", n),
        expert_limits=_limits(text, "swiglu_limits", n),
    )


def _step3_moe_layers(text, n: int) -> list[str]:
    """The hub form names Step 3.x's MoE layers in `moe_layers_enum` (a comma-separated string,
    or a list of indices) instead of `mlp_layer_types`; neither: every layer dense."""
    enum = text.get("moe_layers_enum")
    if enum is None:
        return ["dense"] * n
    try:
        items = enum.split(",") if isinstance(enum, str) else list(enum)
        layers = {int(i) for i in items if str(i).strip()}
    except (TypeError, ValueError):
        raise ConfigError(f"moe_layers_enum must list layer indices, got {enum!r}") from None
    if layers and (min(layers) < 0 or max(layers) >= n):
        raise ConfigError(f"moe_layers_enum names layers outside 0..{n - 1}: {sorted(layers)}")
    return ["sparse" if i in layers else "dense" for i in range(n)]


def _llama4(hybrid: HybridConfig, text, rope: Rope) -> dict:
    n = hybrid.num_layers
    step = positive_int(text, "interleave_moe_layer_step", 1)
    temp = None
    if flag(text, "attn_temperature_tuning", True):
        temp = (number(text, "attn_scale", 0.1), number(text, "floor_scale", 8192))
    return dict(
        qk_norm=QkNorm.L2 if flag(text, "use_qk_norm", True) else QkNorm.NONE,
        ropes=tuple(
            rope(la, 500000.0, interleaved=True) if la.uses_rope else None for la in hybrid.layers
        ),
        mlps=tuple(Mlp.LLAMA4_MOE if (i + 1) % step == 0 else Mlp.DENSE for i in range(n)),
        intermediate=(positive_int(text, "intermediate_size_mlp"),) * n,
        num_experts=positive_int(text, "num_local_experts"),
        top_k=positive_int(text, "num_experts_per_tok"),
        expert_intermediate=positive_int(text, "intermediate_size"),
        attn_temperature=temp,
    )


def _mimo(hybrid: HybridConfig, text, rope: Rope) -> dict:
    n = hybrid.num_layers
    kinds = text.get("mlp_layer_types") or ["dense"] * n
    return dict(
        ropes=tuple(rope(la, 1e4) for la in hybrid.layers),
        mlps=tuple(Mlp.MIMO_MOE if k == "sparse" else Mlp.DENSE for k in kinds[:n]),
        num_experts=nonneg_int(text, "n_routed_experts", 0),
        top_k=nonneg_int(text, "num_experts_per_tok", 0),
        expert_intermediate=nonneg_int(text, "moe_intermediate_size", 0),
        value_scale=number(text, "attention_value_scale", 1.0),
        routed_scale=number(text, "routed_scaling_factor", 1.0),
        norm_topk=flag(text, "norm_topk_prob", True),
    )


FAMILY_SPECS: dict[str, Callable[[HybridConfig, Mapping, Rope], dict]] = {
    "llama": _llama,
    "olmo": _olmo,
    "cohere": _cohere,
    "gpt_oss": _gpt_oss,
    "gemma": _gemma,
    "gemma4": _gemma4,
    "step3": _step3,
    "llama4": _llama4,
    "mimo": _mimo,
    "deepseek_v4": lambda hybrid, text, rope: v4_fields(hybrid, text),
}
