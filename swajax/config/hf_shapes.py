"""Per-family KV shapes and KV sharing from a Hugging Face config: what each kind of layer stores.

Full and local layers may differ in heads and head dims (MiMo-V2: SWA 8 KV heads, full 4;
Gemma 4: full layers with their own KV heads and a 512 head dim; Step 3.x: sliding layers with
their own query heads). Gemma 4 adds two memory rules: full layers whose keys are their values
(`attention_k_eq_v`: one stored tensor) and KV-shared layers (`num_kv_shared_layers`: the last
layers read an earlier layer's KV and store none). Returned as plain fields: `swajax.config`
builds its dataclasses from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swajax.config.hf_fields import ConfigError, positive_int

GEMMA4 = ("gemma4", "gemma4_text")
MIMO = ("mimo_v2_flash", "mimo_v2")
STEP3 = ("step3p5", "step3p7")


def shape_fields(model_type: str, cfg: Mapping[str, Any], kinds) -> tuple[dict, dict]:
    """(full, local) fields of `AttentionShape`: num_heads, num_kv_heads, head_dim,
    v_head_dim, has_sinks, k_is_v. `kinds` are the layers' `LayerKind`s (for per-layer
    overrides)."""
    heads = positive_int(cfg, "num_attention_heads")
    # Step 3.x hub configs name the KV heads num_attention_groups (transformers maps it).
    kv_heads = positive_int(cfg, "num_key_value_heads", cfg.get("num_attention_groups") or heads)
    hidden = positive_int(cfg, "hidden_size")
    default_head_dim = 512 if model_type == "deepseek_v4" else hidden // heads
    head_dim = positive_int(cfg, "head_dim", default_head_dim)
    v_head_dim = positive_int(cfg, "v_head_dim", head_dim)
    sinks = model_type == "gpt_oss"
    full = dict(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        has_sinks=sinks,
        k_is_v=False,
    )
    local = dict(full)
    if model_type in MIMO:
        # The transformers port drops the swa_* fields and gives SWA layers twice the KV heads.
        local.update(
            num_heads=positive_int(cfg, "swa_num_attention_heads", heads),
            num_kv_heads=positive_int(cfg, "swa_num_key_value_heads", 2 * kv_heads),
            head_dim=positive_int(cfg, "swa_head_dim", head_dim),
            v_head_dim=positive_int(cfg, "swa_v_head_dim", v_head_dim),
            has_sinks=bool(cfg.get("add_swa_attention_sink_bias", True)),
        )
        full["has_sinks"] = bool(cfg.get("add_full_attention_sink_bias", False))
    elif model_type in GEMMA4:
        full.update(_gemma4_full(cfg, kinds, kv_heads))
    elif model_type == "deepseek_v4":  # shared-KV MQA: one head whose K is its V, sinks
        local.update(k_is_v=True, v_head_dim=local["head_dim"], has_sinks=True)
    elif model_type in STEP3:
        # ... and give the sliding layers' head count in attention_other_setting.
        other = cfg.get("attention_other_setting") or {}
        other_heads = (
            other.get("num_attention_heads", heads) if isinstance(other, Mapping) else heads
        )
        local["num_heads"] = positive_int(cfg, "num_sliding_attention_heads", other_heads)
        _check_per_layer(cfg, kinds, local, full)
    return full, local


def _gemma4_full(cfg, kinds, kv_heads) -> dict:
    """Gemma 4's full layers: head dim `global_head_dim` (default 512); KV heads
    `num_global_key_value_heads` only where keys are values (transformers' rule); or both from
    the `per_layer_config` that `save_pretrained` writes instead."""
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    fields = {"head_dim": positive_int(cfg, "global_head_dim", 512)}
    if k_eq_v and cfg.get("num_global_key_value_heads") is not None:
        fields["num_kv_heads"] = positive_int(cfg, "num_global_key_value_heads")
    overrides = _per_layer(cfg, kinds, full=True)
    if overrides:
        fields = {"head_dim": overrides.get("head_dim", fields["head_dim"])}
        if "num_key_value_heads" in overrides:
            fields["num_kv_heads"] = overrides["num_key_value_heads"]
    fields["v_head_dim"] = fields["head_dim"]
    fields["k_is_v"] = k_eq_v
    if "num_kv_heads" not in fields:
        fields["num_kv_heads"] = kv_heads
    return fields


def _per_layer(cfg, kinds, *, full: bool) -> dict:
    """The one override every layer of a kind shares in `per_layer_config` ({} if none); kinds
    whose layers disagree cannot share a pool: a ConfigError."""
    table = cfg.get("per_layer_config")
    if not table:
        return {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"config field 'per_layer_config' must be an object, got {table!r}")
    seen = []
    for i, kind in enumerate(kinds):
        if kind.is_local != full:
            entry = table.get(str(i), table.get(i, {}))
            if not isinstance(entry, Mapping):
                raise ConfigError(f"config field 'per_layer_config[{i}]' must be an object")
            seen.append(dict(entry))
    if any(entry != seen[0] for entry in seen):
        kind = "full" if full else "local"
        raise ConfigError(
            f"config field 'per_layer_config' gives the {kind} layers different shapes "
            f"({seen[0]} vs another); one pool needs one shape per kind"
        )
    for name in seen[0] if seen else ():
        positive_int(seen[0], name)
    return seen[0] if seen else {}


def _check_per_layer(cfg, kinds, local: dict, full: dict) -> None:
    """Step 3.x writes the sliding layers' head count as a per-layer override."""
    heads = _per_layer(cfg, kinds, full=False).get("num_attention_heads")
    if heads is not None:
        local["num_heads"] = heads


def kv_sources(model_type: str, cfg: Mapping[str, Any], kinds) -> list[int | None]:
    """Per layer: None if it stores its own KV, else the layer whose KV it reads (Gemma 4's
    KV-shared layers read the last earlier layer of their own kind that stores KV)."""
    n = len(kinds)
    shared = cfg.get("num_kv_shared_layers", 0) if model_type in GEMMA4 else 0
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < n:
        raise ConfigError(
            f"config field 'num_kv_shared_layers' must be an integer in [0, {n - 1}] "
            f"(num_hidden_layers - 1), got {shared!r}"
        )
    first = n - shared
    sources: list[int | None] = [None] * n
    for i in range(first, n):
        owners = [j for j in range(first) if kinds[j] is kinds[i]]
        if not owners:
            raise ConfigError(
                f"layer {i} ({kinds[i].value}) shares KV, but no layer before "
                f"num_hidden_layers - num_kv_shared_layers = {first} is of its kind"
            )
        sources[i] = owners[-1]
    return sources
