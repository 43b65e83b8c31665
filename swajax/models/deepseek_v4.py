"""DeepSeek-V4 (Flax NNX): shared-KV MQA over a sliding window plus compressed entries (CSA
with the Lightning Indexer, HCA), grouped output projection, hyper-connections and hash / routed
MoE. The engine's model interface is `Decoder`'s (`swajax.models.decoder`).

Tensor names are the hub's (`layers.N.attn.wq_a.weight`, `embed.weight`, `hc_head_fn`, ...),
with or without the `model.` prefix transformers' `save_pretrained` adds to some of them.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from swajax.attention import AttentionMode
from swajax.memory import pool as pool_lib
from swajax.models import deepseek_v4_attention as v4_attention, experts
from swajax.models.deepseek_v4_compressor import Compressor, rope_tail, update
from swajax.models.hyper_connection import HyperConnection, HyperHead, expand
from swajax.models.layers import F32, HIGHEST, Head, Linear, RMSNorm, param, unit_rms
from swajax.models.moe import DeepseekV4MoE
from swajax.models.spec import ModelSpec
from swajax.models.weights import Layout

XLA = AttentionMode()


class V4Attention(nnx.Module):
    def __init__(self, spec: ModelSpec, i: int):
        v4, shape, dt = spec.v4, spec.hybrid.swa_attention, spec.dtype
        self.spec, self.layer_id, self.layer = spec, i, spec.hybrid.layers[i]
        h, d, hidden = shape.num_heads, shape.head_dim, spec.hidden
        self.heads, self.dim = h, d
        # Published in block FP8 (kept so on the device where the config says so): the query,
        # KV and output projections; the compressors' own stay float, as published.
        q = spec.weights
        self.wq_a = Linear(hidden, v4.q_lora_rank, dtype=dt, quant=q)
        self.q_norm = RMSNorm(v4.q_lora_rank, spec.eps)
        self.wq_b = Linear(v4.q_lora_rank, h * d, dtype=dt, quant=q)
        self.wkv, self.kv_norm = Linear(hidden, d, dtype=dt, quant=q), RMSNorm(d, spec.eps)
        self.wo_a = param((v4.o_groups, h * d // v4.o_groups, v4.o_lora_rank), dt)
        self.wo_b = Linear(v4.o_groups * v4.o_lora_rank, hidden, dtype=dt, quant=q)
        self.sinks = param((h,))
        rate, overlap = self.layer.compress_rate, self.layer.overlapping
        self.compressor = Compressor(hidden, d, rate, overlap, spec.eps, dt) if rate else None
        # CSA: the Lightning Indexer, with a compressor of its own
        csa = bool(rate) and overlap
        self.indexer = Compressor(hidden, v4.index_dim, rate, True, spec.eps, dt) if csa else None
        self.index_wq_b = (
            Linear(v4.q_lora_rank, v4.index_heads * v4.index_dim, dtype=dt, quant=q)
            if csa
            else None
        )
        self.index_weights = Linear(hidden, v4.index_heads, dtype=dt) if csa else None

    def load(self, w, prefix: str) -> None:
        for name in ("wq_a", "wq_b", "wkv", "wo_b"):
            getattr(self, name).load(w, f"{prefix}.{name}")
        self.q_norm.load(w, f"{prefix}.q_norm.weight")
        # The hub's name (transformers' `save_pretrained` writes `attn.norm`).
        self.kv_norm.load(w, (f"{prefix}.kv_norm.weight", f"{prefix}.norm.weight"))
        groups = self.wo_a.get_value().shape[0]
        w.fill(self.wo_a, f"{prefix}.wo_a.weight", transform=grouped_layout(groups))
        w.fill(self.sinks, f"{prefix}.attn_sink")
        if self.compressor is not None:
            self.compressor.load(w, f"{prefix}.compressor")
        if self.indexer is not None:
            self.indexer.load(w, f"{prefix}.indexer.compressor")
            self.index_wq_b.load(w, f"{prefix}.indexer.wq_b")
            self.index_weights.load(w, f"{prefix}.indexer.weights_proj")

    def __call__(self, x, positions, pools, meta, mode: AttentionMode):
        """`mode` is not read: these layers attend on the XLA path whatever it says (the
        kernels have no compressed keys)."""
        t, h, d, spec = x.shape[0], self.heads, self.dim, self.spec
        rope = spec.ropes[self.layer_id]
        residual = self.q_norm(self.wq_a(x))
        q = unit_rms(self.wq_b(residual).reshape(t, h, d), spec.eps)
        q = rope_tail(q, positions, rope)
        kv = rope_tail(self.kv_norm(self.wkv(x)).reshape(t, 1, d), positions, rope)
        slot = pools.slot(self.layer_id)
        pools = pool_lib.write_kv(pools, slot, kv, None, meta.write)
        compressed = index = None
        if self.compressor is not None:
            parts = [self.compressor] + ([self.indexer] if self.indexer is not None else [])
            comp = update(parts, pools.compressed, self.layer_id, x, meta, rope)
            pools = _with(pools, comp)
            compressed = comp.layer(self.layer_id)
        if self.indexer is not None:
            v4 = spec.v4
            iq = self.index_wq_b(residual).reshape(t, v4.index_heads, v4.index_dim)
            iq = rope_tail(iq, positions, rope)
            iw = self.index_weights(x).astype(F32) * v4.index_heads**-0.5
            index = (iq, iw)
        out = v4_attention.attend(
            q,
            pools,
            slot,
            meta,
            self.layer,
            scale=spec.scales[self.layer_id],
            sinks=self.sinks[...],
            compressed=compressed,
            index=index,
            topk=spec.v4.index_topk,
        )
        # K = V carries RoPE on its tail: rotate the output back at the query's position.
        out = rope_tail(out, -positions, rope)
        g = self.wo_a.shape[0]
        grouped = jnp.einsum(
            "tgi,gio->tgo",
            out.reshape(t, g, -1).astype(F32),
            self.wo_a[...].astype(F32),
            precision=HIGHEST,
        )
        return self.wo_b(grouped.reshape(t, -1).astype(x.dtype)), pools


def _with(pools, comp):
    return dataclasses.replace(pools, compressed=comp)


def grouped_layout(groups: int) -> Layout:
    """wo_a as stored, an nn.Linear [groups * rank, in / groups] whose rows are group after
    group, <-> [groups, in / groups, rank]."""

    def to_groups(a):
        return a.reshape(groups, a.shape[0] // groups, a.shape[1]).transpose(0, 2, 1)

    def from_groups(a):
        return a.transpose(0, 2, 1).reshape(-1, a.shape[1])

    return Layout(to_groups, from_groups)


class V4Layer(nnx.Module):
    def __init__(self, spec: ModelSpec, i: int):
        v4 = spec.v4
        self.attn = V4Attention(spec, i)
        self.ffn = DeepseekV4MoE(spec, i)
        self.attn_norm = RMSNorm(spec.hidden, spec.eps)
        self.ffn_norm = RMSNorm(spec.hidden, spec.eps)
        hc = (v4.hc_mult, spec.hidden, v4.hc_iters, v4.hc_eps, spec.eps)
        self.hc_attn, self.hc_ffn = HyperConnection(*hc), HyperConnection(*hc)

    def load(self, w, prefix: str) -> None:
        self.attn.load(w, f"{prefix}.attn")
        self.ffn.load(w, f"{prefix}.ffn")
        self.attn_norm.load(w, f"{prefix}.attn_norm.weight")
        self.ffn_norm.load(w, f"{prefix}.ffn_norm.weight")
        self.hc_attn.load(w, prefix, "attn")
        self.hc_ffn.load(w, prefix, "ffn")

    def __call__(self, streams, tokens, positions, pools, meta, mode):
        post, comb, x = self.hc_attn(streams)
        a, pools = self.attn(self.attn_norm(x), positions, pools, meta, mode)
        streams = expand(streams, post, comb, a)
        post, comb, x = self.hc_ffn(streams)
        valid = experts.rows_in_use(meta.token_valid)
        return expand(streams, post, comb, self.ffn(self.ffn_norm(x), tokens, valid)), pools


class V4MtpLayer(nnx.Module):
    """DeepSeek-V4's multi-token-prediction block (the hub's `mtp.N.*`, DeepSeek's reference
    `MTPBlock`): the token's embedding, normed and projected (`e_proj`), is added to every
    stream of the target's last-layer streams, each normed and projected (`h_proj`); one V4
    layer (a window-only one, top-k routed) runs on the streams; its own hyper-connection head
    and norm give what the target's head reads. Its output streams are what a next draft step
    reads."""

    def __init__(self, spec: ModelSpec):
        self.spec, h, q = spec, spec.hidden, spec.weights
        self.enorm, self.hnorm, self.norm = (RMSNorm(h, spec.eps) for _ in range(3))
        self.e_proj = Linear(h, h, dtype=spec.dtype, quant=q)
        self.h_proj = Linear(h, h, dtype=spec.dtype, quant=q)
        self.block = V4Layer(spec, 0)
        self.hc_head = HyperHead(spec.v4.hc_mult, h, spec.v4.hc_eps, spec.eps)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.spec.v4.hc_mult, self.spec.hidden)

    def load(self, w, prefix: str) -> None:
        names = names_of(w)
        prefixed = PrefixedLoader(w, names)
        for name in ("enorm", "hnorm", "norm"):
            getattr(self, name).load(prefixed, f"{prefix}.{name}.weight")
        self.e_proj.load(prefixed, f"{prefix}.e_proj")
        self.h_proj.load(prefixed, f"{prefix}.h_proj")
        self.block.load(prefixed, prefix)
        parts = ("fn", "base", "scale")
        self.hc_head.load(w, {p: names(f"{prefix}.hc_head_{p}") for p in parts})

    def __call__(self, embedded, streams, tokens, positions, pools, meta, mode):
        """(output streams [T, hc, H], pools)."""
        e = self.e_proj(self.enorm(embedded))
        x = self.h_proj(self.hnorm(streams.astype(embedded.dtype)))
        return self.block(x + e[:, None, :], tokens, positions, pools, meta, mode)

    def normed(self, streams):
        return self.norm(self.hc_head(streams))


class DeepseekV4Decoder(nnx.Module):
    """`Decoder`'s interface (load, scan_layers, __call__) for DeepSeek-V4."""

    def __init__(self, spec: ModelSpec):
        v4 = spec.v4
        self.spec = spec
        self.embed = param((spec.vocab_size, spec.hidden), spec.dtype)
        self.layers = nnx.List([V4Layer(spec, i) for i in range(spec.num_layers)])
        self.hc_head = HyperHead(v4.hc_mult, spec.hidden, v4.hc_eps, spec.eps)
        self.norm = RMSNorm(spec.hidden, spec.eps)
        self.head = Head(spec.hidden, spec.vocab_size, spec.dtype)

    def scan_layers(self, consume: bool = False) -> None:
        """Not scanned: CSA, HCA and window-only layers differ in parameters and stores."""

    def load(self, w):
        names = names_of(w)
        prefixed = PrefixedLoader(w, names)
        w.fill(self.embed, names("embed.weight", "embed_tokens.weight"))
        for i, layer in enumerate(self.layers):
            layer.load(prefixed, f"layers.{i}")
        parts = ("fn", "base", "scale")
        self.hc_head.load(w, {p: names(f"hc_head_{p}", f"hc_head.hc_{p}") for p in parts})
        self.norm.load(w, names("norm.weight"))
        self.head.load(w, names("head.weight", "lm_head.weight"))

    def __call__(self, tokens, positions, pools, meta, sample_index, *, mode=XLA):
        streams, pools = self.hidden(tokens, positions, pools, meta, mode=mode)
        return self.unembed(self.normed(streams[sample_index])), pools

    def embedded(self, tokens):
        return self.embed[...][tokens]

    def hidden(self, tokens, positions, pools, meta, *, mode=XLA):
        """The last layer's streams of every row [T, hc, H], and the pools."""
        x = self.embedded(tokens)
        streams = jnp.broadcast_to(x[:, None, :], (x.shape[0], self.spec.v4.hc_mult, x.shape[1]))
        for layer in self.layers:
            streams, pools = layer(streams, tokens, positions, pools, meta, mode)
        return streams, pools

    def normed(self, streams):
        return self.norm(self.hc_head(streams))

    def mtp_input(self, streams):
        """The MTP layer reads the streams themselves (DeepSeek's reference `MTPBlock`)."""
        return streams

    def unembed(self, x):
        return self.head(x)


