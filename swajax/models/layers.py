"""Flax NNX building blocks of the hybrid decoder: norms, attention over the pools, MLP / MoE.

Linear kernels are stored [in, out]; `load(weights, prefix)` reads the Hugging Face file layout
(nn.Linear weights are [out, in]) and checks every shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from swajax.attention import as_pages, attention
from swajax.memory import pool as pool_lib
from swajax.models.rope import apply_rope
from swajax.models.spec import ModelSpec

HIGHEST = jax.lax.Precision.HIGHEST


class LoadError(ValueError):
    """A checkpoint tensor is missing or has the wrong shape; the message names it."""


def take(weights: dict, name: str, shape: tuple, *, transpose: bool = False) -> np.ndarray:
    if name not in weights:
        raise LoadError(f"tensor {name!r} is missing from the checkpoint")
    value = np.asarray(weights[name])
    value = value.T if transpose else value
    if tuple(value.shape) != tuple(shape):
        raise LoadError(f"tensor {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value.astype(np.float32)


def _param(shape) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, jnp.float32))


def _set(param: nnx.Param, value) -> None:
    param.set_value(jnp.asarray(value, jnp.float32))


class Linear(nnx.Module):
    def __init__(self, din: int, dout: int, bias: bool = False):
        self.kernel = _param((din, dout))
        self.bias = _param((dout,)) if bias else None

    def __call__(self, x):
        y = jnp.dot(x, self.kernel[...], precision=HIGHEST)
        return y + self.bias[...] if self.bias is not None else y

    def load(self, w, prefix):
        _set(self.kernel, take(w, f"{prefix}.weight", self.kernel[...].shape, transpose=True))
        if self.bias is not None:
            _set(self.bias, take(w, f"{prefix}.bias", self.bias[...].shape))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, plus_one: bool = False):
        self.weight, self.eps, self.plus_one = _param((dim,)), eps, plus_one

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...] + 1.0 if self.plus_one else self.weight[...]
        return (y * w).astype(x.dtype)

    def load(self, w, name):
        _set(self.weight, take(w, name, self.weight[...].shape))


def _act(name, x):
    return jax.nn.silu(x) if name == "silu" else jax.nn.gelu(x, approximate=True)


class Attention(nnx.Module):
    def __init__(self, spec: ModelSpec, layer_id: int):
        self.spec, self.layer_id = spec, layer_id
        self.layer = spec.hybrid.layers[layer_id]
        shape = (
            spec.hybrid.swa_attention if self.layer.kind.is_local else spec.hybrid.full_attention
        )
        self.shape = shape
        h, bias = spec.hidden, spec.attn_bias
        self.q_proj = Linear(h, shape.num_heads * shape.head_dim, bias)
        self.k_proj = Linear(h, shape.num_kv_heads * shape.head_dim, bias)
        self.v_proj = Linear(h, shape.num_kv_heads * shape.v_head_dim, bias)
        self.o_proj = Linear(
            shape.num_heads * shape.v_head_dim, h, bias and spec.family == "gpt_oss"
        )
        norm = spec.qk_norm == "weight"
        self.q_norm = RMSNorm(shape.head_dim, spec.eps, spec.norm_plus_one) if norm else None
        self.k_norm = RMSNorm(shape.head_dim, spec.eps, spec.norm_plus_one) if norm else None
        self.sinks = _param((shape.num_heads,)) if shape.has_sinks else None

    def load(self, w, prefix):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(self, name).load(w, f"{prefix}.{name}")
        if self.q_norm is not None:
            self.q_norm.load(w, f"{prefix}.q_norm.weight")
            self.k_norm.load(w, f"{prefix}.k_norm.weight")
        if self.sinks is not None:
            name = "sinks" if self.spec.family == "gpt_oss" else "attention_sink_bias"
            _set(self.sinks, take(w, f"{prefix}.{name}", self.sinks[...].shape))

    def __call__(self, x, positions, pools, meta, implementation, interpret):
        t, s, spec = x.shape[0], self.shape, self.spec
        q = self.q_proj(x).reshape(t, s.num_heads, s.head_dim)
        k = self.k_proj(x).reshape(t, s.num_kv_heads, s.head_dim)
        v = self.v_proj(x).reshape(t, s.num_kv_heads, s.v_head_dim) * spec.value_scale
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = spec.ropes[self.layer_id]
        if rope is not None:
            q, k = apply_rope(q, positions, rope), apply_rope(k, positions, rope)
            if spec.qk_norm == "l2":  # Llama 4: weightless RMS norm after RoPE
                q, k = _l2(q, spec.eps), _l2(k, spec.eps)
        elif spec.attn_temperature is not None:  # Llama 4 NoPE layers
            scale, floor = spec.attn_temperature
            tune = jnp.log1p(jnp.floor((positions.astype(jnp.float32) + 1) / floor)) * scale + 1
            q = q * tune[:, None, None]
        pools = pool_lib.write_kv(pools, self.layer_id, k, v, meta.write)
        k_buf, v_buf = pools.layer(self.layer_id)
        out = attention(
            q,
            as_pages(k_buf, meta.page_size),
            as_pages(v_buf, meta.page_size),
            meta,
            self.layer,
            scale=spec.scales[self.layer_id],
            sinks=None if self.sinks is None else self.sinks[...],
            soft_cap=spec.attn_soft_cap,
            implementation=implementation,
            interpret=interpret,
        )
        return self.o_proj(out.reshape(t, s.num_heads * s.v_head_dim)), pools


def _l2(x, eps):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class DenseMLP(nnx.Module):
    def __init__(self, hidden: int, width: int, act: str):
        self.gate_proj, self.up_proj = Linear(hidden, width), Linear(hidden, width)
        self.down_proj, self.act = Linear(width, hidden), act

    def __call__(self, x):
        return self.down_proj(_act(self.act, self.gate_proj(x)) * self.up_proj(x))

    def load(self, w, prefix):
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(self, name).load(w, f"{prefix}.{name}")


class GptOssMoE(nnx.Module):
    """Router (biased linear, softmax over the top-k logits); experts with interleaved gate/up,
    clamped, glu = gate * sigmoid(alpha * gate), out = (up + 1) * glu. All experts run on all
    tokens and unselected ones weigh 0 (a reference, not a fast path)."""

    def __init__(self, spec: ModelSpec):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec = spec
        self.router = Linear(h, e, bias=True)
        self.gate_up, self.gate_up_bias = _param((e, h, 2 * i)), _param((e, 2 * i))
        self.down, self.down_bias = _param((e, i, h)), _param((e, h))

    def load(self, w, prefix):
        self.router.load(w, f"{prefix}.router")
        for attr, name in (
            ("gate_up", "gate_up_proj"),
            ("gate_up_bias", "gate_up_proj_bias"),
            ("down", "down_proj"),
            ("down_bias", "down_proj_bias"),
        ):
            p = getattr(self, attr)
            _set(p, take(w, f"{prefix}.experts.{name}", p[...].shape))

    def __call__(self, x):
        spec = self.spec
        logits = self.router(x)
        top, idx = jax.lax.top_k(logits, spec.top_k)
        weights = (
            jnp.zeros_like(logits)
            .at[jnp.arange(x.shape[0])[:, None], idx]
            .set(jax.nn.softmax(top, axis=-1))
        )
        h = jnp.einsum("th,ehf->tef", x, self.gate_up[...], precision=HIGHEST)
        h = h + self.gate_up_bias[...]
        gate = jnp.minimum(h[..., 0::2], spec.swiglu_limit)
        up = jnp.clip(h[..., 1::2], -spec.swiglu_limit, spec.swiglu_limit)
        act = (up + 1) * gate * jax.nn.sigmoid(gate * spec.swiglu_alpha)
        out = (
            jnp.einsum("tei,eih->teh", act, self.down[...], precision=HIGHEST) + self.down_bias[...]
        )
        return jnp.einsum("te,teh->th", weights, out, precision=HIGHEST)


class Llama4MoE(nnx.Module):
    """Top-k router with sigmoid scores that scale each expert's *input*; plus a shared expert."""

    def __init__(self, spec: ModelSpec):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec = spec
        self.router = Linear(h, e)
        self.gate_up, self.down = _param((e, h, 2 * i)), _param((e, i, h))
        self.shared_expert = DenseMLP(h, i, "silu")

    def load(self, w, prefix):
        self.router.load(w, f"{prefix}.router")
        _set(self.gate_up, take(w, f"{prefix}.experts.gate_up_proj", self.gate_up[...].shape))
        _set(self.down, take(w, f"{prefix}.experts.down_proj", self.down[...].shape))
        self.shared_expert.load(w, f"{prefix}.shared_expert")

    def __call__(self, x):
        logits = self.router(x)
        top, idx = jax.lax.top_k(logits, self.spec.top_k)
        scores = jnp.full_like(logits, -jnp.inf).at[jnp.arange(x.shape[0])[:, None], idx].set(top)
        scores = jax.nn.sigmoid(scores)  # [T, E]; 0 for unselected experts
        xin = x[:, None, :] * scores[:, :, None]  # [T, E, H]
        h = jnp.einsum("teh,ehf->tef", xin, self.gate_up[...], precision=HIGHEST)
        i = h.shape[-1] // 2
        act = jax.nn.silu(h[..., :i]) * h[..., i:]
        out = jnp.einsum("tei,eih->th", act, self.down[...], precision=HIGHEST)
        return out + self.shared_expert(x)


