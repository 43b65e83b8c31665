"""A roofline model of one engine step's time on a named accelerator (host code, no JAX).

    time = max(bytes read / HBM bandwidth, FLOPs / peak bf16 FLOP/s) + fixed overhead

Bytes: the weights a step touches (dense weights always; each MoE layer's experts in the
proportion the step's tokens are expected to touch, 1 - (1 - k/E)^T) plus the KV every
request's attention reads: full layers its whole context, local layers at most W + 1 keys
before each of its new tokens (a chunked layer at most its chunk), over the layers that own
KV; DeepSeek-V4's compressed layers add their entries (HCA: every one; CSA: the indexer's key
of every one, and the `index_topk` entries it keeps). FLOPs: 2 x active parameters per new
token, plus attention's 4 x heads x head_dim per (query, key) pair. The model is for comparing
configurations of the same model side by side (hybrid vs one pool, ratio against ratio), not
for predicting absolute latency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from swajax.config import HybridConfig, LayerKind
from swajax.sizing import compressed_dtype_bytes, layer_bytes

GB, TB = 1e9, 1e12


@dataclasses.dataclass(frozen=True)
class Accelerator:
    name: str
    hbm_bytes_per_s: float
    bf16_flops: float  # dense peak
    memory_bytes: float
    overhead_s: float = 200e-6  # launch and host cost per step (one exchange per step)
    # Host -> device copies (a host tier's loads): what a PCIe Gen5 x16 link (GPUs) or a TPU
    # host's Gen4 link sustains in practice, not the nominal peak. An assumption, stated.
    host_bytes_per_s: float = 50 * GB


# Published per-chip figures (dense bf16, no sparsity).
ACCELERATORS = {
    "h100": Accelerator("H100 SXM", 3.35 * TB, 989 * TB, 80 * GB),
    "h200": Accelerator("H200", 4.8 * TB, 989 * TB, 141 * GB),
    "b200": Accelerator("B200", 8.0 * TB, 2250 * TB, 180 * GB),
    "tpu-v5e": Accelerator("TPU v5e", 819 * GB, 197 * TB, 16 * GB, host_bytes_per_s=25 * GB),
    "tpu-v6e": Accelerator("TPU v6e", 1640 * GB, 918 * TB, 32 * GB, host_bytes_per_s=25 * GB),
}


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What a step costs besides attention: the parameters (all, and those one token runs)
    and the bytes the device holds for them, routed experts apart. The command line fills it
    from the model's own abstract parameters (`swajax.models.footprint`), never a table."""

    total_params: float
    active_params: float
    weight_bytes: float
    experts: int = 0  # routed experts per MoE layer (0: dense)
    top_k: int = 0
    routed_bytes: float | None = None  # the routed experts' bytes (None: in proportion)

    @property
    def expert_bytes(self) -> float:
        """Bytes of all routed experts (given, or from total = dense + X and active = dense +
        X k / E, the bytes in proportion to the parameters)."""
        if not self.experts:
            return 0.0
        if self.routed_bytes is not None:
            return self.routed_bytes
        experts_params = (self.total_params - self.active_params) / (1 - self.top_k / self.experts)
        return self.weight_bytes * experts_params / self.total_params

    def weights_read(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` new tokens reads (experts as expected touched)."""
        if not self.experts:
            return self.weight_bytes
        touched = 1 - (1 - self.top_k / self.experts) ** max(tokens, 1)
        return self.weight_bytes - self.expert_bytes * (1 - touched)


@dataclasses.dataclass(frozen=True)
class Span:
    """One request's part of a step: KV before it and after it."""

    prefix_len: int
    seq_len: int


@dataclasses.dataclass(frozen=True)
class StepTimeModel:
    cfg: HybridConfig
    cost: ModelCost
    accelerator: Accelerator
    devices: int = 1  # the model instance spans this many chips (bandwidth and FLOPs add up)
    kv_dtype: str = "bf16"

    def __post_init__(self):
        f, s = layer_bytes(self.cfg, self.kv_dtype)
        object.__setattr__(self, "_layer_bytes", (f, s))
        object.__setattr__(self, "_groups", self._layer_groups(f, s))

    def _layer_groups(self, f_bytes: float, s_bytes: float) -> tuple:
        """Layers that cost the same, counted: (kind, window, FLOPs per (query, key) pair, KV
        bytes per key read (0 for a layer that reads its source layer's KV), compressed entries
        (`_compressed`), count). A model
        has a handful of these however deep it is, so a step costs a few array operations
        over its requests, not a Python loop over requests x layers."""
        groups: dict[tuple, int] = {}
        for layer in self.cfg.layers:
            shape = self.cfg.swa_attention if layer.kind.is_local else self.cfg.full_attention
            per_pair = 2 * shape.num_heads * (shape.head_dim + shape.v_head_dim)
            per_key = (
                0.0
                if layer.kv_source is not None
                else (s_bytes if layer.kind.is_local else f_bytes)
            )
            key = (layer.kind, layer.window, per_pair, per_key, self._compressed(layer, shape))
            groups[key] = groups.get(key, 0) + 1
        return tuple((*key, count) for key, count in groups.items())

    def _compressed(self, layer, shape) -> tuple[int, int, float, float]:
        """(rate, top-k, bytes of an attended entry, bytes of an indexer key) of a compressed
        layer; (0, 0, 0, 0) for any other."""
        if not layer.compress_rate:
            return (0, 0, 0.0, 0.0)
        b = compressed_dtype_bytes(self.kv_dtype)
        index = layer.compress_dims - shape.head_dim if layer.compress_topk else 0
        return (layer.compress_rate, layer.compress_topk, shape.head_dim * b, index * b)

    @staticmethod
    def _entries(compressed, per_pair, first, last, seq, new) -> tuple[np.ndarray, np.ndarray]:
        """(bytes read, FLOPs) per request of a compressed layer's entries: each query attends
        the entries of the windows ended by then (CSA: at most top-k of them, after scoring
        every indexer key); a step reads the union."""
        rate, topk, entry, index = compressed
        seen_first, seen_last, ended = (first + 1) // rate, (last + 1) // rate, seq // rate
        if topk:
            attended = new * (np.minimum(seen_first, topk) + np.minimum(seen_last, topk)) / 2
            return ended * index + np.minimum(ended, new * topk) * entry, per_pair * attended
        return ended * entry, per_pair * new * (seen_first + seen_last) / 2

    @staticmethod
    def _visible(kind: LayerKind, window: int, q: np.ndarray) -> np.ndarray:
        """Keys the query at position q reads in one layer."""
        if kind is LayerKind.FULL:
            return q + 1
        if kind is LayerKind.CHUNKED:
            return q % window + 1
        return np.minimum(q, window) + 1

    def _attention(self, prefix: np.ndarray, seq: np.ndarray) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) of a step's requests (their KV before and after
        it), summed over layers. Pairs are counted at the first and last new token and
        interpolated (exact for full layers, and for local layers once the window is full)."""
        new = seq - prefix
        first, last = prefix, seq - 1
        kv, flops = 0.0, 0.0
        for kind, window, per_pair, per_key, compressed, count in self._groups:
            seen = self._visible(kind, window, first)
            pairs = new * (seen + self._visible(kind, window, last)) / 2
            flops += count * per_pair * float(pairs.sum())
            if compressed[0]:
                read, work = self._entries(compressed, per_pair, first, last, seq, new)
                kv, flops = kv + count * float(read.sum()), flops + count * float(work.sum())
            if not per_key:
                continue  # reads the KV its source layer already brought in
            if kind is LayerKind.FULL:
                keys = seq
            else:  # a window slides over the new tokens: the keys of the union
                keys = np.minimum(seq, seen + new - 1)
            kv += count * per_key * float(keys.sum())
        return kv, flops

    def step_seconds(self, spans: Iterable[Span]) -> float:
        spans = list(spans)
        if not spans:
            return 0.0
        prefix = np.fromiter((s.prefix_len for s in spans), np.int64, len(spans))
        seq = np.fromiter((s.seq_len for s in spans), np.int64, len(spans))
        tokens = int((seq - prefix).sum())
        kv, attn = self._attention(prefix, seq)
        read = self.cost.weights_read(tokens) + kv
        flops = 2 * self.cost.active_params * tokens + attn
        acc, n = self.accelerator, self.devices
        return max(read / (acc.hbm_bytes_per_s * n), flops / (acc.bf16_flops * n)) + acc.overhead_s

    def load_seconds(self, full_tokens: int, swa_tokens: int) -> float:
        """Copying a host tier's pages back before a step (on its critical path; saves run
        beside the compute and are not counted): every full layer's KV of `full_tokens`
        tokens and every SWA layer's of `swa_tokens`, over the host link of each chip."""
        if not (full_tokens or swa_tokens):
            return 0.0
        f, s = self._layer_bytes
        full_layers = sum(1 for x in self.cfg.layers if not x.kind.is_local and x.kv_source is None)
        swa_layers = sum(1 for x in self.cfg.layers if x.kind.is_local and x.kv_source is None)
        moved = full_tokens * f * full_layers + swa_tokens * s * swa_layers
        return moved / (self.accelerator.host_bytes_per_s * self.devices)

    def devices_needed(self, kv_budget_bytes: float, usable: float = 0.9) -> int:
        """Chips for the weights plus the KV budget at `usable` of each chip's memory."""
        need = self.cost.weight_bytes + kv_budget_bytes
        return max(1, -int(-need // (self.accelerator.memory_bytes * usable)))
