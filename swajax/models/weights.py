"""Fill an abstract decoder's parameters from a checkpoint, one tensor at a time.

The decoder is built with `nnx.eval_shape` (no zero-filled arrays, no programs run); each
parameter is then made with `jax.make_array_from_callback` in its final sharding, the callback
reading only the slice a device holds from the memory-mapped file and converting its dtype on
the way. Host memory during a load therefore stays near one tensor (a quantized tensor is
dequantized whole, still one at a time), never the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, make_single_device_sharding

from swajax.models import quantization
from swajax.models.checkpoint import Checkpoint, LoadError
from swajax.models.quantization import Quantization


def _variables(module: nnx.Module):
    return [(path, v) for path, v in nnx.iter_graph(module) if isinstance(v, nnx.Variable)]


def interleave_halves(w: np.ndarray) -> np.ndarray:
    """[..., gate | up] -> [..., g0, u0, g1, u1, ...]: every expert layout pairs gate and up
    columns, so splitting the last axis over devices keeps each pair on one device."""
    i = w.shape[-1] // 2
    out = np.empty(w.shape, w.dtype)
    out[..., 0::2], out[..., 1::2] = w[..., :i], w[..., i:]
    return out


def split_halves(w: np.ndarray) -> np.ndarray:
    """The inverse of `interleave_halves`: [..., g0, u0, g1, u1, ...] -> [..., gate | up]."""
    return np.concatenate([w[..., 0::2], w[..., 1::2]], axis=-1)


class Layout(NamedTuple):
    """How a checkpoint tensor becomes a parameter (`forward`) and back (`inverse`, which
    `swajax convert --to hf` writes): every rearrangement a load does must be invertible.
    `columns` (for a layout that only reorders the last axis): the source column of each
    output column, so a device's shard can be read without the rest of the tensor."""

    forward: Callable[[np.ndarray], np.ndarray]
    inverse: Callable[[np.ndarray], np.ndarray]
    columns: Callable[[np.ndarray, int], np.ndarray] | None = None

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return self.forward(a)


