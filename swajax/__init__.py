"""swajax: hybrid sliding-window-attention KV memory management in JAX.

The public names: `LLM` (build from a checkpoint folder or "tiny", then `generate` or
`stream`), `SamplingParams`, `RequestOutput` / `CompletionOutput` / `StreamEvent`, `EngineSpec` /
`EngineOptions` / `Engine` for those who drive the engine step by step, `InputError` (every
error about a value given from outside), and the config readers. Names that need JAX load on
first use, so `import swajax` stays cheap and host-only code never imports JAX.
"""

import importlib

from swajax.config import (
    AttentionShape as AttentionShape,
    ConfigError as ConfigError,
    HybridConfig as HybridConfig,
    LayerKind as LayerKind,
    LayerSpec as LayerSpec,
    load_hf_config as load_hf_config,
    parse_hf_config as parse_hf_config,
)
from swajax.errors import InputError as InputError
from swajax.presets import load_preset as load_preset
from swajax.version import __version__ as __version__

_LAZY = {
    "LLM": "swajax.api",
    "CompletionOutput": "swajax.api",
    "RequestOutput": "swajax.api",
    "StreamEvent": "swajax.api",
    "EngineSpec": "swajax.api",
    "Engine": "swajax.serving.engine",
    "EngineOptions": "swajax.serving.options",
    "SamplingParams": "swajax.serving.sampling_params",
    "RequestError": "swajax.errors",
    "RequestFailed": "swajax.errors",
}

__all__ = [
    "AttentionShape",
    "ConfigError",
    "HybridConfig",
    "InputError",
    "LayerKind",
    "LayerSpec",
    "load_hf_config",
    "load_preset",
    "parse_hf_config",
    *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swajax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
