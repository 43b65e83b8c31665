"""The checkpoint's own draft: multi-token-prediction (MTP, "nextn") layers as speculative drafts.

MiMo-V2-Flash, Step 3.x and DeepSeek-V4 publish MTP layers beside the decoder
(`num_nextn_predict_layers`). One MTP layer at position i reads the embedding of token i + 1 and
the target's hidden state at position i (the final norm's output; DeepSeek-V4: its last layer's
hyper-connection streams), norms each, joins them and projects back to the hidden width, runs one
decoder layer of the family at position i, applies its own final norm (DeepSeek-V4: its own
hyper-connection head first) and the target's head: logits for token i + 2. The draft here is
the first MTP layer, reused for every draft step of a round, as SGLang and vLLM run these
checkpoints; the layers after it are read by neither and skipped.

The layer is a full or sliding layer with its own window, so its KV lives in the pool of its
kind, at the target's slots: its entry for (hidden_i, token_i+1) at the slot of position i,
written once both are known (`extend`: the positions a step's forward completes, each paired
with the next token; `propose` and `settle`: a speculative round). The target's hidden state at
the last position a request completed waits in a per-row buffer (`MtpState`) for the token that
follows it. The buffer records the slot it belongs to: a row reused by another request, or a
request resumed from the prefix cache, finds a slot that is not its own and skips that one
entry (the tree holds KV, not hidden states), as SGLang does after a prefix hit. A stale or
skipped entry can only lower acceptance: the target verifies every token.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from swajax.attention.metadata import MetadataShape, metadata_core
from swajax.config import ConfigError, text_config
from swajax.config.hf_fields import positive_int
from swajax.errors import InputError
from swajax.memory import pool as pool_lib
from swajax.memory.req_to_token import last_loc
from swajax.models.checkpoint import Checkpoint
from swajax.models.decoder import DecoderLayer, traced
from swajax.models.deepseek_v4 import PrefixedLoader, V4MtpLayer
from swajax.models.family_specs import FAMILIES, model_spec
from swajax.models.layers import Linear, norm_of
from swajax.models.loading import ORBAX_DIR, checkpoint_files, checkpoint_quantization, read_config
from swajax.models.spec import ModelSpec
from swajax.models.weights import WeightLoader

MTP = "mtp"  # the draft_model name (vLLM's speculative method) that asks for these layers
SLIDING, FULL = "sliding_attention", "full_attention"
# Per family: where the first MTP layer's tensors are (`{n}`: the decoder's layer count).
PREFIXES = {"mimo": "model.mtp.layers.0", "step3": "model.layers.{n}", "deepseek_v4": "mtp.0"}
# `MtpLayer`'s families: the name of its final norm, and the block's norms named otherwise.
NAMES = {
    "mimo": ("final_layernorm", {"post_attention_layernorm": "pre_mlp_layernorm"}),
    "step3": ("shared_head.norm", {}),
}
# The MTP layer's MLP where the config does not list it: DeepSeek-V4's is top-k routed (its
# layer number is past the hash-routed ones).
DEFAULT_MLP = {"deepseek_v4": "moe"}
# Per-layer lists of a Step 3.x config, which hub configs pad with the MTP layers' entries.
PER_LAYER = ("swiglu_limits", "swiglu_limits_shared", "rope_theta", "partial_rotary_factors")


def mtp_layer_count(cfg) -> int:
    """The MTP layers a config declares (`num_nextn_predict_layers`; 0 if none)."""
    value = text_config(cfg)[1].get("num_nextn_predict_layers") or 0
    return value if isinstance(value, int) and value > 0 else 0


def mtp_config(cfg) -> dict:
    """The first MTP layer as a one-layer config of the target's family (its attention kind and
    window, its MLP), so `model_spec` builds its shapes as it builds any decoder's."""
    model_type, text = text_config(cfg)
    family = FAMILIES.get(model_type)
    if family not in PREFIXES:
        raise InputError(
            f"MTP drafts are built for {sorted(k for k, v in FAMILIES.items() if v in PREFIXES)}; "
            f"model_type {model_type!r} has none here"
        )
    m = mtp_layer_count(cfg)
    if not m:
        raise InputError("the config declares no MTP layers (num_nextn_predict_layers is 0)")
    n = positive_int(text, "num_hidden_layers")
    kind = _first_mtp(text, "layer_types", "mtp_layer_types", n, m) or SLIDING
    mlp = _first_mtp(text, "mlp_layer_types", "mtp_mlp_layer_types", n, m)
    mlp = mlp or DEFAULT_MLP.get(family, "dense")
    kinds = (SLIDING,) if family == "deepseek_v4" else (SLIDING, FULL)
    # DeepSeek-V4's hub form: `compress_ratios` with the MTP layer's entry (0: window only).
    ratio = _first_mtp(text, "compress_ratios", "", n, m) or 0
    if kind not in kinds or ratio:
        got = f"compress ratio {ratio}" if ratio else repr(kind)
        raise ConfigError(f"the MTP layer's type must be one of {list(kinds)}, got {got}")
    drop = ("moe_layers_enum", "attention_other_setting", "compress_ratios", "num_hash_layers")
    out = {k: v for k, v in text.items() if k not in drop}
    out.update(num_hidden_layers=1, num_nextn_predict_layers=0, layer_types=[kind])
    out.update(mlp_layer_types=[mlp], hybrid_layer_pattern=[int(kind == SLIDING)])
    for field in PER_LAYER:
        value = text.get(field)
        if isinstance(value, list):
            out[field] = value[n : n + 1] if len(value) == n + m else [None]
            if field in ("rope_theta", "partial_rotary_factors") and len(value) != n + m:
                del out[field]  # the per-kind rope_parameters say it
    # Step 3.x: the MTP layer's own head counts (transformers' `mtp_per_layer_config`), else
    # the config's base ones, whatever its sliding layers use.
    per_layer = (text.get("mtp_per_layer_config") or {}).get("0")
    out["per_layer_config"] = {"0": per_layer} if per_layer else {}
    if "num_sliding_attention_heads" in out:
        heads = (per_layer or {}).get("num_attention_heads", text.get("num_attention_heads"))
        out["num_sliding_attention_heads"] = heads
    return out


