"""What a decoder's parameters hold on the device, counted from its abstract form.

The decoder of a `ModelSpec` is built with `nnx.eval_shape` (shapes only, nothing allocated or
read), so the bytes are those a load with the same options holds: quantized weights as kept
(`spec.weights`), everything else in `spec.dtype` or float32 where the model keeps it so. The
step-time model and `swajax plan` take their weight bytes from here, never from a table.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from swajax.models.decoder import decoder_for
from swajax.models.spec import ModelSpec

# The routed experts' parameters of every MoE block (quantized forms included): [E, ...].
EXPERT_LEAVES = {
    "gate_up",
    "down",
    "gate_up_bias",
    "down_bias",
    "gate_up_blocks",
    "down_blocks",
    "gate_up_scales",
    "down_scales",
    "gate_up_scale",
    "down_scale",
}
SCALES = {"kernel_scale", "gate_up_scales", "down_scales", "gate_up_scale", "down_scale"}


@dataclasses.dataclass(frozen=True)
class Footprint:
    params: int  # parameters, a quantized weight counted by its values (scales not counted)
    weight_bytes: int  # what the device holds for them, scales included
    expert_params: int  # of which the routed experts (0: a dense model)
    expert_bytes: int
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0

    @property
    def active_params(self) -> float:
        """Parameters one token runs: every dense one, k of E routed experts."""
        if not self.experts:
            return float(self.params)
        return self.params - self.expert_params * (1 - self.top_k / self.experts)


def _values(name: str, shape: tuple[int, ...]) -> int:
    """Values a parameter stands for: MXFP4 blocks hold two per byte; scales stand for none."""
    if name in SCALES:
        return 0
    n = int(np.prod(shape, dtype=np.int64))
    return 2 * n if name.endswith("_blocks") else n


def footprint(spec: ModelSpec) -> Footprint:
    abstract = nnx.state(nnx.eval_shape(lambda: decoder_for(spec)))
    params = nbytes = expert_params = expert_bytes = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        name = keys[-2] if keys[-1] == "value" and len(keys) > 1 else keys[-1]
        size = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
        values = _values(name, tuple(leaf.shape))
        params, nbytes = params + values, nbytes + size
        if spec.num_experts and name in EXPERT_LEAVES and leaf.shape[0] == spec.num_experts:
            expert_params, expert_bytes = expert_params + values, expert_bytes + size
    experts = spec.num_experts if expert_params else 0
    return Footprint(
        params, nbytes, expert_params, expert_bytes, experts, spec.top_k if experts else 0
    )


def config_footprint(
    cfg, *, dtype: str = "bfloat16", dequantize_weights: bool = False
) -> Footprint:
    """The footprint of a config.json-shaped dict loaded with these options (weights in
    `dtype`, the checkpoint's quantized ones kept unless `dequantize_weights`)."""
    from swajax.models.loading import decoder_spec

    return footprint(decoder_spec(dict(cfg), dtype=dtype, dequantize_weights=dequantize_weights))
