"""Hugging Face `config.json` -> per-layer attention layout (`HybridConfig`).

This is the only place that converts window conventions. Downstream, `W` is always the number of
tokens *before* the query that a sliding layer attends: the query at position q sees keys
`[q - W, q]` (W + 1 keys). Hugging Face `sliding_window` counts the query itself, so
`W = sliding_window - 1`. MiMo-V2 hub configs carry `sliding_window_size`, which already is W.
Llama 4 chunked layers attend `[floor(q / C) * C, q]`; their memory window is C.

There is no architecture allowlist: any config with both local and full layers is hybrid.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from swajax.config import hf_compressed
from swajax.config.hf_defaults import with_defaults
from swajax.config.hf_fields import (
    ConfigError as ConfigError,
    get,
    hf_window,
    positive_int,
    rope_params,
    rope_theta,
)
from swajax.config.hf_shapes import kv_sources, shape_fields


class LayerKind(enum.Enum):
    """What a layer attends: every key before it (full), W keys before it and itself
    (sliding), or its own chunk of C keys (chunked, Llama 4)."""

    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"

    @property
    def letter(self) -> str:
        return {"full": "F", "sliding": "S", "chunked": "C"}[self.value]

    @property
    def is_local(self) -> bool:
        """Local layers (sliding or chunked) keep their KV in the SWA pool."""
        return self is not LayerKind.FULL


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    kind: LayerKind
    window: int | None = None  # W for sliding layers, C for chunked layers, None for full layers
    uses_rope: bool = True
    rope_theta: float | None = None  # None: the config does not say (the model's default applies)
    # The layer's RoPE scaling fields (rope_type, factor, ...) as sorted (name, value) pairs.
    rope_params: tuple[tuple[str, Any], ...] = ()
    # Gemma 4's KV-shared layers: the layer whose KV this one reads (it stores none); None for a
    # layer that stores its own.
    kv_source: int | None = None
    # DeepSeek-V4: an entry of `compress_dims` per `compress_rate` tokens, on the full pages,
    # and `pending_dims` per token in the SWA slots until it is made (memory/compressed_pool).
    compress_rate: int | None = None
    compress_dims: int = 0
    pending_dims: int = 0
    compress_topk: int = 0  # CSA: the entries the Lightning Indexer keeps per query

    @property
    def overlapping(self) -> bool:
        """CSA (the layers with an indexer): entry w mixes windows w - 1 and w."""
        return self.compress_topk > 0

    @property
    def kernel_window(self) -> int:
        """The window as the kernels take it: 0 for a full layer (the one place None -> 0)."""
        return self.window or 0

    def __post_init__(self):
        if self.kind is LayerKind.FULL and self.window is not None:
            raise ConfigError(f"full layer has window={self.window}; full layers have none")
        if self.kind.is_local and (self.window is None or self.window < 1):
            raise ConfigError(f"{self.kind.value} layer needs a window >= 1, got {self.window}")


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """KV layout of one kind of layer (the full kind or the local kind)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int  # K (and Q) head dim
    v_head_dim: int
    has_sinks: bool = False
    k_is_v: bool = False  # Gemma 4 attention_k_eq_v: one stored tensor serves as K and V

    def __post_init__(self):
        for name in ("num_heads", "num_kv_heads", "head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.k_is_v and self.head_dim != self.v_head_dim:
            raise ConfigError(
                f"keys that are values need head_dim == v_head_dim, got {self.head_dim} and "
                f"{self.v_head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """Bytes of K and V of one token in one layer (one tensor where keys are values)."""
        dims = self.head_dim if self.k_is_v else self.head_dim + self.v_head_dim
        return self.num_kv_heads * dims * dtype_bytes


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Attention layout of a decoder: which layers are local, their windows, and KV shapes."""

    model_type: str
    layers: tuple[LayerSpec, ...]
    full_attention: AttentionShape  # shape of the full layers' KV
    swa_attention: AttentionShape  # shape of the sliding / chunked layers' KV
    hidden_size: int = 0
    vocab_size: int = 0

    def __post_init__(self):
        if not self.layers:
            raise ConfigError("num_hidden_layers must be >= 1, got 0 layers")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def swa_layer_ids(self) -> tuple[int, ...]:
        """Local layers that store KV (the SWA pool's layers; KV-shared layers store none)."""
        return tuple(
            i for i, la in enumerate(self.layers) if la.kind.is_local and la.kv_source is None
        )

    @property
    def full_layer_ids(self) -> tuple[int, ...]:
        """Full layers that store KV (the full pool's layers)."""
        return tuple(
            i for i, la in enumerate(self.layers) if not la.kind.is_local and la.kv_source is None
        )

    @property
    def compressed_layer_ids(self) -> tuple[int, ...]:
        """DeepSeek-V4's CSA / HCA layers (their entries live on the full pages)."""
        return tuple(i for i, la in enumerate(self.layers) if la.compress_rate)

    def compressed_bytes_per_token(self, dtype_bytes: float, page_size: int | None = None) -> float:
        """Bytes of compressed entries one token costs, over all compressed layers: an entry
        every `compress_rate` tokens, or with `page_size`, ceil(page_size / rate) entries per
        page (what a full page holds, `memory/compressed_pool.py`)."""
        per_token = hf_compressed.entries_per_token
        return sum(
            la.compress_dims * dtype_bytes * per_token(la.compress_rate, page_size)
            for la in self.layers
            if la.compress_rate
        )

    def pending_bytes_per_token(self, dtype_bytes: float) -> float:
        """Bytes of compressor projections one SWA slot holds, over all compressed layers."""
        return sum(la.pending_dims * dtype_bytes for la in self.layers if la.compress_rate)

    @property
    def kinds(self) -> str:
        """One letter per layer: F (full), S (sliding), C (chunked)."""
        return "".join(layer.kind.letter for layer in self.layers)

    @property
    def layer_mix(self) -> str:
        """The model's layers (not the pools): 'hybrid' (both kinds), 'all_swa' (no full
        layers) or 'full_only' (no local layers)."""
        if not self.swa_layer_ids:
            return "full_only"
        # DeepSeek-V4's compressed entries live as long as the request, on full pages.
        return "hybrid" if self.full_layer_ids or self.compressed_layer_ids else "all_swa"

    @property
    def is_hybrid(self) -> bool:
        return self.layer_mix == "hybrid"

    @property
    def sliding_window(self) -> int | None:
        """Memory window W: the most tokens before a query that any local layer reads."""
        windows = [layer.window for layer in self.layers if layer.kind.is_local]
        return max(windows) if windows else None


# ---------------------------------------------------------------------------------------------
# Parsing


_LAYER_TYPE_KINDS = {
    "full_attention": LayerKind.FULL,
    "sliding_attention": LayerKind.SLIDING,
    "chunked_attention": LayerKind.CHUNKED,
}
_TYPE_NAMES = {kind: name for name, kind in _LAYER_TYPE_KINDS.items()}


def _kinds_from_layer_types(cfg: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
    layer_types = cfg["layer_types"]
    if not isinstance(layer_types, list | tuple) or len(layer_types) < num_layers:
        raise ConfigError(
            f"config field 'layer_types' must list at least num_hidden_layers={num_layers} "
            f"entries, got {layer_types!r}"
        )
    kinds = []
    for i, name in enumerate(layer_types[:num_layers]):
        if name not in _LAYER_TYPE_KINDS:
            raise ConfigError(
                f"config field 'layer_types[{i}]' is {name!r}; expected one of "
                f"{sorted(_LAYER_TYPE_KINDS)}"
            )
        kinds.append(_LAYER_TYPE_KINDS[name])
    return kinds


def _pattern(num_layers: int, is_full: Callable[[int], bool]) -> list[LayerKind]:
    return [LayerKind.FULL if is_full(i) else LayerKind.SLIDING for i in range(num_layers)]


def _every_nth_full(cfg: Mapping[str, Any], n_default: int) -> Callable[[int], bool]:
    n = positive_int(cfg, "sliding_window_pattern", n_default)
    return lambda i: (i + 1) % n == 0


# Per family: how to derive layer kinds when `layer_types` is absent.
def _default_kinds(model_type: str, cfg: Mapping[str, Any], n: int) -> list[LayerKind] | None:
    if model_type in ("gpt_oss", "gemma2"):
        return _pattern(n, lambda i: i % 2 == 1)
    if model_type in ("gemma3", "gemma3_text"):
        return _pattern(n, _every_nth_full(cfg, 6))
    if model_type in ("gemma4", "gemma4_text"):
        every = _every_nth_full(cfg, 6)
        return _pattern(n, lambda i: every(i) or i == n - 1)  # the last layer is always full
    if model_type in ("cohere2", "cohere2_moe", "olmo3", "exaone4", "exaone_moe"):
        return _pattern(n, _every_nth_full(cfg, 4))
    if model_type in ("mimo_v2_flash", "mimo_v2"):
        if "hybrid_layer_pattern" in cfg:
            pattern = cfg["hybrid_layer_pattern"]
            if not isinstance(pattern, list) or len(pattern) < n or set(pattern[:n]) - {0, 1}:
                raise ConfigError(
                    f"config field 'hybrid_layer_pattern' must list {n} entries of 0/1, "
                    f"got {pattern!r}"
                )
            return _pattern(n, lambda i: pattern[i] == 0)
        return _pattern(n, lambda i: i == 0 or (i + 1) % 6 == 0)
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not cfg.get("use_sliding_window") or cfg.get("sliding_window") is None:
            return [LayerKind.FULL] * n
        # Despite its name, max_window_layers counts the bottom layers that attend fully.
        mwl = get(cfg, "max_window_layers", n)
        return _pattern(n, lambda i: i < mwl)
    if model_type in ("mistral", "mixtral", "starcoder2", "phi3", "phimoe"):
        local = cfg.get("sliding_window") is not None
        return [LayerKind.SLIDING if local else LayerKind.FULL] * n
    if model_type == "step3p5":
        return [LayerKind.FULL] * n
    return None


def _llama4_layers(cfg: Mapping[str, Any], n: int) -> list[LayerSpec]:
    chunk = cfg.get("attention_chunk_size")
    no_rope = cfg.get("no_rope_layers") or []
    if no_rope:
        if len(no_rope) < n:
            raise ConfigError(
                f"config field 'no_rope_layers' must list {n} entries, got {no_rope!r}"
            )
        uses_rope = [bool(no_rope[i]) for i in range(n)]  # inverted naming: 1 means "uses RoPE"
    else:
        interval = positive_int(cfg, "no_rope_layer_interval", 4)
        uses_rope = [(i + 1) % interval != 0 for i in range(n)]
    if chunk is not None:
        chunk = positive_int(cfg, "attention_chunk_size")
    layers = []
    for i in range(n):
        if uses_rope[i] and chunk is not None:
            kind = LayerKind.CHUNKED
        else:
            kind = LayerKind.FULL
        theta = rope_theta(cfg, _TYPE_NAMES[kind], kind.is_local, i) if uses_rope[i] else None
        params = rope_params(cfg, _TYPE_NAMES[kind], kind.is_local) if uses_rope[i] else ()
        layers.append(
            LayerSpec(kind, chunk if kind.is_local else None, uses_rope[i], theta, params)
        )
    return layers


def _mimo_window(cfg: Mapping[str, Any]) -> int:
    # Hub configs carry sliding_window_size = W; transformers-converted ones sliding_window = W + 1.
    if cfg.get("sliding_window_size") is not None:
        return positive_int(cfg, "sliding_window_size")
    return hf_window(cfg)


def _local_window(model_type: str, cfg: Mapping[str, Any]) -> int:
    if model_type in ("mimo_v2_flash", "mimo_v2"):
        return _mimo_window(cfg)
    return hf_window(cfg)


def text_config(cfg: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(model_type, the decoder's fields): multimodal wrappers nest them under text_config."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(f"config field 'model_type' must be a string, got {model_type!r}")
    # Multimodal wrappers (llama4, gemma3, gemma4) nest the decoder under text_config.
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in cfg:
        model_type = text.get("model_type", model_type)
        return model_type, with_defaults(model_type, text)
    return model_type, with_defaults(model_type, cfg)


def parse_hf_config(cfg: Mapping[str, Any]) -> HybridConfig:
    """Turn a Hugging Face config dict into a `HybridConfig` (`ConfigError` names bad fields)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"config must be a JSON object, got {type(cfg).__name__}")
    model_type, text = text_config(cfg)
    n = positive_int(text, "num_hidden_layers")
    if model_type in ("llama4", "llama4_text"):
        layers = _llama4_layers(text, n)
    elif model_type in hf_compressed.MODEL_TYPES:  # every layer has a window branch
        layers = _layer_specs(model_type, text, [LayerKind.SLIDING] * n)
        layers = [
            dataclasses.replace(
                la, compress_rate=c[0], compress_dims=c[1], pending_dims=c[2], compress_topk=c[3]
            )
            if c
            else la
            for la, c in zip(layers, hf_compressed.compressed_layers(text, n))
        ]
        hf_compressed.check_window(layers)
    else:
        if text.get("layer_types") is not None:
            kinds = _kinds_from_layer_types(text, n)
        else:
            kinds = _default_kinds(model_type, text, n)
        if kinds is None:
            raise ConfigError(
                f"model_type {model_type!r} has no known layer pattern and the config has no "
                "'layer_types' field"
            )
        layers = _layer_specs(model_type, text, kinds)
    kinds = [layer.kind for layer in layers]
    sources = kv_sources(model_type, text, kinds)
    layers = [dataclasses.replace(la, kv_source=s) for la, s in zip(layers, sources)]
    full_fields, local_fields = shape_fields(model_type, text, kinds)
    full_shape, local_shape = AttentionShape(**full_fields), AttentionShape(**local_fields)
    return HybridConfig(
        model_type=model_type,
        layers=tuple(layers),
        full_attention=full_shape,
        swa_attention=local_shape,
        hidden_size=positive_int(text, "hidden_size"),
        vocab_size=positive_int(text, "vocab_size") if "vocab_size" in text else 0,
    )


def _layer_specs(
    model_type: str, cfg: Mapping[str, Any], kinds: list[LayerKind]
) -> list[LayerSpec]:
    windows: dict[LayerKind, int | None] = {LayerKind.FULL: None}
    if LayerKind.SLIDING in kinds:
        windows[LayerKind.SLIDING] = _local_window(model_type, cfg)
    if LayerKind.CHUNKED in kinds:
        windows[LayerKind.CHUNKED] = positive_int(cfg, "attention_chunk_size")
    return [
        LayerSpec(
            kind,
            windows[kind],
            rope_theta=rope_theta(cfg, _TYPE_NAMES[kind], kind.is_local, i),
            rope_params=rope_params(cfg, _TYPE_NAMES[kind], kind.is_local),
        )
        for i, kind in enumerate(kinds)
    ]


def load_hf_config(path: str | Path) -> HybridConfig:
    """Read `config.json` (a file, or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"no config file at {path}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    return parse_hf_config(cfg)