def _first_mtp(text, field: str, mtp_field: str, n: int, m: int):
    """The first MTP layer's entry: `mtp_field`, or `field` padded with the MTP layers."""
    own = text.get(mtp_field)
    if isinstance(own, list) and own:
        return own[0]
    value = text.get(field)
    if isinstance(value, list) and len(value) == n + m:
        return value[n]
    return None


class MtpLayer(nnx.Module):
    """One MTP layer: enorm(embedding) | hnorm(hidden) -> eh_proj -> a decoder layer -> its final
    norm (the head is the target's). DeepSeek-V4's is its own (`deepseek_v4.V4MtpLayer`)."""

    def __init__(self, spec: ModelSpec):
        self.spec, h = spec, spec.hidden
        self.enorm, self.hnorm = norm_of(spec, h), norm_of(spec, h)
        self.eh_proj = Linear(2 * h, h, dtype=spec.dtype, quant=spec.weights)
        self.block = DecoderLayer(spec, 0)
        self.final_norm = norm_of(spec, h)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """A row of what it reads of the target and hands the next draft step."""
        return (self.spec.hidden,)

    def load(self, w, prefix: str) -> None:
        final, renames = NAMES[self.spec.family]
        for name in ("enorm", "hnorm"):
            getattr(self, name).load(w, f"{prefix}.{name}.weight")
        self.eh_proj.load(w, f"{prefix}.eh_proj")
        self.final_norm.load(w, f"{prefix}.{final}.weight")
        swaps = {f"{prefix}.{a}.": f"{prefix}.{b}." for a, b in renames.items()}

        def renamed(name: str) -> str:
            for old, new in swaps.items():
                if name.startswith(old):
                    return new + name[len(old) :]
            return name

        self.block.load(PrefixedLoader(w, renamed), prefix)

    def __call__(self, embedded, hidden, tokens, positions, pools, meta, mode):
        """(final-normed output [T, H], pools) of rows joining `embedded` and `hidden`."""
        del tokens  # read by DeepSeek-V4's layer (its MoE may route by token)
        x = jnp.concatenate([self.enorm(embedded), self.hnorm(hidden.astype(embedded.dtype))], -1)
        x, pools = self.block(self.eh_proj(x), positions, pools, meta, mode)
        return self.final_norm(x), pools

    def normed(self, x):
        """What the target's head reads of the output (already normed)."""
        return x


