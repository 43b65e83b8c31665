"""Quantized checkpoint tensors as published, dequantized at load (one tensor at a time).

- MXFP4 (GPT-OSS experts, `quant_method: mxfp4`): a weight `X` is stored as `X_blocks`
  [..., R, G, 16] uint8 (two e2m1 values per byte, low nibble first) and `X_scales` [..., R, G]
  uint8 (e8m0: 2^(s - 127) per 32 values). Dequantized it is [..., R, G*32], transposed on its
  last two axes, the layout transformers' own dequantizer produces ([E, in, out] for experts).
- Fine-grained FP8 (MiMo-V2-Flash, DeepSeek-style, `quant_method: fp8`): `X.weight` float8 e4m3
  [out, in] with `X.weight_scale_inv` float32 [ceil(out/bm), ceil(in/bn)], value = w * scale of
  its (bm, bn) block; `weight_block_size` comes from the config (absent: one scale per tensor).

Both products are exact in float32 (a 4-bit or 8-bit float times a float32 scale), so a float32
model equals transformers' dequantized one bit for bit before any matmul.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from swajax.arith import ceil_div
from swajax.config import ConfigError
from swajax.models.checkpoint import Checkpoint, LoadError

METHODS = ("fp8", "mxfp4")
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
FLOAT8 = {"F8_E4M3", "F8_E5M2"}


@dataclasses.dataclass(frozen=True)
class Quantization:
    method: str | None = None  # None: plain float tensors only
    block: tuple[int, int] | None = None  # fp8: (rows, cols) per scale


def quantization(cfg: Mapping) -> Quantization:
    """The checkpoint's `quantization_config`; an unknown method is a `ConfigError` naming it."""
    q = cfg.get("quantization_config")
    if q is None:
        return Quantization()
    if not isinstance(q, Mapping):
        raise ConfigError("config field 'quantization_config' must be an object")
    method = q.get("quant_method")
    if method not in METHODS:
        raise ConfigError(
            f"quantization_config.quant_method {method!r} is not supported; supported: {METHODS}"
        )
    block = q.get("weight_block_size")
    if block is not None:
        ok = isinstance(block, list | tuple) and len(block) == 2
        if not ok or not all(
            isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block
        ):
            raise ConfigError(
                f"quantization_config.weight_block_size must be two positive ints, got {block!r}"
            )
        block = (block[0], block[1])
    fmt = q.get("fmt", "e4m3")
    if method == "fp8" and fmt != "e4m3":
        raise ConfigError(f"quantization_config.fmt {fmt!r} is not supported; supported: e4m3")
    return Quantization(method, block)


def mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype) -> np.ndarray:
    """Dequantize [..., R, G, 16] blocks and [..., R, G] scales to [..., G*32, R] of `dtype`."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise LoadError(
            f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match "
            "([..., R, G, 16] and [..., R, G])"
        )
    *lead, rows, groups, _ = blocks.shape
    out = np.empty((*lead, groups * 32, rows), dtype)
    flat_b = blocks.reshape(-1, rows, groups, 16)
    flat_s = scales.reshape(-1, rows, groups)
    flat_o = out.reshape(-1, groups * 32, rows)
    for i in range(flat_b.shape[0]):  # one expert at a time bounds the float32 temporaries
        b = np.asarray(flat_b[i], np.uint8)
        values = np.stack([FP4_VALUES[b & 0x0F], FP4_VALUES[b >> 4]], axis=-1)
        exponent = np.asarray(flat_s[i], np.int32)[..., None, None] - 127
        values = np.ldexp(values, exponent).reshape(rows, groups * 32)
        flat_o[i] = values.T.astype(dtype)
    return out


def block_fp8(weight: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] | None, dtype):
    """Dequantize float8 [..., rows, cols] with one scale per (bm, bn) block (or per tensor)."""
    w = np.asarray(weight).astype(np.float32)
    s = np.asarray(scale_inv).astype(np.float32)
    if block is None:
        if s.size != 1:
            raise LoadError(
                f"FP8 scale of shape {s.shape} needs quantization_config.weight_block_size"
            )
        return (w * s.reshape(())).astype(dtype)
    rows, cols = w.shape[-2:]
    bm, bn = block
    grid = (ceil_div(rows, bm), ceil_div(cols, bn))
    if s.shape[-2:] != grid or s.shape[:-2] != w.shape[:-2]:
        raise LoadError(
            f"FP8 scale grid {s.shape} does not fit weight {w.shape} in {bm}x{bn} blocks "
            f"(expected {(*w.shape[:-2], *grid)})"
        )
    full = np.repeat(np.repeat(s, bm, axis=-2)[..., :rows, :], bn, axis=-1)[..., :cols]
    return (w * full).astype(dtype)


def mxfp4_parts(checkpoint: Checkpoint, name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Tensor `name`'s MXFP4 blocks and scales as stored (kept quantized on the device, to be
    dequantized to `dtype`): a value that would not be finite in `dtype` is named here, as the
    dequantize-at-load path names it."""
    if f"{name}_blocks" not in checkpoint:
        raise LoadError(
            f"tensor {name!r} is not stored as MXFP4 ({name + '_blocks'!r} is "
            "missing); load with dequantize_weights to read any form"
        )
    blocks, scales = checkpoint.array(f"{name}_blocks"), checkpoint.array(f"{name}_scales")
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise LoadError(
            f"MXFP4 tensor {name!r}: blocks and scales must be uint8, got "
            f"{blocks.dtype} and {scales.dtype}"
        )
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise LoadError(
            f"MXFP4 tensor {name!r}: blocks {blocks.shape} and scales "
            f"{scales.shape} do not match [..., R, G, 16] and [..., R, G]"
        )
    if np.any(scales == E8M0_NAN):
        raise LoadError(
            f"tensor {name + '_scales'!r} holds the scale 255, which E8M0 reserves for NaN"
        )
    _check_mxfp4_range(name, blocks, scales, dtype)
    return blocks, scales


