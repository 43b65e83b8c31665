"""Tensor parallelism over KV heads on a `jax.sharding.Mesh` (JAX's own SPMD, no home-made
distribution): projections split by heads, both KV pools split on their head axis, everything
else replicated. XLA inserts the one all-reduce each layer needs (after the output projection)."""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swajax.memory.mesh_axis import AXIS
from swajax.models.spec import Mlp

# Parameter path suffix -> how it splits (heads are the outer part of the projection axis).
_RULES = {
    ("q_proj", "kernel"): P(None, AXIS),
    ("q_proj", "bias"): P(AXIS),
    ("k_proj", "kernel"): P(None, AXIS),
    ("k_proj", "bias"): P(AXIS),
    ("v_proj", "kernel"): P(None, AXIS),
    ("v_proj", "bias"): P(AXIS),
    ("o_proj", "kernel"): P(AXIS, None),
    ("self_attn", "sinks"): P(AXIS),
    # Feed-forward blocks split their intermediate axis (Megatron style): one all-reduce after
    # the down projection. Expert gate/up columns are interleaved pairs, so a split keeps each
    # (gate, up) pair on one device; every device holds every expert (tensor, not expert,
    # parallel: the routed block loop needs no token exchange).
    ("gate_proj", "kernel"): P(None, AXIS),
    ("up_proj", "kernel"): P(None, AXIS),
    ("down_proj", "kernel"): P(AXIS, None),
    ("mlp", "gate_up"): P(None, None, AXIS),
    ("mlp", "gate_up_bias"): P(None, AXIS),
    ("mlp", "down"): P(None, AXIS, None),
    # Quantized forms of the same weights split the same axes (see `swajax.models.quantized`):
    # a float8 kernel as its float one, its block scales along the same axis where the blocks
    # divide evenly (`fitted`); MXFP4 blocks [E, out, in/32, 16] on out (gate_up) or in (down).
    ("q_proj", "kernel_scale"): P(None, None, AXIS),
    ("k_proj", "kernel_scale"): P(None, None, AXIS),
    ("v_proj", "kernel_scale"): P(None, None, AXIS),
    ("o_proj", "kernel_scale"): P(AXIS, None, None),
    ("gate_proj", "kernel_scale"): P(None, None, AXIS),
    ("up_proj", "kernel_scale"): P(None, None, AXIS),
    ("down_proj", "kernel_scale"): P(AXIS, None, None),
    ("mlp", "gate_up_scale"): P(None, None, None, AXIS),
    ("mlp", "down_scale"): P(None, AXIS, None, None),
    ("mlp", "gate_up_blocks"): P(None, AXIS, None, None),
    ("mlp", "gate_up_scales"): P(None, AXIS, None),
    ("mlp", "down_blocks"): P(None, None, AXIS, None),
    ("mlp", "down_scales"): P(None, None, AXIS),
    # DeepSeek-V4: one KV head (shared-KV MQA), so its pools stay whole on every device; the
    # query heads, the output groups and the experts' intermediate split instead.
    ("wq_b", "kernel"): P(None, AXIS),
    ("attn", "wo_a"): P(AXIS, None, None),
    ("wo_b", "kernel"): P(AXIS, None),
    ("attn", "sinks"): P(AXIS),
    ("ffn", "gate_up"): P(None, None, AXIS),
    ("ffn", "down"): P(None, AXIS, None),
    ("w1", "kernel"): P(None, AXIS),
    ("w3", "kernel"): P(None, AXIS),
    ("w2", "kernel"): P(AXIS, None),
}


def kv_mesh(num_devices: int | None = None) -> Mesh:
    devices = jax.devices()[: num_devices or len(jax.devices())]
    return Mesh(devices, (AXIS,))


def check_divisible(spec, mesh: Mesh) -> None:
    n = mesh.shape[AXIS]
    widths = [
        ("MLP intermediate", w) for w, k in zip(spec.intermediate, spec.mlps) if k is Mlp.DENSE
    ]
    if spec.num_experts:
        widths.append(("expert intermediate", spec.expert_intermediate))
    for name, width in widths:
        if width % n:
            raise ValueError(f"{name} size {width} is not divisible by the {n} devices of the mesh")
    if spec.v4 is not None:  # its pools are replicated (`pool_sharding`)
        return
    for name, shape in (("full", spec.hybrid.full_attention), ("SWA", spec.hybrid.swa_attention)):
        if shape.num_kv_heads % n:
            raise ValueError(
                f"{name} layers have {shape.num_kv_heads} KV heads, not divisible by "
                f"the {n} devices of the mesh"
            )


def param_spec(path) -> P:
    """How the parameter at `path` (NNX graph keys) splits: by heads, else replicated. The
    parameters of scanned layers (`layer_stack`) carry a leading layer axis, never split."""
    names = tuple(str(getattr(p, "key", getattr(p, "name", p))) for p in path)
    if names and names[-1] == "value":  # a pytree path into an `nnx.State` ends at the value
        names = names[:-1]
    spec = next((s for key, s in _RULES.items() if names[-len(key) :] == key), P())
    return P(None, *spec) if "stacks" in names and spec != P() else spec


def fitted(spec: P, shape, mesh: Mesh) -> P:
    """`spec`, or replicated where an axis it splits does not divide over the mesh (a block
    scale grid coarser than the split: every device then holds the whole small grid)."""
    n = mesh.shape[AXIS]
    if any(a == AXIS and dim % n for a, dim in zip(spec, shape)):
        return P()
    return spec


def shard_state(state, mesh: Mesh):
    """Place NNX params: attention projections split by heads, the rest replicated."""

    def place(path, x):
        sharding = NamedSharding(mesh, fitted(param_spec(path), x.shape, mesh))
        if isinstance(x, jax.ShapeDtypeStruct):  # a model of shapes only: where it would be
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return jax.device_put(x, sharding)

    return jax.tree_util.tree_map_with_path(place, state)


def pool_sharding(mesh: Mesh, spec=None) -> NamedSharding:
    """KV pools [layers, rows, kv_heads * dim]: split on the heads (whole heads per device:
    the minor axis is head-major); DeepSeek-V4's single shared KV head (and its compressed
    stores) replicated."""
    if spec is not None and spec.v4 is not None:
        return replicated(mesh)
    return NamedSharding(mesh, P(None, None, AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