def mtp_layer(spec: ModelSpec) -> MtpLayer | V4MtpLayer:
    """The family's MTP layer module."""
    return V4MtpLayer(spec) if spec.family == "deepseek_v4" else MtpLayer(spec)


def is_mtp_layer(module) -> bool:
    return isinstance(module, (MtpLayer, V4MtpLayer))


def mtp_prefix(cfg, spec: ModelSpec) -> str:
    """Where the first MTP layer's tensors are in a checkpoint of config `cfg`."""
    n = positive_int(text_config(cfg)[1], "num_hidden_layers")
    return PREFIXES[spec.family].format(n=n)


def ignored(prefix: str) -> tuple[str, ...]:
    """What an MTP load leaves unread: the decoder, the other MTP layers, and the copies of
    the shared embedding and head some checkpoints keep beside the layer."""
    p = re.escape(prefix)
    return (rf"^(?!{p}\.)", rf"^{p}\.(shared_head\.head|embed_tokens)\.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MtpState:
    """The draft's device state: its KV pools (at the target's slots) and, per request row, the
    target's hidden state at the last position the row completed and that position's slot."""

    pools: pool_lib.KVPools
    hidden: jax.Array  # [max_running, *feature_shape]
    slot: jax.Array  # i32[max_running]: -1: none (`last_loc`'s answer for no position, which
    # `extend` never compares: it asks only where a position precedes the step)


def init_state(pools, rows: int, feature_shape: tuple[int, ...], dtype) -> MtpState:
    hidden = jnp.zeros((rows, *feature_shape), dtype)
    return MtpState(pools, hidden, jnp.full(rows, -1, jnp.int32))


def _rows(mask, x):
    """A per-row mask shaped to broadcast over rows of `x`."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _shifted(shape: MetadataShape) -> MetadataShape:
    """A batch's metadata shape one position earlier: one more SWA page may start its window."""
    return dataclasses.replace(shape, swa_pages=shape.swa_pages + 1)


class MtpForward:
    """The draft's traced half (static and interned, like `decoder.Forward`): its layer rebuilt
    from its flat parameters, the target's embedding and head from the target's."""

    __slots__ = ("graphdef", "mode", "treedef", "target")
    needs_hidden = True

    def __init__(self, graphdef, mode, treedef, target):
        self.graphdef, self.mode, self.treedef, self.target = graphdef, mode, treedef, target

    def _run(self, params, t_params, pools, tokens, hidden, meta):
        layer = nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, params))
        target = self.target._model(t_params)
        with traced(self.mode):
            x, pools = layer(
                target.embedded(tokens), hidden, tokens, meta.positions, pools, meta, self.mode
            )
            return target.unembed(layer.normed(x)), x, pools

    def logits(self, params, t_params, pools, tokens, hidden, meta):
        """(logits [T, V], output [T, *feature_shape], pools) of rows at `meta`'s positions."""
        return self._run(params, t_params, pools, tokens, hidden, meta)

    def extend(
        self, params, t_params, state: MtpState, tokens, hidden, meta, r2t, alloc, rows, shape
    ):
        """The entries a step's forward completes (`shape`: its metadata's). For each request's
        positions [s, e): the pairs (hidden_i, token_i+1) at positions [s - 1, e - 1), s - 1
        only where the row's buffer holds that slot's hidden state; then the buffer takes
        hidden_(e-1)."""
        s, e = meta.prefix_lens, meta.seq_lens
        real = e > s
        valid = real & (s >= 1) & (state.slot[rows] == last_loc(r2t, rows, s))
        start = jnp.where(real, s - valid.astype(jnp.int32), 0)
        m = metadata_core(r2t, alloc, rows, start, jnp.where(real, e - 1, 0), _shifted(shape))
        r, i, cu, last = m.token_req, m.positions, meta.cu_q_lens, tokens.shape[0] - 1
        toks = tokens[jnp.clip(cu[r] + i + 1 - s[r], 0, last)]
        own = hidden[jnp.clip(cu[r] + i - s[r], 0, last)]
        h = jnp.where(_rows(i < s[r], own), state.hidden[rows[r]], own)
        _, _, pools = self.logits(params, t_params, state.pools, toks, h, m)
        final = hidden[jnp.clip(cu[:-1] + e - 1 - s, 0, last)]
        return _remember(state, pools, rows, real, final, last_loc(r2t, rows, e))

    def propose(
        self,
        params,
        t_params,
        state: MtpState,
        first,
        real,
        prefix,
        r2t,
        alloc,
        rows,
        shapes,
        choose,
        k: int,
    ):
        """A round's k proposals (and each one's distribution) for requests whose pending token
        `first` sits at position `prefix`: the layer at prefix - 1 reads the buffered hidden
        state and `first`, each later step its own output and the proposal before."""
        n_rows = rows.shape[0]
        valid = state.slot[rows] == last_loc(r2t, rows, prefix)
        h = jnp.where(_rows(valid, state.hidden), state.hidden[rows], 0)
        current, pools, proposals, q_probs = first, state.pools, [], []
        for j in range(k):
            pre = (prefix - 1 + j) * real
            m = metadata_core(r2t, alloc, rows, pre, pre + real, _shifted(shapes[j]))
            n = m.num_tokens
            logits, x, pools = self.logits(params, t_params, pools, current[:n], h[:n], m)
            pick, q = choose(j, logits, n)
            current = jnp.zeros(n_rows, jnp.int32).at[:n].set(pick)
            proposals.append(current)
            if q is not None:  # (None: every request is greedy)
                q_probs.append(jnp.zeros((n_rows, q.shape[-1]), q.dtype).at[:n].set(q))
            h = jnp.zeros((n_rows, *x.shape[1:]), x.dtype).at[:n].set(x)
        return proposals, q_probs, dataclasses.replace(state, pools=pools)

    def settle(
        self,
        params,
        t_params,
        state: MtpState,
        hidden,
        proposed,
        accepted,
        real,
        meta,
        r2t,
        alloc,
        rows,
        shape,
    ):
        """After the target verified a round (`hidden`: its rows' hidden states, request r's
        at cu_q_lens[r] + i for position prefix + i): the entries (hidden_p+i, proposal_i+1) at
        positions [p, p + k), of which the first `accepted` are the request's own (the rest
        are rewritten before any query reads them), and the buffer takes hidden_(p+accepted)."""
        p, k, cu = meta.prefix_lens, proposed.shape[1], meta.cu_q_lens
        n_rows = rows.shape[0]
        m = metadata_core(r2t, alloc, rows, p * real, (p + k) * real, shape)
        r, j, last = m.token_req, m.positions - p[m.token_req], hidden.shape[0] - 1
        toks = proposed[r, jnp.clip(j, 0, k - 1)]
        h = hidden[jnp.clip(cu[r] + j, 0, last)]
        _, _, pools = self.logits(params, t_params, state.pools, toks, h, m)
        final = hidden[jnp.clip(cu[:n_rows] + accepted, 0, last)]
        return _remember(state, pools, rows, real > 0, final, last_loc(r2t, rows, p + accepted + 1))


