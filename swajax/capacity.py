"""What a KV budget buys: hybrid pools against one pool of the same budget (`swajax plan`)."""

from __future__ import annotations

import dataclasses

from swajax import sizing
from swajax.config import HybridConfig
from swajax.sizing import PoolMode


@dataclasses.dataclass(frozen=True)
class CapacityReport:
    model_type: str
    kinds: str  # one letter per layer
    mode: str  # pool mode used: hybrid | all_swa | single
    sliding_window: int | None
    page_size: int
    dtype: str
    ratio: float | None
    budget_bytes: int
    full_tokens: int
    swa_tokens: int
    full_bytes_per_token: float  # one token in the full pool (a draft's KV included)
    swa_bytes_per_token: float  # one token in the SWA pool (a draft's KV included)
    bytes_used: int
    single_pool_tokens: int  # tokens the same budget holds with one pool for every layer
    capacity_ratio: float  # full_tokens / single_pool_tokens
    min_ratio_estimate: float | None  # (W + I + P) / T, when an average length T is given
    # DeepSeek-V4's third lifetime: bytes of compressed entries per token of the full pool
    # (at this page size), and of pending compressor projections per SWA slot (0 otherwise)
    compressed_bytes_per_token: float = 0.0
    pending_bytes_per_token: float = 0.0
    # With a named device: the budget is what its memory leaves after these weight bytes.
    device: str | None = None
    weight_bytes: int | None = None
    # A host tier for the prefix cache (`--host-cache-gib`): its full and SWA stores' tokens.
    host_full_tokens: int = 0
    host_swa_tokens: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def capacity_report(
    cfg: HybridConfig,
    budget_bytes: int,
    *,
    ratio: float = 0.8,
    page_size: int = 1,
    dtype: str = "bf16",
    avg_seq_len: int | None = None,
    eviction_interval: int = sizing.DEFAULT_EVICTION_INTERVAL,
    hybrid_memory: bool = True,
    draft: HybridConfig | None = None,
    host_cache_gib: float = 0.0,
) -> CapacityReport:
    """Size the pools for `budget_bytes` and compare with a single pool of the same budget;
    a speculative `draft` model's KV shares both (its layers join the cell)."""
    kw = dict(page_size=page_size, dtype=dtype, draft=draft)
    single = sizing.size_single_pool(cfg, budget_bytes, **kw)
    if hybrid_memory and cfg.layer_mix != "full_only":
        sizes = sizing.size_hybrid(cfg, budget_bytes, ratio=ratio, **kw)
    else:
        sizes = single
    sizes = sizing.with_host_tier(sizes, cfg, host_cache_gib, dtype, draft)
    full_b, swa_b = sizing.token_bytes(cfg, dtype, draft, page_size)
    part = sizing.compressed_dtype_bytes(dtype)
    estimate = None
    if avg_seq_len is not None:
        estimate = sizing.min_ratio_estimate(
            cfg, avg_seq_len, page_size=page_size, eviction_interval=eviction_interval
        )
    return CapacityReport(
        model_type=cfg.model_type,
        kinds=cfg.kinds,
        mode=sizes.mode,
        sliding_window=cfg.sliding_window,
        page_size=page_size,
        dtype=dtype,
        ratio=ratio if sizes.mode is PoolMode.HYBRID else None,
        budget_bytes=budget_bytes,
        full_tokens=sizes.full_tokens,
        swa_tokens=sizes.swa_tokens,
        full_bytes_per_token=full_b,
        swa_bytes_per_token=swa_b,
        bytes_used=sizing.bytes_used(cfg, sizes, dtype, draft),
        single_pool_tokens=single.full_tokens,
        capacity_ratio=sizes.max_total_tokens / single.full_tokens,
        min_ratio_estimate=estimate,
        compressed_bytes_per_token=cfg.compressed_bytes_per_token(part, page_size),
        pending_bytes_per_token=cfg.pending_bytes_per_token(part),
        host_full_tokens=sizes.host_full_tokens,
        host_swa_tokens=sizes.host_swa_tokens,
    )
