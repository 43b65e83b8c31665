"""swajax: hybrid sliding-window-attention KV memory management in JAX."""

from swajax.config import (
    AttentionShape as AttentionShape,
    ConfigError as ConfigError,
    HybridConfig as HybridConfig,
    LayerKind as LayerKind,
    LayerSpec as LayerSpec,
    load_hf_config as load_hf_config,
    parse_hf_config as parse_hf_config,
)
from swajax.presets import load_preset as load_preset

__version__ = "0.1.0"
