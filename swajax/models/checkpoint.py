"""A Hugging Face checkpoint as a lazy, read-once mapping of tensor names to memory-mapped arrays.

The .safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes. Reading it through `mmap` costs no
host memory until a tensor's bytes are touched, and covers every dtype the hub ships (bfloat16,
float8 e4m3 / e5m2 and e8m0 via ml_dtypes), which `safetensors.safe_open(framework="np")` does
not. Every tensor the model takes is recorded, so a load can refuse a checkpoint that still holds
tensors nothing consumed (a missed weight never passes silently).
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Iterable
from pathlib import Path

import ml_dtypes
import numpy as np

from swajax.errors import InputError

DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
    "BOOL": np.bool_,
}
MAX_HEADER = 100 * 2**20  # the format's own limit on the JSON header


# Multimodal wrappers (`*ForConditionalGeneration`) keep the language model under a prefix: the
# hub's `language_model.model.*` / `language_model.lm_head.*`, or transformers 5's module paths
# `model.language_model.*` (its `lm_head.*` already at the top). Read as the text model's names.
TEXT_MODEL_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
)


def text_model_name(stored: str) -> str:
    """The text model's name of a tensor a multimodal wrapper stores under its own prefix."""
    for prefix, replacement in TEXT_MODEL_PREFIXES:
        if stored.startswith(prefix):
            return replacement + stored[len(prefix) :]
    return stored


class LoadError(InputError):
    """A checkpoint tensor is missing, unreadable, unused or of the wrong shape; the message
    names it."""


def read_header(file: Path) -> tuple[int, dict]:
    """(offset of the data section, {name: entry}) of one .safetensors file."""
    try:
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise LoadError(f"cannot read {file}: not a safetensors file (no header)")
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER:
                raise LoadError(f"cannot read {file}: {size}-byte header (limit {MAX_HEADER})")
            header = json.loads(f.read(size))
    except OSError as e:
        raise LoadError(f"cannot read {file}: {e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoadError(f"cannot read {file}: header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise LoadError(f"cannot read {file}: header is not a JSON object")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
        ok = ok and _ints(entry.get("shape")) and _ints(entry.get("data_offsets"))
        if not ok or len(entry["data_offsets"]) != 2:
            raise LoadError(f"cannot read {file}: bad header entry for tensor {name!r}")
    _check_layout(file, header, file.stat().st_size - 8 - size)
    return 8 + size, header


def _check_layout(file: Path, header: dict, data_bytes: int) -> None:
    """The format's rule: the tensors tile the data section exactly, in some order, with no
    overlap and no gap (as the reference reader checks); a header that breaks it would let
    two tensors alias the same bytes, or hide bytes no tensor owns."""
    spans = sorted((entry["data_offsets"], name) for name, entry in header.items())
    end, last = 0, None
    for (begin, stop), name in spans:
        if stop < begin:
            raise LoadError(f"cannot read {file}: tensor {name!r} ends ({stop}) before it begins")
        if begin < end:
            raise LoadError(
                f"cannot read {file}: tensor {name!r} (bytes {begin}-{stop}) overlaps tensor "
                f"{last!r}, which ends at {end}"
            )
        if begin > end:
            after = f"after tensor {last!r}" if last is not None else "at the start"
            raise LoadError(
                f"cannot read {file}: {begin - end} bytes {after} belong to no tensor (tensor "
                f"{name!r} begins at {begin})"
            )
        end, last = stop, name
    if end > data_bytes:
        raise LoadError(
            f"cannot read {file}: tensor {last!r} runs past its end ({end} bytes of data "
            f"declared, {data_bytes} present; truncated?)"
        )
    if end < data_bytes:
        raise LoadError(
            f"cannot read {file}: {data_bytes - end} bytes after the last tensor belong to "
            "no tensor"
        )


def _ints(x) -> bool:
    return isinstance(x, list) and all(isinstance(i, int) and i >= 0 for i in x)


class Checkpoint:
    """Tensors of one or more .safetensors files by name; `array(name)` is a read-only memmap
    view (no copy). `ignore` holds regular expressions of names the model may leave unread."""

    def __init__(self, files: Iterable[Path], ignore: Iterable[str] = ()):
        self._entries: dict[str, tuple[Path, int, dict]] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        self._stored: dict[str, str] = {}  # the name in the file, where a wrapper renamed it
        for file in files:
            start, header = read_header(file)
            for stored, entry in header.items():
                name = text_model_name(stored)
                if name in self._entries:
                    raise LoadError(
                        f"tensor {stored!r} appears in both {self._entries[name][0]} and {file}"
                    )
                self._entries[name] = (file, start, entry)
                if name != stored:
                    self._stored[name] = stored
        self._ignore = [re.compile(p) for p in ignore]
        self.consumed: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)

    def stored_name(self, name: str) -> str:
        """The name a file spells tensor `name` with (a multimodal wrapper's prefix kept)."""
        return self._stored.get(name, name)

    def dtype(self, name: str) -> str:
        return self._entry(name)[2]["dtype"]

    def array(self, name: str) -> np.ndarray:
        """The tensor as a memory-mapped view; marks it consumed."""
        file, start, entry = self._entry(name)
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise LoadError(
                f"tensor {name!r} in {file} has unsupported dtype {entry.get('dtype')!r}"
            )
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * np.dtype(dtype).itemsize:
            raise LoadError(f"tensor {name!r} in {file}: {end - begin} bytes for shape {shape}")
        data = np.frombuffer(self._map(file), np.uint8)
        if start + end > data.size:
            raise LoadError(f"cannot read {file}: tensor {name!r} runs past its end (truncated?)")
        self.consumed.add(name)
        return data[start + begin : start + end].view(dtype).reshape(shape)

    def unconsumed(self) -> list[str]:
        """Names no one read and no ignore pattern covers (as the files spell them)."""
        return [
            self.stored_name(n)
            for n in self.names()
            if n not in self.consumed and not any(p.search(n) for p in self._ignore)
        ]

    def _entry(self, name: str):
        try:
            return self._entries[name]
        except KeyError:
            raise LoadError(f"tensor {name!r} is missing from the checkpoint") from None

    def release(self) -> None:
        """Drop the pages read so far from this process's resident memory (they stay in the OS
        page cache); a load calls it after each tensor so its footprint stays one tensor."""
        for m in self._maps.values():
            if hasattr(m, "madvise"):
                m.madvise(mmap.MADV_DONTNEED)

    def _map(self, file: Path) -> mmap.mmap:
        if file not in self._maps:
            try:
                with open(file, "rb") as f:
                    self._maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise LoadError(f"cannot read {file}: {e}") from e
        return self._maps[file]
