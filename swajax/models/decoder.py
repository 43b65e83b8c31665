"""The hybrid decoder (Flax NNX) and its engine adapter.

Every layer reads and writes KV through the pools and the per-batch metadata, so the model runs
inside the engine; `HybridLM` is the engine's model interface (`init_pools`, `forward`).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from swajax import platform
from swajax.attention import AttentionMode
from swajax.errors import InputError
from swajax.memory import pool as pool_lib
from swajax.models import experts, invariant, layer_stack, tensor_split
from swajax.models.gemma4 import Gemma4Layer, PerLayerInputs
from swajax.models.layers import Attention, DenseMLP, Head, head_dot, lookup, norm_of, param
from swajax.models.moe import GptOssMoE, Llama4MoE, MimoMoE, Step3MoE
from swajax.models.sampling import SampleMode, sample
from swajax.models.spec import Block, Mlp, ModelSpec

XLA = AttentionMode()
GREEDY_OR_PLAIN = SampleMode()  # no penalties, no top-N logprobs
MLPS = {Mlp.GPT_OSS_MOE: GptOssMoE, Mlp.LLAMA4_MOE: Llama4MoE, Mlp.MIMO_MOE: MimoMoE}


# The residual block's norms, by layout: pre-norm (Llama), Gemma's sandwich, post-norm (Olmo 2/3,
# Exaone 4: norms on each sublayer's output, none on its input), parallel (Cohere: attention and
# MLP read the same normed input and both add to the residual).
NORMS = {
    Block.PRE: ("input_layernorm", "post_attention_layernorm"),
    Block.SANDWICH: (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    Block.POST: ("post_attention_layernorm", "post_feedforward_layernorm"),
    Block.PARALLEL: ("input_layernorm",),
}


class DecoderLayer(nnx.Module):
    def __init__(self, spec: ModelSpec, i: int):
        self.spec = spec
        self.self_attn = Attention(spec, i)
        for name in NORMS[spec.block]:
            setattr(self, name, norm_of(spec, spec.hidden))
        kind = spec.mlps[i]
        limit = spec.mlp_limits[i] if spec.mlp_limits else None
        if kind is Mlp.STEP3_MOE:
            self.mlp = Step3MoE(spec, i)
        elif kind in MLPS:
            self.mlp = MLPS[kind](spec)
        else:
            self.mlp = DenseMLP(
                spec.hidden, spec.intermediate[i], spec.act, spec.dtype, limit, spec.weights
            )

    def load(self, w, prefix):
        self.self_attn.load(w, f"{prefix}.self_attn")
        for name in NORMS[self.spec.block]:
            getattr(self, name).load(w, f"{prefix}.{name}.weight")
        if isinstance(self.mlp, Step3MoE):  # its tensors: moe.* and share_expert.*
            self.mlp.load(w, prefix)
        else:
            self.mlp.load(
                w, f"{prefix}.{'feed_forward' if self.spec.family == 'llama4' else 'mlp'}"
            )

    def __call__(self, x, positions, pools, meta, mode, slot=None, copy=None):
        """`slot` and `copy`: where the layer's KV lives and which copy it is, when a
        `LayerStack` scans it (a MoE reads its copy's experts out of the whole stack)."""
        block = self.spec.block
        mlp = self.mlp
        if not isinstance(mlp, DenseMLP):
            valid = experts.rows_in_use(meta.token_valid)
            mlp = functools.partial(mlp, copy=copy, valid=valid)
        mlp = invariant.per_token(mlp)  # a router's reductions too
        if block is Block.POST:
            a, pools = self.self_attn(x, positions, pools, meta, mode, slot)
            x = x + self.post_attention_layernorm(a)
            return x + self.post_feedforward_layernorm(mlp(x)), pools
        h = self.input_layernorm(x)
        a, pools = self.self_attn(h, positions, pools, meta, mode, slot)
        if block is Block.PARALLEL:
            return x + a + mlp(h), pools
        if block is Block.SANDWICH:
            x = x + self.post_attention_layernorm(a)
            return x + self.post_feedforward_layernorm(
                mlp(self.pre_feedforward_layernorm(x))
            ), pools
        x = x + a
        return x + mlp(self.post_attention_layernorm(x)), pools


class Decoder(nnx.Module):
    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.embed = param((spec.vocab_size, spec.hidden), spec.dtype)
        layer = Gemma4Layer if spec.family == "gemma4" else DecoderLayer
        self.layers = nnx.List([layer(spec, i) for i in range(spec.num_layers)])
        self.per_layer_inputs = PerLayerInputs(spec) if spec.ple_dim else None
        self.norm = norm_of(spec, spec.hidden)
        tied = spec.tie_embeddings
        self.lm_head = None if tied else Head(spec.hidden, spec.vocab_size, spec.dtype)
        self.scanned = False

    def scan_layers(self, consume: bool = False) -> None:
        """Regroup the layers in place into `layer_stack` segments: repeating runs become one
        `LayerStack` (a scan), the rest stay single layers. Done once the weights are in
        (loading and export address layer i of the checkpoint); Gemma 4 is not scanned.
        `consume`: the layers' own arrays are freed as they are stacked."""
        if self.scanned or self.per_layer_inputs is not None:
            return
        layers = list(self.layers)
        out = []
        for seg in layer_stack.segments(self.spec):
            run = layers[seg.start : seg.stop]
            out.extend(run if seg.repeats == 1 else [layer_stack.LayerStack(run, seg, consume)])
        self.layers = nnx.List(out)
        self.scanned = True

    def load(self, w):
        """Fill every parameter through `w` (a `swajax.models.weights.WeightLoader`)."""
        if self.scanned:
            raise ValueError("load the weights before scan_layers() regroups the layers")
        w.fill(self.embed, "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(w, f"model.layers.{i}")
        if self.per_layer_inputs is not None:
            self.per_layer_inputs.load(w)
        self.norm.load(w, "model.norm.weight")
        if self.lm_head is not None:
            self.lm_head.load(w, "lm_head.weight")

    def __call__(self, tokens, positions, pools, meta, sample_index, *, mode=XLA):
        """Logits [len(sample_index), vocab] of the given rows, and the updated pools."""
        x, pools = self.hidden(tokens, positions, pools, meta, mode=mode)
        return self.unembed(self.normed(x[sample_index])), pools

    def embedded(self, tokens):
        """The input embedding of `tokens` (scaled as the family scales it)."""
        embed = self.embed[...]
        return lookup(embed, tokens) * jnp.asarray(self.spec.embed_scale, embed.dtype)

    def hidden(self, tokens, positions, pools, meta, *, mode=XLA):
        """The last layer's output of every row (before the final norm), and the pools."""
        x = self.embedded(tokens)
        if self.per_layer_inputs is None:
            for layer in self.layers:
                x, pools = layer(x, positions, pools, meta, mode)
        else:  # Gemma 4: each layer adds its own slice of the per-layer inputs
            per_layer = self.per_layer_inputs(tokens, x)
            for i, layer in enumerate(self.layers):
                x, pools = layer(x, positions, pools, meta, mode, per_layer[:, i])
        return x, pools

    def normed(self, x):
        """Rows of `hidden`'s output as the head reads them: the final norm's output."""
        return self.norm(x)

    def mtp_input(self, x):
        """What the family's MTP layer reads of `hidden`'s output: the final norm's output."""
        return self.normed(x)

    def unembed(self, x):
        """Float32 logits of normed rows `x` (whatever the parameter dtype)."""
        if self.lm_head is None:  # tied: the embedding table, read as stored [V, H]
            logits = head_dot(x, self.embed[...], vocab_first=True)
        else:
            logits = self.lm_head(x)
        if self.spec.logit_scale != 1.0:  # Cohere
            logits = logits * self.spec.logit_scale
        if self.spec.final_soft_cap is not None:
            cap = self.spec.final_soft_cap
            logits = jnp.tanh(logits / cap) * cap
        return logits


@contextlib.contextmanager
def traced(mode: AttentionMode):
    """The trace-time switches of a step's `mode`: batch invariance, and whether the weights
    are split over devices (tensor parallel, `mode.mesh`)."""
    with invariant.batch_invariant(mode.deterministic):
        with tensor_split.split_over_devices(mode.mesh is not None):
            yield


class Forward:
    """The traced body of a step's model half: forward the batch, sample inside the same
    program. Static (hashable) so it can be an argument of any jit, the engine's fused step
    included; instances are interned, so equal (graphdef, mode, treedef) share one object and
    jit's cache compares them by identity (hashing a GraphDef walks the whole module tree, ~160
    us for a 3-layer model, which every step would pay).

    The parameters come in as a flat tuple of arrays (`HybridLM.params`) and are rebuilt into
    the module's state by `treedef` while tracing: jit flattens a tuple in C++, where an
    `nnx.State` is flattened leaf by leaf in Python on every call (60 leaves for the demo)."""

    __slots__ = ("graphdef", "mode", "treedef")

    def __init__(self, graphdef, mode: AttentionMode, treedef):
        self.graphdef, self.mode, self.treedef = graphdef, mode, treedef

    def _model(self, params):
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, params))

    def logits(self, params, pools, tokens, meta, rows):
        """Logits of the flat rows `rows` of a forward of `tokens` (a draft's proposals, a
        verify step's rows), and the pools with the batch's KV written."""
        model = self._model(params)
        with traced(self.mode):
            return model(tokens, meta.positions, pools, meta, rows, mode=self.mode)

    def hidden_logits(self, params, pools, tokens, meta, rows):
        """(hidden, logits, pools): what the family's multi-token-prediction layer reads of
        every row (`mtp_input`: [T, H], or DeepSeek-V4's streams [T, hc, H]), the logits of the
        flat rows `rows`, and the pools with the batch's KV written."""
        model = self._model(params)
        with traced(self.mode):
            x, pools = model.hidden(tokens, meta.positions, pools, meta, mode=self.mode)
            return model.mtp_input(x), model.unembed(model.normed(x[rows])), pools

    def __call__(
        self,
        params,
        pools,
        batch,
        meta,
        return_logits: bool,
        penalties=None,
        mode: SampleMode = GREEDY_OR_PLAIN,
        *,
        hidden: bool = False,
    ):
        """(pools, penalties, Sampled): forward the batch, then sample its sampled rows.
        `hidden`: (pools, penalties, Sampled, `mtp_input` of every row)."""
        if hidden:
            tokens, rows = batch.tokens, batch.logit_index
            x, logits, pools = self.hidden_logits(params, pools, tokens, meta, rows)
        else:
            model = self._model(params)
            with traced(self.mode):
                logits, pools = model(
                    batch.tokens, meta.positions, pools, meta, batch.logit_index, mode=self.mode
                )
        sampled, penalties = sample(logits[batch.sample_index], batch, penalties, mode)
        sampled = sampled._replace(logits=logits if return_logits else None)
        return (pools, penalties, sampled, x) if hidden else (pools, penalties, sampled)


