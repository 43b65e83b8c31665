"""Model configuration: a Hugging Face `config.json` read into per-layer kinds, windows and KV
shapes (`hybrid_config`, the only place W is converted), with its fields read and range-checked
by `hf_fields`, per-kind KV shapes and sharing in `hf_shapes`, DeepSeek-V4's compressed layers
in `hf_compressed`."""

from swajax.config.hf_fields import ConfigError as ConfigError
from swajax.config.hybrid_config import (
    AttentionShape as AttentionShape,
    HybridConfig as HybridConfig,
    LayerKind as LayerKind,
    LayerSpec as LayerSpec,
    load_hf_config as load_hf_config,
    parse_hf_config as parse_hf_config,
    text_config as text_config,
)
