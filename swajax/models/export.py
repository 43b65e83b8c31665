"""Write a decoder back as a Hugging Face checkpoint (`swajax convert --to hf`).

The decoder's own `load` walks every parameter with its checkpoint name and layout; run against
a `WeightWriter` instead of a loader, the same walk inverts each layout (`weights.Layout`) and
collects the tensors under the names transformers reads. They are written as .safetensors
(the format's header and raw bytes, sharded with an index past `max_shard_bytes`), beside the
source's config.json and its other files. The tensors are what the decoder holds: a quantized
checkpoint loaded as published comes back in its quantized form (blocks, scales, float8 with
`weight_scale_inv`), one loaded with `dequantize_weights` dequantized (its `quantization_config`
dropped).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import jax
import numpy as np

from swajax.folder_swap import CONVERT_MARKER, FolderError, swap_in
from swajax.models.checkpoint import DTYPES, LoadError
from swajax.models.decoder import Decoder
from swajax.models.weights import Layout

SAFETENSORS_DTYPES = {np.dtype(v): k for k, v in DTYPES.items()}
NOT_COPIED = ("*.safetensors", "model.safetensors.index.json", "__init__.py", "config.json")
MAX_SHARD_BYTES = 5 * 2**30  # the hub's usual shard size


def _host(param) -> np.ndarray:
    return np.asarray(jax.device_get(param.get_value()))


def _inverse(transform, value: np.ndarray) -> np.ndarray:
    if transform is None:
        return value
    if not isinstance(transform, Layout):
        raise TypeError(f"a load's transform must be a weights.Layout to export, got {transform}")
    return transform.inverse(value)


class WeightWriter:
    """The `WeightLoader` interface run backwards: each call records checkpoint tensors."""

    def __init__(self):
        self.tensors: dict[str, np.ndarray] = {}

    def fill(self, param, name: str, *, transpose=False, transform=None) -> None:
        value = _inverse(transform, _host(param))
        self.tensors[name] = np.ascontiguousarray(value.T if transpose else value)

    def fill_stacked(self, param, names: list[list[str]], transform=None) -> None:
        host = _host(param)
        for j, group in enumerate(names):
            parts = np.split(_inverse(transform, host[j]), len(group), axis=-1)
            for name, part in zip(group, parts):
                self.tensors[name] = np.ascontiguousarray(part.T)

    def fill_joined(self, param, names: list[str], transform=None) -> None:
        parts = np.split(_inverse(transform, _host(param)), len(names), axis=-1)
        for name, part in zip(names, parts):
            self.tensors[name] = np.ascontiguousarray(np.swapaxes(part, 1, 2))

    def fill_mxfp4(self, blocks, scales, name: str, dtype=None) -> None:
        self.tensors[f"{name}_blocks"], self.tensors[f"{name}_scales"] = (
            _host(blocks),
            _host(scales),
        )

    def fill_fp8(self, kernel, scale, name: str, block) -> None:
        self.tensors[name] = np.ascontiguousarray(_host(kernel).T)
        self.tensors[f"{name}_scale_inv"] = np.ascontiguousarray(_host(scale)[:, 0, :].T)

    def fill_fp8_stacked(self, kernel, scale, names: list[list[str]], block, transform=None):
        weights, scales = _host(kernel), _host(scale)
        for j, group in enumerate(names):
            parts = np.split(_inverse(transform, weights[j]), len(group), axis=-1)
            for p, (name, part) in enumerate(zip(group, parts)):
                self.tensors[name] = np.ascontiguousarray(part.T)
                self.tensors[f"{name}_scale_inv"] = np.ascontiguousarray(scales[j][:, p, :].T)


def hf_tensors(decoder: Decoder) -> dict[str, np.ndarray]:
    """Every parameter of `decoder` under its Hugging Face name and layout."""
    writer = WeightWriter()
    decoder.load(writer)
    return writer.tensors


def write_safetensors(file: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset = {}, 0
    for name, value in tensors.items():
        dtype = SAFETENSORS_DTYPES.get(value.dtype)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: no safetensors dtype for {value.dtype}")
        header[name] = dict(
            dtype=dtype, shape=list(value.shape), data_offsets=[offset, offset + value.nbytes]
        )
        offset += value.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for value in tensors.values():
            f.write(value.tobytes())


def _shards(tensors: dict[str, np.ndarray], limit: int) -> list[dict[str, np.ndarray]]:
    shards, size = [{}], 0
    for name, value in tensors.items():
        if shards[-1] and size + value.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += value.nbytes
    return shards


def hf_config(source: Path, dtype: str, quantized: bool = False) -> dict:
    """The source's config.json as the exported weights are: in `dtype`, and dequantized
    unless the decoder kept its weights `quantized` (then written back as they were read)."""
    cfg = json.loads((source / "config.json").read_text())
    for fields in (cfg, cfg.get("text_config")):
        if isinstance(fields, dict):
            if not quantized:
                fields.pop("quantization_config", None)
            fields["dtype"] = dtype
            fields.pop("torch_dtype", None)
    return cfg


def save_hf(
    decoder: Decoder,
    source: str | Path,
    out: str | Path,
    *,
    dtype: str,
    force: bool = False,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> None:
    """Write `decoder` (loaded from `source`) as a Hugging Face folder at `out`: config.json,
    the weights, and every other file of `source` (tokenizer, generation config). Built aside
    and swapped into place, like `save_orbax`."""
    source = Path(source)
    tensors = hf_tensors(decoder)

    def build(folder: Path) -> None:
        for file in sorted(source.iterdir()):
            if file.is_file() and not any(file.match(p) for p in NOT_COPIED):
                shutil.copy(file, folder / file.name)
        kept = decoder.spec.weights.method is not None
        (folder / "config.json").write_text(json.dumps(hf_config(source, dtype, kept), indent=2))
        shards = _shards(tensors, max_shard_bytes)
        if len(shards) == 1:
            write_safetensors(folder / "model.safetensors", shards[0])
            return
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(folder / name, shard)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(v.nbytes for v in tensors.values())
        index = dict(metadata=dict(total_size=total), weight_map=weight_map)
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    try:
        swap_in(out, build, force=force, source=source, marker=CONVERT_MARKER)
    except FolderError as e:
        raise LoadError(str(e)) from None
