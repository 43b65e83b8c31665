"""Gemma 4 (text): the layer, its attention and MoE block, and the per-layer inputs.

What changes memory: full layers may store one tensor as K and V (`attention_k_eq_v`): the
pool keeps the normed, un-rotated values and attention derives K = RoPE(V * k_norm weight) on
the rows it reads; KV-shared layers (`num_kv_shared_layers`) have no K/V projections and read
their source layer's pool rows (`KVPools.layers` maps them there); they write nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from swajax.attention import AttentionMode
from swajax.memory import pool as pool_lib
from swajax.models import experts as ex, invariant
from swajax.models.layers import (
    F32,
    DenseMLP,
    Linear,
    RMSNorm,
    act,
    expert_param,
    paged_attention,
    param,
    unit_rms,
)
from swajax.models.rope import apply_rope
from swajax.models.spec import ModelSpec
from swajax.models.weights import SWAPPED, SWAPPED_PAIRED


class Gemma4Attention(nnx.Module):
    def __init__(self, spec: ModelSpec, i: int):
        self.spec, self.layer_id = spec, i
        self.layer = spec.hybrid.layers[i]
        local = self.layer.kind.is_local
        s = spec.hybrid.swa_attention if local else spec.hybrid.full_attention
        self.shape, self.shared = s, self.layer.kv_source is not None
        h, dt = spec.hidden, spec.dtype
        self.q_proj = Linear(h, s.num_heads * s.head_dim, spec.qkv_bias, dt, spec.weights)
        self.o_proj = Linear(s.num_heads * s.head_dim, h, spec.o_bias, dt, spec.weights)
        self.q_norm = RMSNorm(s.head_dim, spec.eps)
        # A shared layer reading a K = V pool needs its source's k_norm weight to derive keys.
        own_keys = not self.shared
        self.k_norm = RMSNorm(s.head_dim, spec.eps) if own_keys or s.k_is_v else None
        self.k_proj = (
            Linear(h, s.num_kv_heads * s.head_dim, spec.qkv_bias, dt, spec.weights)
            if own_keys
            else None
        )
        has_v = own_keys and not s.k_is_v
        self.v_proj = (
            Linear(h, s.num_kv_heads * s.head_dim, spec.qkv_bias, dt, spec.weights)
            if has_v
            else None
        )

    def load(self, w, prefix):
        for name in ("q_proj", "o_proj", "k_proj", "v_proj"):
            if getattr(self, name) is not None:
                getattr(self, name).load(w, f"{prefix}.{name}")
        self.q_norm.load(w, f"{prefix}.q_norm.weight")
        if self.k_norm is not None:
            owner = self.layer_id if not self.shared else self.layer.kv_source
            self.k_norm.load(w, f"model.layers.{owner}.self_attn.k_norm.weight")

    def __call__(self, x, positions, pools, meta, mode: AttentionMode, slot=None):
        """`slot`: where this layer's KV lives when a `LayerStack` scans it (the stacked
        module carries the first copy's `layer_id`); by default the pools' slot of
        `layer_id`, which for a KV-shared layer is its source's."""
        t, s, spec = x.shape[0], self.shape, self.spec
        where = self.layer_id if slot is None else slot
        rope = spec.ropes[self.layer_id]
        q = self.q_norm(self.q_proj(x).reshape(t, s.num_heads, s.head_dim))
        q = apply_rope(q, positions, rope)
        if not self.shared:
            raw = self.k_proj(x).reshape(t, s.num_kv_heads, s.head_dim)
            v_in = raw if self.v_proj is None else self.v_proj(x).reshape(raw.shape)
            v = unit_rms(v_in, spec.eps)
            if s.k_is_v:
                pools = pool_lib.write_kv(pools, where, v, None, meta.write)
            else:
                k = apply_rope(self.k_norm(raw), positions, rope)
                pools = pool_lib.write_kv(pools, where, k, v, meta.write)
        key_transform = None
        if s.k_is_v:
            weight = self.k_norm.weight[...]

            def key_transform(rows, key_positions):  # K = RoPE(k_norm(raw)) = RoPE(V * w)
                # in the pool's dtype, as transformers rounds it; FP8 rows come back in q's
                dtype = q.dtype if rows.dtype in pool_lib.FP8 else rows.dtype
                scaled = (rows.astype(F32) * weight).astype(dtype)
                return apply_rope(scaled, key_positions, rope)

        out = paged_attention(
            q,
            pools,
            where,
            meta,
            self.layer,
            mode,
            scale=1.0,  # the q / k norms stand in for 1 / sqrt(d)
            key_transform=key_transform,
        )
        return self.o_proj(out.reshape(t, s.num_heads * s.head_dim)), pools