class Names:
    """A checkpoint name as stored: the hub's, with transformers' `model.` prefix, or one of the
    aliases transformers writes for the top-level tensors."""

    def __init__(self, stored):
        self.stored = set(stored)

    def __call__(self, *candidates: str) -> str:
        for name in candidates:
            for full in (name, f"model.{name}"):
                if full in self.stored:
                    return full
        return candidates[0]  # absent: the loader names it in its error


def names_of(w) -> Names:
    """A loader resolves names against its checkpoint; a writer (`export`) writes the hub's."""
    checkpoint = getattr(w, "checkpoint", None)
    return Names(checkpoint.names() if checkpoint is not None else ())


class PrefixedLoader:
    """A `WeightLoader` whose names resolve through `Names` (layer tensors)."""

    def __init__(self, w, names: Names):
        self._w, self._names = w, names

    def __getattr__(self, attr):
        method = getattr(self._w, attr)
        if attr not in ("fill", "fill_stacked", "fill_fp8", "fill_fp8_stacked", "fill_joined"):
            return method

        def resolve(arg):
            if isinstance(arg, str):
                return self._names(arg)
            if isinstance(arg, tuple) and all(isinstance(a, str) for a in arg):  # aliases
                return self._names(*arg)
            if isinstance(arg, list) and arg and isinstance(arg[0], list):  # stacked groups
                return [[self._names(n) for n in group] for group in arg]
            return arg

        def resolved(*args, **kwargs):
            return method(*(resolve(a) for a in args), **kwargs)

        return resolved