def _swap_expert_axes(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(1, 2)


# gate | up -> interleaved pairs: output column c is gate column c // 2, or up's if c is odd
PAIRED = Layout(interleave_halves, split_halves, lambda c, width: c // 2 + (c % 2) * (width // 2))
SWAPPED = Layout(_swap_expert_axes, _swap_expert_axes)  # [E, out, in] <-> [E, in, out]
SWAPPED_PAIRED = Layout(
    lambda a: interleave_halves(a.swapaxes(1, 2)), lambda a: split_halves(a).swapaxes(1, 2)
)


class WeightLoader:
    """`fill(param, name)` sets one parameter of `module` (an abstract NNX module)."""

    def __init__(
        self, checkpoint: Checkpoint, module: nnx.Module, quant=None, mesh=None, advance=None
    ):
        """`advance(n)`: told after each parameter is filled (a progress bar)."""
        self.checkpoint, self.quant, self.mesh = checkpoint, quant or Quantization(), mesh
        self._advance = advance or (lambda n=1: None)
        self._paths = {
            id(node): path
            for path, node in nnx.iter_graph(module)
            if isinstance(node, nnx.Variable)
        }
        self._device = make_single_device_sharding(jax.local_devices()[0])
        # Distinct (parameter, shard) slices copied out of the checkpoint, in bytes: with a mesh
        # over several processes, each reads its own devices' shards (and the replicated rest).
        self._read: dict[tuple[int, str], int] = {}

    def fill(self, param: nnx.Variable, name: str, *, transpose=False, transform=None) -> None:
        """param <- tensor `name` (transposed, then `transform`ed: a whole-tensor function)."""
        target = param.get_value()
        # Without a whole-tensor transform, each shard read is checked as it is read, so a
        # process loading only its shards reads only those (the finiteness check included).
        sliced = transform is None
        value = quantization.read(self.checkpoint, name, self.quant, target.dtype, check=not sliced)
        value = value.T if transpose else value
        value = transform(value) if transform is not None else value
        if tuple(value.shape) != tuple(target.shape):
            raise LoadError(
                f"tensor {name!r} has shape {tuple(value.shape)}, expected {tuple(target.shape)}"
            )
        dtype = np.dtype(target.dtype)

        def read(index):  # a copy: the device array must not alias the mapped file
            if sliced:
                start = tuple((i.start or 0) if isinstance(i, slice) else 0 for i in index)
                quantization.check_finite(name, value[index], start, reverse=transpose)
            shard = np.array(value[index], dtype=dtype, order="C", copy=True)
            return self._count(param, index, shard)

        param.set_value(jax.make_array_from_callback(target.shape, self._sharding(param), read))
        self.checkpoint.release()
        self._advance()

    def fill_stacked(self, param: nnx.Variable, names: list[list[str]], transform=None) -> None:
        """Stack per-expert nn.Linear weights: expert j's tensors `names[j]`, each [out, in],
        transposed and joined on the output axis (then `transform`ed), become param[j]. Each
        device's shard reads only its rows of the stored tensors when the layout says where
        its columns come from (`Layout.columns`); any other transform stacks on the host."""
        target = param.get_value()
        if len(names) != target.shape[0]:
            raise LoadError(f"{len(names)} experts for a parameter of shape {target.shape}")
        stored = [
            [
                quantization.read(self.checkpoint, n, self.quant, np.float32, check=False)
                for n in group
            ]
            for group in names
        ]
        for group, parts in zip(names, stored):
            width = sum(p.shape[0] for p in parts)
            if parts[0].shape[1] != target.shape[1] or width != target.shape[2]:
                shapes = [tuple(p.shape) for p in parts]
                raise LoadError(
                    f"tensors {group} have shapes {shapes}, expected together "
                    f"[{target.shape[2]}, {target.shape[1]}]"
                )
        self._put_stacked(param, names, stored, transform, check=True)
        self._advance()

    def _put_stacked(self, param, names, stored, layout, *, check: bool) -> None:
        """param [E, in, OUT] <- for each expert j the stored [out_p, in] tensors `stored[j]`,
        transposed, joined on the output axis and reordered by `layout.columns`; each shard
        is read from only the rows (output columns) and input columns it holds. A transform
        that is not a column map (no `columns`) is applied to whole experts on the host."""
        target = param.get_value()
        if layout is not None and getattr(layout, "columns", None) is None:
            host = np.empty(target.shape, np.dtype(target.dtype))
            for j, (group, parts) in enumerate(zip(names, stored)):
                if check:
                    for name, part in zip(group, parts):
                        quantization.check_finite(name, part)
                host[j] = layout(np.concatenate([p.T for p in parts], axis=-1))
            return self._put(param, host, names[0][0])
        experts, width_in, width = target.shape
        starts = np.cumsum([0] + [p.shape[0] for p in stored[0]])
        dtype = np.dtype(target.dtype)

        def read(index):
            e, rows, cols = (*index, *(slice(None),) * 3)[:3]
            out = np.arange(width)[cols]
            src = layout.columns(out, width) if layout is not None else out
            part = np.searchsorted(starts, src, side="right") - 1
            chosen = range(experts)[e]
            shard = np.empty((len(chosen), len(range(width_in)[rows]), len(out)), dtype)
            for k, j in enumerate(chosen):
                for p, tensor in enumerate(stored[j]):
                    mask = part == p
                    if not mask.any():
                        continue
                    block = tensor[src[mask] - starts[p]][:, rows]  # only these stored rows
                    if check:
                        quantization.check_finite(names[j][p], block)
                    shard[k][:, mask] = block.T
            return self._count(param, index, shard)

        param.set_value(jax.make_array_from_callback(target.shape, self._sharding(param), read))
        self.checkpoint.release()

    def fill_joined(self, param: nnx.Variable, names: list[str], transform=None) -> None:
        """Stacked per-expert projections, one tensor per projection [E, out, in] (Step 3.x's
        gate_proj and up_proj): transposed to [E, in, out], joined on the output axis (then
        `transform`ed) into param [E, in, sum(out)]."""
        target = param.get_value()
        parts = [
            np.swapaxes(quantization.read(self.checkpoint, n, self.quant, np.float32), 1, 2)
            for n in names
        ]
        joined = np.concatenate(parts, axis=-1)
        if joined.shape != tuple(target.shape):
            raise LoadError(
                f"tensors {names} join to shape {joined.shape}, expected {tuple(target.shape)}"
            )
        host = (transform(joined) if transform is not None else joined).astype(target.dtype)
        self._put(param, host, names[0])
        self._advance()

    def fill_mxfp4(self, blocks: nnx.Variable, scales: nnx.Variable, name: str, dtype) -> None:
        """Tensor `name`'s MXFP4 blocks and scales, kept as stored (`quantized.Mxfp4`, to be
        dequantized to `dtype`)."""
        b, s = quantization.mxfp4_parts(self.checkpoint, name, dtype)
        self._put(blocks, b, f"{name}_blocks")
        self._put(scales, s, f"{name}_scales")
        self._advance()

    def fill_fp8(self, kernel: nnx.Variable, scale: nnx.Variable, name: str, block) -> None:
        """An nn.Linear kept in float8 (`quantized.BlockFp8`): kernel [in, out] <- the stored
        [out, in] transposed, scale [in/bn, 1, out/bm] <- its inverse scales transposed."""
        w, s = quantization.fp8_parts(self.checkpoint, name, block)
        self._put(kernel, w.T, name)
        self._put(scale, s.T[:, None, :], f"{name}_scale_inv")
        self._advance()

    def fill_fp8_stacked(self, kernel, scale, names: list[list[str]], block, transform=None):
        """Per-expert float8 nn.Linear weights stacked as `fill_stacked` does (expert j's
        tensors transposed, joined on the output axis, then `transform`ed; each shard reading
        only its rows where the layout allows) and their scale grids beside them (small: on the
        host), one part per tensor: scale[j] [in/bn, parts, out/bm]."""
        tk, ts = kernel.get_value(), scale.get_value()
        s_host = np.empty(ts.shape, np.float32)
        if len(names) != tk.shape[0]:
            raise LoadError(f"{len(names)} experts for a parameter of shape {tk.shape}")
        stored = []
        for j, group in enumerate(names):
            parts = [quantization.fp8_parts(self.checkpoint, n, block) for n in group]
            joined = (parts[0][0].shape[1], sum(w.shape[0] for w, _ in parts))
            grids = np.stack([s.T for _, s in parts], axis=1)
            if joined != tk.shape[1:] or grids.shape != ts.shape[1:]:
                got, want = (joined, grids.shape), (tk.shape[1:], ts.shape[1:])
                raise LoadError(f"tensors {group} give (weights, scales) {got}, expected {want}")
            stored.append([w for w, _ in parts])
            s_host[j] = grids
        self._put_stacked(kernel, names, stored, transform, check=False)
        self._put(scale, s_host, f"{names[0][0]}_scale_inv")
        self._advance()

    def _put(self, param: nnx.Variable, host: np.ndarray, name: str) -> None:
        """param <- `host` exactly as it is (shape and dtype must match: no conversion)."""
        target = param.get_value()
        if tuple(host.shape) != tuple(target.shape) or host.dtype != np.dtype(target.dtype):
            raise LoadError(
                f"tensor {name!r} gives {host.dtype}{list(host.shape)}, expected "
                f"{np.dtype(target.dtype)}{list(target.shape)}"
            )

        def read(index):  # a copy: the device array must not alias the mapped file
            return self._count(param, index, np.array(host[index], order="C", copy=True))

        param.set_value(jax.make_array_from_callback(target.shape, self._sharding(param), read))
        self.checkpoint.release()

    def _count(self, param, index, shard: np.ndarray) -> np.ndarray:
        self._read[(id(param), str(index))] = shard.nbytes
        return shard

    @property
    def bytes_read(self) -> int:
        """Bytes of weights this process copied out of the checkpoint (each shard once)."""
        return sum(self._read.values())

    def _sharding(self, param):
        if self.mesh is None:
            return self._device
        from swajax.models.sharding import fitted, param_spec

        spec = fitted(param_spec(self._paths[id(param)]), param.get_value().shape, self.mesh)
        return NamedSharding(self.mesh, spec)

    def check_complete(self, module: nnx.Module) -> None:
        """Every parameter filled and every checkpoint tensor used (or knowingly ignored)."""
        for path, node in nnx.iter_graph(module):
            if isinstance(node, nnx.Variable) and isinstance(
                node.get_value(), jax.ShapeDtypeStruct
            ):
                raise LoadError(f"parameter {'.'.join(map(str, path))} was never loaded")
        extra = self.checkpoint.unconsumed()
        if extra:
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            raise LoadError(
                f"the model does not use checkpoint tensor(s) {extra[:5]}{more}: the checkpoint "
                "does not match this model's config"
            )