class Gemma4MoE(nnx.Module):
    """Router: weightless norm, times a learned scale and 1/sqrt(hidden), softmax over all
    experts, top-k renormalized, times a per-expert scale. Experts: GeGLU."""

    def __init__(self, spec: ModelSpec):
        e, h, i, dt = spec.num_experts, spec.hidden, spec.expert_intermediate, spec.dtype
        self.spec = spec
        self.proj = Linear(h, e)
        self.scale, self.per_expert_scale = param((h,)), param((e,))
        self.gate_up, self.down = expert_param((e, h, 2 * i), dt), expert_param((e, i, h), dt)

    def load(self, w, prefix):
        self.proj.load(w, f"{prefix}.router.proj")
        w.fill(self.scale, f"{prefix}.router.scale")
        w.fill(self.per_expert_scale, f"{prefix}.router.per_expert_scale")
        # transformers stores gate_up [E, 2I, H] and down [E, H, I] (nn.Linear orientation)
        w.fill(
            self.gate_up,
            f"{prefix}.experts.gate_up_proj",
            transform=SWAPPED_PAIRED,
        )
        w.fill(self.down, f"{prefix}.experts.down_proj", transform=SWAPPED)

    def __call__(self, router_in, x, copy=None, valid=None):
        spec = self.spec
        h = unit_rms(router_in, spec.eps).astype(F32)
        h = h * self.scale[...] * spec.hidden**-0.5
        probs = jax.nn.softmax(self.proj(h).astype(F32), axis=-1)
        top, idx = jax.lax.top_k(probs, spec.top_k)
        top = top / jnp.sum(top, axis=-1, keepdims=True) * self.per_expert_scale[...][idx]
        routing = ex.Routing(idx, None, top, valid)
        weights = ex.Experts(self.gate_up[...], None, self.down[...], None, copy)
        fn = ex.routed if spec.routed_experts else ex.dense
        return fn(x, routing, weights, lambda g: act(spec.act, g[..., 0::2]) * g[..., 1::2])


NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
MOE_NORMS = (
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
    "pre_feedforward_layernorm_2",
)
PLE_NORM = "post_per_layer_input_norm"


class Gemma4Layer(nnx.Module):
    def __init__(self, spec: ModelSpec, i: int):
        self.spec = spec
        self.self_attn = Gemma4Attention(spec, i)
        h = spec.hidden
        norms = (
            NORMS + (MOE_NORMS if spec.moe_block else ()) + ((PLE_NORM,) if spec.ple_dim else ())
        )
        for name in norms:
            setattr(self, name, RMSNorm(h, spec.eps))
        self.norms = norms
        self.mlp = DenseMLP(h, spec.intermediate[i], spec.act, spec.dtype, quant=spec.weights)
        self.moe = Gemma4MoE(spec) if spec.moe_block else None
        self.per_layer_input_gate = (
            Linear(h, spec.ple_dim, dtype=spec.dtype) if spec.ple_dim else None
        )
        self.per_layer_projection = (
            Linear(spec.ple_dim, h, dtype=spec.dtype) if spec.ple_dim else None
        )
        self.layer_scalar = param((1,))

    def load(self, w, prefix):
        self.self_attn.load(w, f"{prefix}.self_attn")
        for name in self.norms:
            getattr(self, name).load(w, f"{prefix}.{name}.weight")
        self.mlp.load(w, f"{prefix}.mlp")
        if self.moe is not None:
            self.moe.load(w, prefix)
        if self.per_layer_input_gate is not None:
            self.per_layer_input_gate.load(w, f"{prefix}.per_layer_input_gate")
            self.per_layer_projection.load(w, f"{prefix}.per_layer_projection")
        w.fill(self.layer_scalar, f"{prefix}.layer_scalar")

    def __call__(self, x, positions, pools, meta, mode, per_layer=None, slot=None, copy=None):
        """`slot` and `copy`: where the layer's KV lives and which copy it is, when a
        `LayerStack` scans it."""
        a, pools = self.self_attn(self.input_layernorm(x), positions, pools, meta, mode, slot)
        x = x + self.post_attention_layernorm(a)
        h = invariant.per_token(self.mlp)(self.pre_feedforward_layernorm(x))
        if self.moe is not None:
            valid = ex.rows_in_use(meta.token_valid)
            moe = invariant.per_token(functools.partial(self.moe, copy=copy, valid=valid))
            routed = moe(x, self.pre_feedforward_layernorm_2(x))
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(routed)
        x = x + self.post_feedforward_layernorm(h)
        if per_layer is not None:
            g = act(self.spec.act, self.per_layer_input_gate(x)) * per_layer.astype(x.dtype)
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return (x.astype(F32) * self.layer_scalar[...]).astype(x.dtype), pools


class PerLayerInputs(nnx.Module):
    """Gemma 4's per-layer inputs [T, layers, P]: a per-layer token embedding (times sqrt(P))
    plus a normed projection of the scaled input embedding, averaged by 1/sqrt(2)."""

    def __init__(self, spec: ModelSpec):
        n, p = spec.num_layers, spec.ple_dim
        self.spec = spec
        self.embed = param((spec.ple_vocab, n * p), spec.dtype)
        self.projection = Linear(spec.hidden, n * p, dtype=spec.dtype)
        self.norm = RMSNorm(p, spec.eps)

    def load(self, w):
        w.fill(self.embed, "model.embed_tokens_per_layer.weight")
        self.projection.load(w, "model.per_layer_model_projection")
        self.norm.load(w, "model.per_layer_projection_norm.weight")

    def __call__(self, tokens, x):
        n, p, spec = self.spec.num_layers, self.spec.ple_dim, self.spec
        table = self.embed[...]
        token = table[tokens].astype(F32) * jnp.asarray(p**0.5, table.dtype).astype(F32)
        proj = self.projection(x).astype(F32) * spec.hidden**-0.5
        proj = self.norm(proj.reshape(-1, n, p))
        return ((proj + token.reshape(-1, n, p)) * 2**-0.5).astype(x.dtype)