def _remember(state: MtpState, pools, rows, real, hidden, slots) -> MtpState:
    """The buffer with each real request's row set to (hidden, slot)."""
    where = jnp.where(real, rows, state.slot.shape[0])  # padding requests write nothing
    return MtpState(
        pools,
        state.hidden.at[where].set(hidden.astype(state.hidden.dtype), mode="drop"),
        state.slot.at[where].set(slots, mode="drop"),
    )


_FORWARDS: dict = {}


def load_mtp(path, target: ModelSpec, *, mesh=None) -> MtpLayer | V4MtpLayer:
    """The first MTP layer of checkpoint `path` (whose decoder has spec `target`), in the
    target's dtype and quantization; every tensor of the layer read and checked."""
    cfg = read_config(path)
    try:
        spec = mtp_spec(cfg, target)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    files = checkpoint_files(path)
    if not files and (Path(path) / ORBAX_DIR).exists():
        raise InputError(f"{path} is a converted folder: it keeps no MTP layers")
    prefix = mtp_prefix(cfg, spec)
    checkpoint = Checkpoint(files, ignored(prefix))
    if not any(name.startswith(prefix + ".") for name in checkpoint.names()):
        raise InputError(f"{path} declares MTP layers but holds no tensor under {prefix}.")
    layer = nnx.eval_shape(lambda: mtp_layer(spec))
    loader = WeightLoader(checkpoint, layer, checkpoint_quantization(cfg), mesh)
    layer.load(loader, prefix)
    loader.check_complete(layer)
    return layer