def _check_mxfp4_range(name: str, blocks, scales, dtype) -> None:
    """Only groups whose scale could lift the largest code (6) past `dtype`'s range are read
    (usually none: the check costs a pass over the scales, not the blocks)."""
    top = float(np.finfo(np.dtype(dtype)).max)
    safe = 127 + int(np.floor(np.log2(top / 6.0)))  # 6 * 2^(s - 127) <= top for every s <= safe
    risky = np.argwhere(np.asarray(scales) > safe)
    for index in map(tuple, risky):
        b = np.asarray(blocks[index], np.uint8)
        largest = float(np.abs(np.concatenate([FP4_VALUES[b & 0x0F], FP4_VALUES[b >> 4]])).max())
        if largest * 2.0 ** (int(scales[index]) - 127) > top:
            where = tuple(int(i) for i in index)
            raise LoadError(
                f"tensor {name!r} dequantizes to a non-finite value in "
                f"{np.dtype(dtype)} (MXFP4 group {where}, scale "
                f"2^{int(scales[index]) - 127})"
            )


def fp8_parts(checkpoint: Checkpoint, name: str, block: tuple[int, int]):
    """Tensor `name` (float8 e4m3 [out, in]) and its inverse scales [out/bm, in/bn] as stored,
    checked against the (bm, bn) block grid and for finite scales."""
    if name not in checkpoint:
        checkpoint.array(name)  # the missing-tensor error
    if checkpoint.dtype(name) not in FLOAT8:
        raise LoadError(
            f"tensor {name!r} is {checkpoint.dtype(name)}, not float8 as the "
            "config's quantization_config says; load with dequantize_weights to "
            "read it in any form"
        )
    scale = f"{name}_scale_inv"
    if scale not in checkpoint:
        raise LoadError(f"float8 tensor {name!r} has no {scale!r} beside it")
    w, s = checkpoint.array(name), checkpoint.array(scale)
    rows, cols = w.shape[-2:]
    want = (*w.shape[:-2], ceil_div(rows, block[0]), ceil_div(cols, block[1]))
    if s.size == 1 and want[-2:] == (1, 1):
        s = s.reshape(want)
    if tuple(s.shape) != want:
        raise LoadError(
            f"FP8 scale grid {s.shape} does not fit weight {w.shape} in "
            f"{block[0]}x{block[1]} blocks (expected {want})"
        )
    s = np.asarray(s, np.float32)
    check_finite(scale, s)
    return w, s


def read(
    checkpoint: Checkpoint, name: str, quant: Quantization, dtype, *, check: bool = True
) -> np.ndarray:
    """Tensor `name` as the model sees it: a lazy view when stored plainly, else dequantized.
    A value that is not finite (NaN or infinite, stored or from dequantizing) is an error naming
    the tensor: it would otherwise turn every logit it reaches into NaN, silently. `check=False`
    leaves that to the caller, who checks each slice it reads (`check_finite` with an offset):
    a process that loads only its shards then reads only those."""
    if name not in checkpoint and f"{name}_blocks" in checkpoint:
        if quant.method != "mxfp4":
            raise LoadError(
                f"tensor {name!r} is stored as MXFP4 blocks but the config's "
                f"quant_method is {quant.method!r}"
            )
        with np.errstate(over="ignore"):  # an overflow to inf is named below
            value = mxfp4(*mxfp4_parts(checkpoint, name, dtype), dtype)
    elif name in checkpoint and checkpoint.dtype(name) in FLOAT8:
        block = quant.block or tuple(checkpoint.array(name).shape[-2:])  # per tensor: one block
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named below
            value = block_fp8(*fp8_parts(checkpoint, name, block), block, dtype)
    else:
        value = checkpoint.array(name)
    if check:
        check_finite(name, value)
    return value


E8M0_NAN = 255
_CHECK_BYTES = 16 << 20  # rows checked at a time: a bounded temporary, never the whole tensor


def check_finite(name: str, value: np.ndarray, offset=(), reverse: bool = False) -> None:
    """LoadError naming `name` if a float tensor holds NaN or an infinity. `value` may be a
    slice of the tensor starting at `offset`, of its transpose if `reverse` (the index named is
    then the stored tensor's)."""
    if value.dtype.kind in "biu":  # bools and integers (ml_dtypes' floats are kind "V")
        return
    flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
    step = max(1, _CHECK_BYTES // max(1, flat.shape[1] * value.dtype.itemsize))
    for start in range(0, flat.shape[0], step):
        rows = flat[start : start + step]
        finite = np.isfinite(rows)  # ml_dtypes' bfloat16 and float8 have the ufunc too
        if not finite.all():
            where = np.unravel_index(
                int(np.argmin(finite.reshape(-1))) + start * flat.shape[1], value.shape
            )
            bad = value[where]
            if offset:
                where = tuple(int(i) + o for i, o in zip(where, offset))
            where = where[::-1] if reverse else where
            raise LoadError(
                f"tensor {name!r} holds a non-finite value ({float(bad)}) at "
                f"index {tuple(int(i) for i in where)}"
            )
