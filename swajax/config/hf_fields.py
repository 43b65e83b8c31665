"""Reading Hugging Face config fields: presence, type and sane ranges, and the RoPE fields of a
layer type (v5 `rope_parameters`, per type or shared, and the legacy spellings). Every error is
a `ConfigError` that names the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swajax.errors import InputError


class ConfigError(InputError):
    """A config.json that cannot be turned into a layer layout; the message names the field."""


def get(cfg: Mapping[str, Any], field: str, default: Any = ...) -> Any:
    if field in cfg and cfg[field] is not None:
        return cfg[field]
    if default is ...:
        raise ConfigError(f"config field {field!r} is missing")
    return default


# Sane upper bounds: a config beyond them is a typo or an attack, not a model (the largest
# published models have ~160 layers, ~300k vocabularies and hidden sizes of ~16k).
LIMITS = {
    "num_hidden_layers": 4096,
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 1 << 12,
}
DEFAULT_LIMIT = 1 << 30


def positive_int(cfg: Mapping[str, Any], field: str, default: Any = ...) -> int:
    """`cfg[field]` as an int in [1, its limit]; an absent field gives `default` (which may be
    None: "not given")."""
    value = get(cfg, field, default)
    if value is None and default is None:
        return None
    limit = LIMITS.get(field, DEFAULT_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ConfigError(
            f"config field {field!r} must be an integer in [1, {limit}], got {value!r}"
        )
    return value


def nonneg_int(cfg: Mapping[str, Any], field: str, default: Any = ...) -> int:
    """`cfg[field]` as an int in [0, its limit] (0: the feature is absent, e.g. no experts)."""
    value = get(cfg, field, default)
    limit = LIMITS.get(field, DEFAULT_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ConfigError(
            f"config field {field!r} must be an integer in [0, {limit}], got {value!r}"
        )
    return value


def number(cfg: Mapping[str, Any], field: str, default: Any = ...) -> float | None:
    """`cfg[field]` as a finite float; an absent field gives `default` (None: "not given")."""
    value = get(cfg, field, default)
    if value is None and default is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"config field {field!r} must be a finite number, got {value!r}")
    return float(value)


def flag(cfg: Mapping[str, Any], field: str, default: Any = ...) -> bool:
    """`cfg[field]` as a bool (true / false, or 1 / 0)."""
    value = get(cfg, field, default)
    if value not in (True, False) or not isinstance(value, bool | int):
        raise ConfigError(f"config field {field!r} must be true or false, got {value!r}")
    return bool(value)


def hf_window(cfg: Mapping[str, Any], field: str = "sliding_window") -> int:
    """HF `sliding_window` counts the query itself: W = sliding_window - 1."""
    value = positive_int(cfg, field)
    if value < 2:
        raise ConfigError(
            f"config field {field!r} must be >= 2 (W = {field} - 1 >= 1), got {value}"
        )
    return value - 1


# Legacy (flat) RoPE fields of these model types describe the global layers only: the local
# layers' base is `rope_local_base_freq` (default 10,000) and they take no `rope_scaling`
# (transformers' Gemma3TextConfig.convert_rope_params_to_dict).
LEGACY_LOCAL_ROPE = ("gemma3", "gemma3_text")


def rope_theta(cfg: Mapping[str, Any], type_name: str, local: bool, layer: int) -> float | None:
    """RoPE base of one layer from the v5 `rope_parameters` or the legacy fields."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        per_type = params.get(type_name)
        if isinstance(per_type, Mapping):
            params = per_type
        if params.get("rope_theta") is not None:
            return float(params["rope_theta"])
    legacy_local = ("rope_local_base_freq", "swa_rope_theta")  # Gemma 3, MiMo-V2
    for field in legacy_local if local else ():
        if cfg.get(field) is not None:
            return float(cfg[field])
    if local and cfg.get("model_type") in LEGACY_LOCAL_ROPE:
        return None  # the local base is its own field or the family's default, never rope_theta
    theta = cfg.get("rope_theta")
    if isinstance(theta, list | tuple):  # Step-3.5 lists one base per layer
        theta = theta[layer] if layer < len(theta) else None
    return None if theta is None else float(theta)


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def rope_params(cfg: Mapping[str, Any], type_name: str, local: bool) -> tuple[tuple[str, Any], ...]:
    """RoPE scaling of one kind of layer: v5 `rope_parameters` (per layer type or shared) or the
    legacy `rope_scaling`, plus a model-wide `partial_rotary_factor`."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config field 'rope_parameters' must be an object, got {params!r}")
    per_type = params.get(type_name)
    if isinstance(per_type, Mapping):
        params = per_type
    elif any(isinstance(v, Mapping) for v in params.values()):
        params = {}  # per-type parameters that do not name this kind
    elif local and (
        cfg.get("rope_local_base_freq") is not None or cfg.get("model_type") in LEGACY_LOCAL_ROPE
    ):
        params = {}  # Gemma 3's legacy form: the scaling is the global layers' only
    elif type_name not in cfg.get("yarn_only_types", [type_name]):
        params = {}  # Step 3.x hub form: rope_scaling names the layer types it applies to
    params = {k: _frozen(v) for k, v in params.items() if k != "rope_theta"}
    if "type" in params:  # the oldest spelling
        params.setdefault("rope_type", params.pop("type"))
    if params.get("rope_type") == "default":
        del params["rope_type"]
    if "partial_rotary_factor" not in params and cfg.get("partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    factors, types = cfg.get("partial_rotary_factors"), cfg.get("layer_types")
    if "partial_rotary_factor" not in params and isinstance(factors, list) and types:
        # Step 3.x hub form: one factor per layer; a type takes its first layer's (as
        # transformers converts it; layers of a type agree)
        if type_name in types and types.index(type_name) < len(factors):
            params["partial_rotary_factor"] = factors[types.index(type_name)]
    return tuple(sorted(params.items()))