class MimoMoE(nnx.Module):
    """Sigmoid router with a score-correction bias for the choice; normalized top-k weights."""

    def __init__(self, spec: ModelSpec):
        e, h, i = spec.num_experts, spec.hidden, spec.expert_intermediate
        self.spec = spec
        self.gate = Linear(h, e)
        self.correction = _param((e,))
        self.experts = nnx.List([DenseMLP(h, i, "silu") for _ in range(e)])

    def load(self, w, prefix):
        self.gate.load(w, f"{prefix}.gate")
        _set(
            self.correction, take(w, f"{prefix}.gate.e_score_correction_bias", (len(self.experts),))
        )
        for e, expert in enumerate(self.experts):
            expert.load(w, f"{prefix}.experts.{e}")

    def __call__(self, x):
        spec = self.spec
        scores = jax.nn.sigmoid(self.gate(x))
        _, idx = jax.lax.top_k(scores + self.correction[...], spec.top_k)
        chosen = jnp.take_along_axis(scores, idx, axis=-1)
        if spec.norm_topk:
            chosen = chosen / (jnp.sum(chosen, axis=-1, keepdims=True) + 1e-20)
        weights = jnp.zeros_like(scores).at[jnp.arange(x.shape[0])[:, None], idx].set(chosen)
        out = jnp.stack([expert(x) for expert in self.experts], axis=1)  # [T, E, H]
        return jnp.einsum("te,teh->th", weights * spec.routed_scale, out, precision=HIGHEST)
