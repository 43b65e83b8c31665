"""Layers scanned by their repeating pattern, so tracing and compiling do not grow with depth.

A decoder's layers are cut into segments: a run of `repeats` copies of the same `period`
consecutive layers (gpt-oss-20b: S F x 12; Gemma 3: S S S S S F x k; the demo: S S F x 2)
becomes one `LayerStack`, run as a `lax.scan` over the copies whose body is one period of
layers with their parameters stacked on a leading axis; the layers in between stay as they
are. Two layers are copies when everything the model reads per layer is equal (`signature`):
the layer's kind, window and RoPE, its attention scale, its MLP kind, width and clamps. Only
where each layer's KV sits in the pools differs, and that comes into the scan as a traced slot
index (`KVPools.pages` reads a layer's pages without slicing its buffers out), and a MoE's
expert weights come in whole with the copy's index (`layers.ExpertWeight`), as do the plain
`Linear` kernels on CPU (`layers.StackedKernel`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from swajax import platform
from swajax.memory import bits
from swajax.memory.pool import Slot
from swajax.models import tensor_split
from swajax.models.layers import ExpertWeight, StackedKernel
from swajax.models.spec import ModelSpec

MAX_PERIOD = 16  # longer repeating patterns are not worth searching for


class Segment(NamedTuple):
    start: int
    period: int
    repeats: int

    @property
    def stop(self) -> int:
        return self.start + self.period * self.repeats


def signature(spec: ModelSpec, i: int) -> tuple:
    """Everything static the model reads for layer `i`: its `LayerSpec` and the i-th entry of
    every per-layer field of the spec (found by length, so a new per-layer field is covered
    without being named here)."""
    n = spec.num_layers
    per_layer = tuple(
        (f.name, value[i])
        for f in dataclasses.fields(spec)
        if isinstance(value := getattr(spec, f.name), tuple) and len(value) == n
    )
    return spec.hybrid.layers[i], per_layer


def segments(spec: ModelSpec, min_repeats: int = 2) -> tuple[Segment, ...]:
    """The decoder's layers as segments (`runs` of their signatures). KV-shared layers
    (Gemma 4) read another layer's pool slot, so a model that has any is not scanned."""
    n = spec.num_layers
    if any(layer.kv_source is not None for layer in spec.hybrid.layers):
        return tuple(Segment(i, 1, 1) for i in range(n))
    return runs([signature(spec, i) for i in range(n)], min_repeats)


