"""Load a model from a Hugging Face checkpoint directory (config.json + *.safetensors, numpy
only, no torch) or from an orbax checkpoint written by `swajax convert`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy before safetensors reads it)
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from swajax.config import ConfigError
from swajax.models.decoder import Decoder
from swajax.models.layers import LoadError
from swajax.models.spec import ModelSpec, model_spec

ORBAX_DIR = "params"


def read_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path} has no config.json") from e


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint (sharded via model.safetensors.index.json, or not)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise LoadError(f"{path} has no .safetensors files (and no {ORBAX_DIR}/ checkpoint)")
    weights: dict[str, np.ndarray] = {}
    for name in files:
        weights.update(load_file(str(path / name)))
    return weights


def load_decoder(path: str | Path) -> Decoder:
    """A `Decoder` with the weights of `path` (a HF checkpoint or a `swajax convert` output)."""
    path = Path(path)
    spec = model_spec(read_config(path))
    decoder = Decoder(spec)
    if (path / ORBAX_DIR).exists():
        return _restore_orbax(decoder, path / ORBAX_DIR)
    decoder.load(read_safetensors(path))
    return decoder


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def save_orbax(decoder: Decoder, source: str | Path, out: str | Path) -> None:
    """Write converted params as an orbax checkpoint next to a copy of config.json."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(source) / "config.json", out / "config.json")
    checkpointer = _checkpointer()
    checkpointer.save(out / ORBAX_DIR, nnx.state(decoder))
    checkpointer.wait_until_finished()


def _restore_orbax(decoder: Decoder, path: Path) -> Decoder:
    graphdef, abstract = nnx.split(decoder)
    state = _checkpointer().restore(path.resolve(), abstract)
    return nnx.merge(graphdef, state)


def spec_of(path: str | Path) -> ModelSpec:
    return model_spec(read_config(path))