def mtp_spec(cfg, target: ModelSpec) -> ModelSpec:
    """The first MTP layer's spec: its own shapes, the target's dtype, MoE mode and weights."""
    spec = model_spec(mtp_config(cfg))
    return dataclasses.replace(spec, dtype=target.dtype, moe=target.moe, weights=target.weights)


class MtpLM:
    """The engine's MTP draft (what `DeviceRunner` and `Engine` read of a draft): the layer's
    parameters placed like the target's, its KV pools and buffer, its traced half."""

    needs_kv = True

    def __init__(self, layer, target):
        """`target`: the `HybridLM` whose embedding, head and hidden states the layer reads."""
        self.spec, self.target, self.feature_shape = layer.spec, target, layer.feature_shape
        self.vocab_size, self.mesh = target.vocab_size, target.mesh
        self.state_sharding, self.dtype = target.state_sharding, target.dtype
        graphdef, state = nnx.split(layer)
        if target.mesh is not None:
            from swajax.models import sharding

            state = sharding.shard_state(state, target.mesh)
        else:
            state = jax.device_put(state)
        self.params = tuple(jax.tree.leaves(state))
        key = (graphdef, target.forward.mode, jax.tree.structure(state), target.forward)
        if key not in _FORWARDS:
            _FORWARDS[key] = MtpForward(*key)
        self.fused_forward = _FORWARDS[key]

    @property
    def memory_window(self) -> int:
        """The window the pools must keep for it: its own, and one position more (its queries
        sit one position behind the target's)."""
        w = self.spec.hybrid.sliding_window or 0
        return w + 1 if w else 0

    def draft_state(self, sizes, rows: int) -> MtpState:
        heads = None
        if self.mesh is not None:
            from swajax.models.sharding import pool_sharding

            heads = pool_sharding(self.mesh, self.spec)
        pools = pool_lib.init_pools(self.spec.hybrid, sizes, self.dtype, sharding=heads)
        state = init_state(pools, rows, self.feature_shape, jnp.dtype(self.spec.dtype))
        if self.state_sharding is not None:
            hidden, slot = jax.device_put((state.hidden, state.slot), self.state_sharding)
            state = MtpState(state.pools, hidden, slot)
        return state
