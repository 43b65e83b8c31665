"""Flax NNX hybrid decoders that load Hugging Face checkpoints and run inside the engine."""

from swajax.models.checkpoint import LoadError as LoadError
from swajax.models.decoder import Decoder as Decoder, HybridLM as HybridLM
from swajax.models.family_specs import model_spec as model_spec
from swajax.models.loading import load_decoder as load_decoder, save_orbax as save_orbax
from swajax.models.spec import ModelSpec as ModelSpec