def runs(sigs: list, min_repeats: int = 2) -> tuple[Segment, ...]:
    """Greedily, from each position on: the period whose copies cover the most items (the
    shortest among equals), if it repeats at least `min_repeats` times; else the item alone."""
    n, out, i = len(sigs), [], 0
    while i < n:
        best = Segment(i, 1, 1)
        for period in range(1, min(MAX_PERIOD, (n - i) // min_repeats) + 1):
            k = 1
            while i + (k + 1) * period <= n and (
                sigs[i + k * period : i + (k + 1) * period] == sigs[i : i + period]
            ):
                k += 1
            if k >= min_repeats and period * k > best.period * best.repeats:
                best = Segment(i, period, k)
        out.append(best)
        i = best.stop
    return tuple(out)


def _stacked(layers: list[nnx.Module], consume: bool = False) -> nnx.Module:
    """The first layer's module holding every layer's parameters stacked on a leading axis,
    those a scan slices as their bits (`memory.bits`; all but the experts, which are read out
    of the whole stack). `consume`: free each layer's arrays as soon as their stack is made,
    so the weights are never held twice (a published model's layers are most of the memory)."""
    graphdef, *_ = nnx.split(layers[0], ExpertWeight, ...)
    experts, rest = zip(*(nnx.split(layer, ExpertWeight, ...)[1:] for layer in layers), strict=True)

    def stack(held):
        def fn(*xs):
            out = held(jnp.stack(xs))
            if consume:
                for x in xs:
                    x.delete()
            return out

        return fn

    return nnx.merge(
        graphdef,
        jax.tree.map(stack(lambda x: x), *experts),
        jax.tree.map(stack(bits.to_bits), *rest),
    )


class LayerStack(nnx.Module):
    """`repeats` copies of `period` layers run as one `lax.scan` (see the module docstring)."""

    def __init__(self, layers: list[nnx.Module], segment: Segment, consume: bool = False):
        self.segment = segment
        p = segment.period
        # each parameter's dtype by its path, for those the stacks hold as bits
        self.dtypes = tuple(
            tuple(
                (_key(path), x.dtype.name)
                for path, x in jax.tree_util.tree_leaves_with_path(nnx.state(layers[j]))
            )
            for j in range(p)
        )
        self.stacks = nnx.List([_stacked(layers[j::p], consume) for j in range(p)])

    def __call__(self, x, positions, pools, meta, mode):
        start, period, repeats = self.segment
        slots = [
            [pools.slot(start + j * period + p) for p in range(period)] for j in range(repeats)
        ]
        is_swa = [slots[0][p].is_swa for p in range(period)]
        index = jnp.asarray(np.array([[s.index for s in row] for row in slots], np.int32))
        # Expert weights go in whole, every copy's (`layers.ExpertWeight`), and on CPU so do
        # the plain kernels where they are not split over devices (`layers.StackedKernel`:
        # read in chunks of their outputs); the rest is sliced.
        kernels = platform.is_cpu() and not tensor_split.on()
        dtypes = [dict(d) for d in self.dtypes]
        graphdefs, whole, sliced = zip(
            *(
                nnx.split(stack, _whole(kernels, held), ...)
                for stack, held in zip(self.stacks, dtypes, strict=True)
            ),
            strict=True,
        )

        def body(carry, xs):
            x, pools = carry
            layer_states, layer_index, copy = xs
            layer_states = [
                jax.tree_util.tree_map_with_path(
                    lambda path, a, held=held: bits.from_bits(a, held[_key(path)]), state
                )
                for state, held in zip(layer_states, dtypes, strict=True)
            ]
            for p in range(period):
                held = whole[p]
                if kernels:
                    held = jax.tree_util.tree_map_with_path(
                        lambda path, a, d=dtypes[p]: _stacked_kernel(path, a, copy, d), held
                    )
                layer = nnx.merge(graphdefs[p], held, layer_states[p])
                slot = Slot(layer_index[p], is_swa[p])
                x, pools = layer(x, positions, pools, meta, mode, slot=slot, copy=copy)
            return (x, pools), None

        # The stacks hold their weights as bits (`_stacked`: XLA:CPU would widen a bfloat16
        # stack whole to slice it, and copy it whole to make its bits), as the pools do theirs
        # (`KVPools.bits_of`).
        copies = jnp.arange(repeats, dtype=jnp.int32)
        (x, pools), _ = jax.lax.scan(body, (x, pools), (tuple(sliced), index, copies))
        return x, pools


PLAIN = ("float32", "bfloat16", "float16")  # the dtypes of kernels read out of the stack


def _key(path) -> str:
    """A parameter's path as "a.b.c", from a graph path or a tree path (without its value)."""
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return ".".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def _whole(kernels: bool, dtypes: dict):
    """The parameters a stack hands its layers whole: the experts, and with `kernels` the
    `Linear` kernels of a plain dtype (block-FP8 ones are dequantized per layer as sliced)."""

    def chosen(path, node) -> bool:
        if isinstance(node, ExpertWeight):
            return True
        return kernels and path[-1] == "kernel" and dtypes[_key(path)] in PLAIN

    return chosen


def _stacked_kernel(path, a, copy, dtypes: dict):
    """A parameter a stack hands its layers whole: a kernel as copy `copy`'s view of the stack
    (`layers.StackedKernel`), an expert weight as it is."""
    key = _key(path)
    return StackedKernel(a, copy, dtypes[key]) if key.endswith(".kernel") else a
