"""A checkpoint's own stop tokens, as transformers' `generate` finds them, and its sampling
defaults, as vLLM's `--generation-config auto` takes them.

`generation_config.json`'s `eos_token_id` when that file sets one, else `config.json`'s (at the
top level or, in multimodal wrappers, under `text_config`). Either may be one id or a list.
transformers builds its generation config from `config.json` only when there is no
`generation_config.json`, so ids in `config.json` do not add to a generation config's.
"""

from __future__ import annotations

import json
from pathlib import Path

from swajax.config import ConfigError


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _ids(value, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ConfigError(
            f"{where}: 'eos_token_id' must be an id >= 0 or a list of them, got {value!r}"
        )
    return tuple(values)


def stop_token_ids(folder: str | Path) -> tuple[int, ...]:
    """The ids that end generation for the checkpoint in `folder` (empty if it names none)."""
    folder = Path(folder)
    generation = _read(folder / "generation_config.json")
    if generation is not None:
        ids = _ids(generation.get("eos_token_id"), str(folder / "generation_config.json"))
        if ids is not None:
            return ids
    config = _read(folder / "config.json") or {}
    ids = _ids(config.get("eos_token_id"), str(folder / "config.json"))
    text = config.get("text_config")
    if ids is None and isinstance(text, dict):
        ids = _ids(text.get("eos_token_id"), str(folder / "config.json") + " text_config")
    return ids or ()


# The fields of generation_config.json that become defaults for a request's unset sampling
# fields (vLLM's set; `SamplingParams.NEUTRAL` names the same fields).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(folder: str | Path) -> dict:
    """The checkpoint's sampling defaults from its generation_config.json (empty without one);
    a value of the wrong type is an error naming the field."""
    path = Path(folder) / "generation_config.json"
    generation = _read(path) or {}
    out = {}
    for name in SAMPLING_FIELDS:
        value = generation.get(name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or (name == "top_k" and not isinstance(value, int)):
            raise ConfigError(f"{path}: '{name}' must be a number, got {value!r}")
        out[name] = value
    return out