_FORWARDS: dict = {}


def forward_of(graphdef, mode: AttentionMode, treedef) -> Forward:
    key = (graphdef, mode, treedef)
    return _FORWARDS[key] if key in _FORWARDS else _FORWARDS.setdefault(key, Forward(*key))


def decoder_for(spec: ModelSpec) -> nnx.Module:
    """The decoder module of a family: `Decoder`, or DeepSeek-V4's own (same interface)."""
    if spec.family == "deepseek_v4":
        from swajax.models.deepseek_v4 import DeepseekV4Decoder

        return DeepseekV4Decoder(spec)
    return Decoder(spec)


class HybridLM:
    """The engine's model: a `Decoder` plus its KV pools' dtype and attention implementation."""

    needs_kv = True

    def __init__(
        self,
        decoder: Decoder,
        *,
        dtype: str = "fp32",
        implementation: str = "xla",
        interpret: bool = False,
        mesh=None,
        scan_layers: bool = True,
        consume: bool = False,
        deterministic: bool = False,
    ):
        """`scan_layers`: run repeating runs of layers as scans (`layer_stack`); the caller's
        `decoder` is left as it is, unless `consume`: then its scanned layers' arrays are freed
        as they are restacked (the weights are never held twice; the decoder is not usable
        afterwards). `deterministic`: batch-invariant numerics (`invariant`), XLA attention."""
        self.spec = decoder.spec
        if deterministic and self.spec.family == "deepseek_v4":
            raise InputError(
                "deterministic mode (--deterministic) is not built for deepseek_v4: its "
                "compressed attention and hyper-connections run products of their own"
            )
        # A decoder of shapes only (`nnx.eval_shape`): a model to lower ahead of time, for this
        # platform or another (`swajax.platform.lowering_for`); it cannot run.
        self.abstract = any(
            isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(decoder))
        )
        if scan_layers:

            def scanned(decoder):
                decoder = nnx.merge(*nnx.split(decoder))  # a new module tree, the same arrays
                decoder.scan_layers(consume)
                return decoder

            decoder = nnx.eval_shape(scanned, decoder) if self.abstract else scanned(decoder)
        self.vocab_size = self.spec.vocab_size
        self.graphdef, self.state = nnx.split(decoder)
        self.dtype, self.implementation, self.interpret = dtype, implementation, interpret
        self.mesh = mesh  # tensor parallel over KV heads (swajax.models.sharding)
        # Where the runner keeps its own state (allocator, request table) and each step's
        # upload: the default device, or every device of the mesh (replicated: each computes
        # the same bookkeeping, so the step stays one program with no transfer inside).
        self.state_sharding = None
        if mesh is not None:
            from swajax.models import sharding

            sharding.check_divisible(self.spec, mesh)
            self.state = sharding.shard_state(self.state, mesh)
            self.state_sharding = sharding.replicated(mesh)
        elif not self.abstract:  # parameters live on the device once, not uploaded each step
            self.state = jax.device_put(self.state)
        # What every step passes: the parameters as one flat tuple (see `Forward`).
        self.params = tuple(jax.tree.leaves(self.state))
        mode = AttentionMode(implementation, interpret, mesh, platform.target(), deterministic)
        self.forward = forward_of(self.graphdef, mode, jax.tree.structure(self.state))

    @property
    def decoder(self) -> Decoder:
        return nnx.merge(self.graphdef, self.state)

    @property
    def memory_window(self) -> int:
        """The window its pools must keep (0: no sliding layer)."""
        return self.spec.hybrid.sliding_window or 0

    def draft_state(self, sizes, rows: int):
        """Its device state as a speculative draft: its KV pools at the target's slots."""
        del rows  # a draft model reads nothing per request beyond its KV
        return self.init_pools(sizes)

    def init_pools(self, sizes):
        heads = None
        if self.mesh is not None:
            from swajax.models.sharding import pool_sharding

            heads = pool_sharding(self.mesh, self.spec)
        make = lambda: pool_lib.init_pools(self.spec.hybrid, sizes, self.dtype, sharding=heads)  # noqa: E731
        if not self.abstract:
            return make()
        # A model of shapes only has pools of shapes only (a chip's worth of KV is never made),
        # placed where they would be (eval_shape keeps no sharding of a call inside).
        return pool_lib.placed(jax.eval_shape(make), heads)

    @property
    def fused_forward(self) -> Forward:
        """The forward the runner traces into its own step program (one dispatch per step)."""
        return self.forward
