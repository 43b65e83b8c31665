"""The mixture-of-experts blocks of GPT-OSS, Llama 4, MiMo-V2-Flash, Step 3.x and DeepSeek-V4:
each family's router, the
expert weights stacked [E, ...] with gate and up columns interleaved (GPT-OSS's own layout; the
others are reordered at load), and `swajax.models.experts` for the computation: routed when most
experts are skipped (`ModelSpec.routed_experts`), else every expert on every token (also the
reference the tests compare against).

Routers run in float32 whatever the parameter dtype, as transformers does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from swajax.models import experts as ex, quantized
from swajax.models.layers import F32, DenseMLP, Linear, expert_param, fp8_block, param
from swajax.models.spec import Act, ModelSpec
from swajax.models.weights import PAIRED, SWAPPED


def _stacked(
    module, name: str, spec: ModelSpec, shape: tuple[int, int, int], form: str, parts: int = 1
):
    """Declare expert weight `name` [E, in, out] in `form`: "plain" (`spec.dtype`), "mxfp4"
    (`name_blocks` / `name_scales` as published) or "fp8" (`name` float8 and `name_scale`, each
    of its `parts` column groups with its own block grid)."""
    e, din, dout = shape
    if form == "mxfp4":
        setattr(module, f"{name}_blocks", expert_param((e, dout, din // 32, 16), jnp.uint8))
        setattr(module, f"{name}_scales", expert_param((e, dout, din // 32), jnp.uint8))
    elif form == "fp8":
        block = _expert_block(spec, din, dout, parts)
        setattr(module, name, expert_param(shape, quantized.FP8))
        grid = quantized.grid(din, dout, block, parts)
        setattr(module, f"{name}_scale", expert_param((e, *grid)))
    else:
        setattr(module, name, expert_param(shape, spec.dtype))


def _weight(module, name: str, spec: ModelSpec, form: str):
    """Expert weight `name` as the expert computation takes it (quantized ones stay so)."""
    if form == "mxfp4":
        blocks, scales = getattr(module, f"{name}_blocks"), getattr(module, f"{name}_scales")
        return quantized.Mxfp4(blocks[...], scales[...], spec.dtype)
    if form == "fp8":
        w, s = getattr(module, name)[...], getattr(module, f"{name}_scale")[...]
        block = _expert_block(spec, *w.shape[-2:], parts=s.shape[-2])
        return quantized.BlockFp8(w, s, block, spec.dtype)
    return getattr(module, name)[...]


def _expert_block(spec: ModelSpec, din: int, dout: int, parts: int) -> tuple[int, int]:
    """The FP8 blocks of an [E, din, dout] expert weight whose `parts` column groups were
    quantized as separate tensors (per-tensor scales: one block per part)."""
    return fp8_block(spec.weights, din, dout // parts)


def _load_per_expert(module, w, prefix: str, names: tuple[str, str, str]) -> None:
    """Stack per-expert gate / up / down tensors (`prefix.experts.j.NAME.weight`, names in that
    order) into `module.gate_up` (pairs interleaved) and `module.down`, kept in float8 with
    their block scales where `module.form` says so."""
    gate, up, down = names
    experts = [f"{prefix}.experts.{j}" for j in range(module.spec.num_experts)]
    pairs = [[f"{e}.{gate}.weight", f"{e}.{up}.weight"] for e in experts]
    downs = [[f"{e}.{down}.weight"] for e in experts]
    if module.form != "fp8":
        w.fill_stacked(module.gate_up, pairs, transform=PAIRED)
        w.fill_stacked(module.down, downs)
        return
    for attr, group, transform in (("gate_up", pairs, PAIRED), ("down", downs, None)):
        kernel, scale = getattr(module, attr), getattr(module, f"{attr}_scale")
        _, din, dout = kernel.get_value().shape
        block = _expert_block(module.spec, din, dout, parts=len(group[0]))
        w.fill_fp8_stacked(kernel, scale, group, block, transform)


def _paired_experts(module, copy) -> ex.Experts:
    """`module.gate_up` / `module.down` (plain or float8, no biases) as the computation takes
    them (MiMo-V2-Flash, DeepSeek-V4)."""
    gate_up = _weight(module, "gate_up", module.spec, module.form)
    down = _weight(module, "down", module.spec, module.form)
    return ex.Experts(gate_up, None, down, None, copy)


def _run(spec: ModelSpec, x, routing: ex.Routing, weights: ex.Experts, act):
    fn = ex.routed if spec.routed_experts else ex.dense
    return fn(x, routing, weights, act)


def _swiglu_pairs(h):
    """SiLU(gate) * up over interleaved (gate, up) columns (see `weights.interleave_halves`)."""
    return jax.nn.silu(h[..., 0::2]) * h[..., 1::2]


class GptOssMoE(nnx.Module):
    """Router: biased linear, softmax over the top-k logits. Experts: interleaved gate/up,
    clamped, glu = gate * sigmoid(alpha * gate), out = (up + 1) * glu."""

    def __init__(self, spec: ModelSpec):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec = spec
        # MXFP4 checkpoints (GPT-OSS as published) keep their expert blocks on the device.
        self.form = "mxfp4" if spec.weights.method == "mxfp4" else "plain"
        self.router = Linear(h, e, bias=True)
        _stacked(self, "gate_up", spec, (e, h, 2 * i), self.form)
        _stacked(self, "down", spec, (e, i, h), self.form)
        self.gate_up_bias, self.down_bias = param((e, 2 * i)), param((e, h))

    def load(self, w, prefix):
        self.router.load(w, f"{prefix}.router")
        for attr, name in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
            if self.form == "mxfp4":
                blocks, scales = getattr(self, f"{attr}_blocks"), getattr(self, f"{attr}_scales")
                w.fill_mxfp4(blocks, scales, f"{prefix}.experts.{name}", self.spec.dtype)
            else:
                w.fill(getattr(self, attr), f"{prefix}.experts.{name}")
            w.fill(getattr(self, f"{attr}_bias"), f"{prefix}.experts.{name}_bias")

    def _act(self, h):
        limit, alpha = self.spec.swiglu_limit, self.spec.swiglu_alpha
        gate = jnp.minimum(h[..., 0::2], limit)
        up = jnp.clip(h[..., 1::2], -limit, limit)
        return (up + 1) * gate * jax.nn.sigmoid(gate * alpha)

    def __call__(self, x, copy=None, valid=None):
        top, idx = jax.lax.top_k(self.router(x.astype(F32)), self.spec.top_k)
        routing = ex.Routing(idx, None, jax.nn.softmax(top, axis=-1), valid)
        weights = ex.Experts(
            _weight(self, "gate_up", self.spec, self.form),
            self.gate_up_bias[...],
            _weight(self, "down", self.spec, self.form),
            self.down_bias[...],
            copy,
        )
        return _run(self.spec, x, routing, weights, self._act)


class Llama4MoE(nnx.Module):
    """Top-k router with sigmoid scores that scale each chosen expert's *input*; plus a shared
    expert on every token."""

    def __init__(self, spec: ModelSpec):
        e, h, i, dt = spec.num_experts, spec.hidden, spec.expert_intermediate, spec.dtype
        self.spec = spec
        self.router = Linear(h, e)
        self.gate_up, self.down = expert_param((e, h, 2 * i), dt), expert_param((e, i, h), dt)
        self.shared_expert = DenseMLP(h, i, Act.SILU, dt, quant=spec.weights)

    def load(self, w, prefix):
        self.router.load(w, f"{prefix}.router")
        w.fill(self.gate_up, f"{prefix}.experts.gate_up_proj", transform=PAIRED)
        w.fill(self.down, f"{prefix}.experts.down_proj")
        self.shared_expert.load(w, f"{prefix}.shared_expert")

    def __call__(self, x, copy=None, valid=None):
        top, idx = jax.lax.top_k(self.router(x.astype(F32)), self.spec.top_k)
        routing = ex.Routing(idx, jax.nn.sigmoid(top), jnp.ones_like(top), valid)
        weights = ex.Experts(self.gate_up[...], None, self.down[...], None, copy)
        return _run(self.spec, x, routing, weights, _swiglu_pairs) + self.shared_expert(x)


class MimoMoE(nnx.Module):
    """Sigmoid router; the choice adds a score-correction bias, the weights do not; normalized
    top-k weights times the routed scale. Per-expert gate/up/down tensors are stacked at load."""

    def __init__(self, spec: ModelSpec):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec = spec
        # Block-FP8 checkpoints (MiMo-V2-Flash as published) keep their experts in float8.
        self.form = "fp8" if spec.weights.method == "fp8" else "plain"
        self.gate = Linear(h, e)
        self.correction = param((e,))
        _stacked(self, "gate_up", spec, (e, h, 2 * i), self.form, parts=2)
        _stacked(self, "down", spec, (e, i, h), self.form)

    def load(self, w, prefix):
        self.gate.load(w, f"{prefix}.gate")
        w.fill(self.correction, f"{prefix}.gate.e_score_correction_bias")
        _load_per_expert(self, w, prefix, ("gate_proj", "up_proj", "down_proj"))

    def __call__(self, x, copy=None, valid=None):
        spec = self.spec
        scores = jax.nn.sigmoid(self.gate(x.astype(F32)))
        _, idx = jax.lax.top_k(scores + self.correction[...], spec.top_k)
        chosen = jnp.take_along_axis(scores, idx, axis=-1)
        if spec.norm_topk:
            chosen = chosen / (jnp.sum(chosen, axis=-1, keepdims=True) + 1e-20)
        routing = ex.Routing(idx, None, chosen * spec.routed_scale, valid)
        weights = _paired_experts(self, copy)
        return _run(spec, x, routing, weights, _swiglu_pairs)


class Step3MoE(nnx.Module):
    """Sigmoid router choosing by score + correction bias, normalized weights times the routed
    scale; experts stacked per projection [E, out, in] in the file; plus a shared expert. Both
    clamp SwiGLU at their layer's limits (Step 3.x)."""

    def __init__(self, spec: ModelSpec, layer_id: int):
        e, h, i, dt = spec.num_experts, spec.hidden, spec.expert_intermediate, spec.dtype
        self.spec, self.limit = spec, spec.expert_limits[layer_id]
        self.gate = Linear(h, e)
        self.correction = param((e,))
        self.gate_up, self.down = expert_param((e, h, 2 * i), dt), expert_param((e, i, h), dt)
        shared_limit = spec.mlp_limits[layer_id]
        self.share_expert = DenseMLP(
            h, spec.shared_intermediate, Act.SILU, dt, shared_limit, spec.weights
        )

    def load(self, w, prefix):
        """`prefix` is the layer's: the tensors sit under `moe.` and `share_expert.`."""
        self.gate.load(w, f"{prefix}.moe.gate")
        w.fill(self.correction, f"{prefix}.moe.router_bias")
        # gate_proj / up_proj [E, I, H] -> one [E, H, 2I], interleaved; down [E, H, I] -> [E, I, H]
        names = [f"{prefix}.moe.gate_proj.weight", f"{prefix}.moe.up_proj.weight"]
        w.fill_joined(self.gate_up, names, transform=PAIRED)
        w.fill(self.down, f"{prefix}.moe.down_proj.weight", transform=SWAPPED)
        self.share_expert.load(w, f"{prefix}.share_expert")

    def _act(self, h):
        gate, up = jax.nn.silu(h[..., 0::2]), h[..., 1::2]
        if self.limit is not None:
            gate, up = jnp.minimum(gate, self.limit), jnp.clip(up, -self.limit, self.limit)
        return gate * up

    def __call__(self, x, copy=None, valid=None):
        spec = self.spec
        scores = jax.nn.sigmoid(self.gate(x.astype(F32)))
        _, idx = jax.lax.top_k(scores + self.correction[...], spec.top_k)
        chosen = jnp.take_along_axis(scores, idx, axis=-1)
        chosen = chosen / jnp.sum(chosen, axis=-1, keepdims=True)
        routing = ex.Routing(idx, None, chosen * spec.routed_scale, valid)
        weights = ex.Experts(self.gate_up[...], None, self.down[...], None, copy)
        return _run(spec, x, routing, weights, self._act) + self.share_expert(x)


