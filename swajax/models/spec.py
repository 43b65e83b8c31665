"""A model's hyper-parameters beyond its layer kinds (what `HybridConfig` leaves out): norms,
RoPE, projections and feed-forward blocks, with their vocabularies as enums. Built from a
Hugging Face config by the per-family builders of `family_specs.py`."""

from __future__ import annotations

import dataclasses
import enum

from swajax.config import ConfigError, HybridConfig
from swajax.models.deepseek_v4_spec import V4Spec
from swajax.models.quantization import Quantization
from swajax.models.rope import RopeSpec


class Act(enum.StrEnum):
    SILU = "silu"
    GELU_TANH = "gelu_tanh"


class Block(enum.StrEnum):
    """Where a layer's norms sit: pre-norm (Llama), Gemma's sandwich, post-norm (Olmo 3,
    Exaone 4), parallel attention and MLP over one norm (Cohere 2)."""

    PRE = "pre"
    SANDWICH = "sandwich"
    POST = "post"
    PARALLEL = "parallel"


class QkNorm(enum.StrEnum):
    NONE = "none"
    WEIGHT = "weight"  # per head, before RoPE
    FULL = "full"  # over the whole projection (Olmo 3)
    L2 = "l2"  # weightless, after RoPE (Llama 4)


class Norm(enum.StrEnum):
    RMS = "rms"
    LAYER = "layer"  # mean-centered, weight only (Cohere)


class Mlp(enum.StrEnum):
    DENSE = "dense"
    GPT_OSS_MOE = "gpt_oss_moe"
    LLAMA4_MOE = "llama4_moe"
    MIMO_MOE = "mimo_moe"
    STEP3_MOE = "step3_moe"
    DEEPSEEK_V4_MOE = "deepseek_v4_moe"  # hash or top-k routed, plus a shared expert


def _member(kind: type[enum.StrEnum], field: str, value):
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise ConfigError(f"{field} must be one of {names}, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    family: str
    hybrid: HybridConfig
    vocab_size: int
    hidden: int
    eps: float
    act: Act
    norm_plus_one: bool  # Gemma: x * (1 + w)
    block: Block
    qk_norm: QkNorm
    qkv_bias: bool
    o_bias: bool
    embed_scale: float
    scales: tuple[float, ...]  # attention scale per layer
    ropes: tuple[RopeSpec | None, ...]  # per layer (None: NoPE)
    mlps: tuple[Mlp, ...]  # per layer
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
    norm: Norm = Norm.RMS
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
    # Weights kept quantized on the device as the checkpoint ships them (`quantization_config`;
    # the default, plain floats, is also what `dequantize_weights` loads).
    weights: Quantization = Quantization()
    # The checkpoint ships per-layer K and V scales for an FP8 KV cache (`self_attn.k_scale`).
    kv_scales: bool = False
    v4: V4Spec | None = None  # DeepSeek-V4's own hyper-parameters

    def __post_init__(self):
        # The vocabularies arrive as enums or their strings; kept as enums from here on.
        for field, kind in (("act", Act), ("block", Block), ("qk_norm", QkNorm), ("norm", Norm)):
            object.__setattr__(self, field, _member(kind, field, getattr(self, field)))
        object.__setattr__(self, "mlps", tuple(_member(Mlp, "mlps", m) for m in self.mlps))

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
