"""DeepSeek-V4's attention schedule from a Hugging Face config: every layer attends a sliding
window; compressed layers add a cache with one entry per `compress_rate` tokens.

Layer types: `sliding_attention` (window only), `compressed_sparse_attention` (CSA: entries every
`compress_rates[csa]` tokens, default 4, each a KV vector of `head_dim` plus a Lightning-Indexer
key of `index_head_dim`), `heavily_compressed_attention` (HCA: every `compress_rates[hca]`
tokens, default 128, KV only). The hub's older form gives `compress_ratios` per layer (0 / 4 /
128, sometimes with a trailing entry for the multi-token-prediction layer) and
`compress_rate_csa` / `compress_rate_hca`. Returned as plain fields for `swajax.config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swajax.config.hf_fields import ConfigError, positive_int

CSA, HCA, SLIDING = (
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "sliding_attention",
)
DEFAULT_RATES = {CSA: 4, HCA: 128}
MODEL_TYPES = ("deepseek_v4",)


def compress_rates(cfg: Mapping[str, Any]) -> dict[str, int]:
    rates = dict(DEFAULT_RATES)
    given = cfg.get("compress_rates")
    if given is not None:
        if not isinstance(given, Mapping) or set(given) - {CSA, HCA}:
            raise ConfigError(
                f"config field 'compress_rates' must map {CSA!r} / {HCA!r} to rates, got {given!r}"
            )
        rates.update(given)
    for kind, legacy in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if cfg.get(legacy) is not None:
            rates[kind] = cfg[legacy]
    for kind, rate in rates.items():
        positive_int({kind: rate}, kind)
    return rates


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    rates = compress_rates(cfg)
    types = cfg.get("layer_types")
    if types is None and cfg.get("compress_ratios") is not None:
        by_rate = {0: SLIDING, rates[CSA]: CSA, rates[HCA]: HCA}
        ratios = cfg["compress_ratios"]
        if (
            not isinstance(ratios, list)
            or len(ratios) < n
            or any(r not in by_rate for r in ratios[:n])
        ):
            raise ConfigError(
                f"config field 'compress_ratios' must list {n} entries from {sorted(by_rate)}, "
                f"got {ratios!r}"
            )
        types = [by_rate[r] for r in ratios[:n]]
    if types is None:  # transformers' default: two HCA layers, then CSA / HCA alternating
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    if not isinstance(types, list) or len(types) < n or set(types[:n]) - {SLIDING, CSA, HCA}:
        raise ConfigError(
            f"config field 'layer_types' must list {n} entries from {[SLIDING, CSA, HCA]}, "
            f"got {types!r}"
        )
    return list(types[:n])


def compressed_layers(cfg: Mapping[str, Any], n: int) -> list[tuple[int, int, int, int] | None]:
    """Per layer: (compress_rate, elements per compressed entry, elements per pending token,
    entries a query attends: CSA's `index_topk`, 0 for all), or None (window only).

    A pending token is what the compressor keeps of a token until its entry is made: its KV
    and gate projections. CSA projects two series (`2 * head_dim` each, and the indexer's
    `2 * index_head_dim`), because its entry w mixes window w with window w - 1; HCA one."""
    rates = compress_rates(cfg)
    head_dim = positive_int(cfg, "head_dim", 512)
    index_dim = positive_int(cfg, "index_head_dim", 128)
    entry = {CSA: head_dim + index_dim, HCA: head_dim}
    pending = {CSA: 4 * (head_dim + index_dim), HCA: 2 * head_dim}
    topk = {CSA: positive_int(cfg, "index_topk", 512), HCA: 0}
    return [
        None if t == SLIDING else (rates[t], entry[t], pending[t], topk[t])
        for t in layer_types(cfg, n)
    ]


def compressor_span(rate: int, overlapping: bool) -> int:
    """Tokens before a window's last token whose projections make its entry: the window, and
    for CSA (overlapping windows) the window before it too."""
    return (2 if overlapping else 1) * rate - 1


def entries_per_token(rate: int, page_size: int | None) -> float:
    """Compressed entries per token of capacity: 1 / rate, or with pages, the entry slots a
    page has (one per rate tokens, rounded up) over its tokens."""
    if page_size is None:
        return 1 / rate
    return -(-page_size // rate) / page_size


def check_window(layers) -> None:
    """A compressor reads its pending projections from the SWA slots, which hold W tokens
    before the newest: the window must cover the span an entry is made from."""
    for i, la in enumerate(layers):
        span = compressor_span(la.compress_rate or 0, la.overlapping)
        if la.compress_rate and span > la.window:
            raise ConfigError(
                f"layer {i}: a compress rate of {la.compress_rate} reads {span} "
                f"tokens back, more than the sliding window keeps (W = {la.window}); swajax "
                "keeps pending compressor state in the window's slots"
            )