SCORES = {
    "sqrtsoftplus": lambda z: jnp.sqrt(jax.nn.softplus(z)),
    "sigmoid": jax.nn.sigmoid,
    "softmax": lambda z: jax.nn.softmax(z, axis=-1),
}


class DeepseekV4MoE(nnx.Module):
    """Scores sqrt(softplus(logits)) (the config's `scoring_func`); top-k by score + correction
    bias, or on hash layers the token id's fixed experts (`tid2eid`); chosen scores normalized,
    times the routed scale. Experts and the shared expert clamp SwiGLU *before* the SiLU: gate
    above, up both ways. Per-expert w1 / w3 / w2 tensors are stacked at load."""

    def __init__(self, spec: ModelSpec, layer_id: int):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec, self.hashed = spec, spec.v4.hash_layers[layer_id]
        self.form = "fp8" if spec.weights.method == "fp8" else "plain"
        self.gate = Linear(h, e)
        if self.hashed:
            self.tid2eid, self.correction = param((spec.vocab_size, spec.top_k), jnp.int32), None
        else:
            self.tid2eid, self.correction = None, param((e,))
        _stacked(self, "gate_up", spec, (e, h, 2 * i), self.form, parts=2)
        _stacked(self, "down", spec, (e, i, h), self.form)
        q = spec.weights if self.form == "fp8" else None
        self.w1 = Linear(h, i, dtype=spec.dtype, quant=q)
        self.w3 = Linear(h, i, dtype=spec.dtype, quant=q)
        self.w2 = Linear(i, h, dtype=spec.dtype, quant=q)

    def load(self, w, prefix):
        self.gate.load(w, f"{prefix}.gate")
        if self.hashed:
            w.fill(self.tid2eid, f"{prefix}.gate.tid2eid")
        else:
            w.fill(self.correction, f"{prefix}.gate.bias")
        _load_per_expert(self, w, prefix, ("w1", "w3", "w2"))
        for name in ("w1", "w2", "w3"):
            getattr(self, name).load(w, f"{prefix}.shared_experts.{name}")

    def _act(self, h):
        limit = self.spec.swiglu_limit
        gate, up = jnp.minimum(h[..., 0::2], limit), jnp.clip(h[..., 1::2], -limit, limit)
        return jax.nn.silu(gate) * up

    def __call__(self, x, tokens, valid=None):
        spec = self.spec
        scores = SCORES[spec.v4.scoring](self.gate(x.astype(F32)))
        if self.hashed:
            idx = self.tid2eid[...][tokens]
        else:
            _, idx = jax.lax.top_k(scores + self.correction[...], spec.top_k)
        chosen = jnp.take_along_axis(scores, idx, axis=-1)
        chosen = chosen / (jnp.sum(chosen, axis=-1, keepdims=True) + 1e-20)
        routing = ex.Routing(idx, None, chosen * spec.routed_scale, valid)
        weights = _paired_experts(self, None)  # never scanned (`DeepseekV4Decoder`)
        shared = self._act(jnp.stack([self.w1(x), self.w3(x)], axis=-1).reshape(x.shape[0], -1))
        return _run(spec, x, routing, weights, self._act) + self.w2(shared)
