"""DeepSeek-V4's hyper-parameters beyond `ModelSpec`'s common ones (`V4Spec`), from its config.

Two RoPEs: "main" (plain, `rope_theta`) for sliding-only layers, "compress" (`compress_rope_theta`,
YaRN where the config scales it, attention factor 1) for CSA / HCA layers, their compressors
and the indexer. Both rotate the *last* `head_dim * partial_rotary_factor` dims of a head in
interleaved pairs. The config arrives nested (`rope_parameters: {main, compress}`, what
transformers writes) or flat (the hub's `rope_scaling` for the compressed layers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from swajax.config import ConfigError, HybridConfig
from swajax.config.hf_fields import nonneg_int, number, positive_int
from swajax.models.rope import RopeSpec

SCORING = ("sqrtsoftplus", "softmax", "sigmoid")


@dataclasses.dataclass(frozen=True)
class V4Spec:
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    index_heads: int
    index_dim: int
    index_topk: int
    hc_mult: int
    hc_iters: int
    hc_eps: float
    hash_layers: tuple[bool, ...]  # per layer: hash-routed MoE (tid2eid) or top-k routed
    main_rope: RopeSpec
    compress_rope: RopeSpec
    scoring: str


def _rope(params: Mapping[str, Any], theta: float, dim: int) -> RopeSpec:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise ConfigError(f"DeepSeek-V4 rope_type must be default or yarn, got {kind!r}")
    return RopeSpec(
        theta=float(params.get("rope_theta", theta)),
        dim=dim,
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        interleaved=True,
        original_max_position=int(params.get("original_max_position_embeddings", 4096)),
        beta_fast=float(params.get("beta_fast", 32.0)),
        beta_slow=float(params.get("beta_slow", 1.0)),
        truncate=bool(params.get("truncate", True)),
        # The reference multiplies cos / sin by nothing; transformers pins the factor to 1.
        attention_factor=float(params.get("attention_factor", 1.0)),
    )


def _ropes(text: Mapping[str, Any], head_dim: int) -> tuple[RopeSpec, RopeSpec]:
    partial = text.get("partial_rotary_factor")
    if partial is None:
        rope_dims = text.get("qk_rope_head_dim", 64)
        partial = rope_dims / head_dim
    dim = int(head_dim * float(partial)) // 2 * 2
    main_theta = number(text, "rope_theta", 10000.0)
    compress_theta = number(text, "compress_rope_theta", 160000.0)
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config field 'rope_parameters' must be an object, got {params!r}")
    if isinstance(params.get("main"), Mapping) and isinstance(params.get("compress"), Mapping):
        main, compress = params["main"], params["compress"]
    else:  # flat: the scaling applies to the compressed layers only
        main = {}
        compress = {k: v for k, v in params.items() if k not in ("main", "compress", "rope_theta")}
    return _rope(main, main_theta, dim), _rope(compress, compress_theta, dim)


def _hash_layers(text: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    kinds = text.get("mlp_layer_types")
    if kinds is None:
        hashed = nonneg_int(text, "num_hash_layers", 3)
        kinds = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    if not isinstance(kinds, list) or len(kinds) < n or set(kinds[:n]) - {"hash_moe", "moe"}:
        raise ConfigError(
            f"config field 'mlp_layer_types' must list {n} entries of hash_moe / moe, got {kinds!r}"
        )
    return tuple(k == "hash_moe" for k in kinds[:n])


def v4_fields(hybrid: HybridConfig, text: Mapping[str, Any]) -> dict:
    """`ModelSpec` fields of a DeepSeek-V4 config (`family_specs` calls it)."""
    n = hybrid.num_layers
    head_dim = hybrid.swa_attention.head_dim
    main, compress = _ropes(text, head_dim)
    scoring = text.get("scoring_func", "sqrtsoftplus")
    if scoring not in SCORING:
        raise ConfigError(f"config field 'scoring_func' must be one of {SCORING}, got {scoring!r}")
    heads = hybrid.swa_attention.num_heads
    v4 = V4Spec(
        q_lora_rank=positive_int(text, "q_lora_rank", 1024),
        o_groups=positive_int(text, "o_groups", 8),
        o_lora_rank=positive_int(text, "o_lora_rank", 1024),
        index_heads=positive_int(text, "index_n_heads", 64),
        index_dim=positive_int(text, "index_head_dim", 128),
        index_topk=positive_int(text, "index_topk", 512),
        hc_mult=positive_int(text, "hc_mult", 4),
        hc_iters=positive_int(text, "hc_sinkhorn_iters", 20),
        hc_eps=number(text, "hc_eps", 1e-6),
        hash_layers=_hash_layers(text, n),
        main_rope=main,
        compress_rope=compress,
        scoring=scoring,
    )
    if heads % v4.o_groups:
        raise ConfigError(
            f"num_attention_heads={heads} is not a multiple of o_groups={v4.o_groups}"
        )
    width = nonneg_int(text, "moe_intermediate_size", 2048)
    return dict(
        v4=v4,
        ropes=tuple(compress if la.compress_rate else main for la in hybrid.layers),
        mlps=("deepseek_v4_moe",) * n,  # `ModelSpec` makes it `Mlp.DEEPSEEK_V4_MOE`
        intermediate=(width,) * n,
        num_experts=positive_int(text, "n_routed_experts", 256),
        top_k=positive_int(text, "num_experts_per_tok", 6),
        expert_intermediate=width,
        swiglu_limit=number(text, "swiglu_limit", 10.0),
        routed_scale=number(text, "routed_scaling_factor", 1.5),
    )
