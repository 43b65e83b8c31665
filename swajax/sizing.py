"""Pool sizing: the full and SWA token slots a KV budget buys (SGLang's configurators, spec §6).

Let F and S be the KV bytes of one token in one full / one SWA layer, L_full and L_swa the layer
counts and r = swa_full_tokens_ratio (SWA slots per full slot, whatever the layer counts). Then

    cell   = F * L_full + r * S * L_swa        bytes per unit of full-pool capacity
    N_full = page_align(budget // cell)
    N_swa  = page_align(int(N_full * r))

and an SWA pool that cannot hold one request's admission floor (N_swa <= W + page_size) is an error.
A model without full layers puts everything in the SWA pool (the ratio does not apply); a single
pool (hybrid memory disabled) gives every layer a slot for every token.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from swajax.arith import round_up
from swajax.config import HybridConfig
from swajax.errors import InputError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
DEFAULT_EVICTION_INTERVAL = 128


class SizingError(InputError):
    """A budget, ratio or page size that gives no usable pools; the message names the values."""


class PoolMode(enum.StrEnum):
    """How the KV pools are laid out; the one vocabulary every layer uses.

    HYBRID: a full pool and an SWA pool joined by `full_to_swa`. SINGLE: hybrid memory disabled,
    one pool for every layer (SWA layers still attend only their window). ALL_SWA: no full
    layers; the one pool is the SWA pool.
    """

    HYBRID = "hybrid"
    SINGLE = "single"
    ALL_SWA = "all_swa"

    @classmethod
    def _missing_(cls, value):
        names = ", ".join(m.value for m in cls)
        raise ValueError(f"pool mode must be one of {names}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PoolSizes:
    """Token capacities of the two pools. In single-pool mode both equal the one pool's size."""

    mode: PoolMode
    full_tokens: int
    swa_tokens: int
    page_size: int
    chunk_capped: bool = False  # hybrid, SWA pool sized to the running requests' worst case
    # A host tier for the prefix cache (`with_host_tier`): token capacities of its full and
    # SWA stores; 0: none.
    host_full_tokens: int = 0
    host_swa_tokens: int = 0

    def __post_init__(self):
        object.__setattr__(self, "mode", PoolMode(self.mode))

    @property
    def max_total_tokens(self) -> int:
        """How many tokens of context the pools hold (the full pool, or the SWA pool if all-SWA)."""
        return self.swa_tokens if self.mode is PoolMode.ALL_SWA else self.full_tokens


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise SizingError(f"unknown KV dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def layer_bytes(cfg: HybridConfig, dtype: str) -> tuple[int, int]:
    """(F, S): KV bytes of one token in one full layer and in one SWA layer."""
    b = dtype_bytes(dtype)
    return (
        int(cfg.full_attention.kv_bytes_per_token(b)),
        int(cfg.swa_attention.kv_bytes_per_token(b)),
    )


def token_bytes(
    cfg: HybridConfig, dtype: str, draft: HybridConfig | None = None, page_size: int | None = None
) -> tuple[float, float]:
    """Bytes of one token in the full pool and in the SWA pool: KV over all full layers and
    over all SWA layers; with a speculative `draft` model, its layers too (its KV lives in the
    same two pools, token for token: the term the seed's sizing formula omits).

    DeepSeek-V4 adds its third lifetime to the full pool's side (compressed entries ride on
    full pages: C / rate per token per compressed layer, or with `page_size` the entry slots
    a page holds) and the compressors' pending projections to the SWA side."""
    f, s = layer_bytes(cfg, dtype)
    b = compressed_dtype_bytes(dtype)
    full = f * len(cfg.full_layer_ids) + cfg.compressed_bytes_per_token(b, page_size)
    swa = s * len(cfg.swa_layer_ids) + cfg.pending_bytes_per_token(b)
    if draft is not None:
        df, ds = token_bytes(draft, dtype, page_size=page_size)
        full, swa = full + df, swa + ds
    return full, swa


def compressed_dtype_bytes(dtype: str) -> int:
    """Compressed entries and pending projections are kept in the pools' dtype, but bf16 for
    an FP8 pool (gate logits and normed entries have no per-layer scale to divide by)."""
    return max(dtype_bytes(dtype), 2)


# Families whose ratio, when none is given, is SGLang's override for them rather than the
# caller's default: DeepSeek-V4 keeps most of its bytes per token in the window (pending
# compressor state included) and little on the full side.
MODEL_RATIOS = {"deepseek_v4": 0.1}


def resolve_ratio(cfg: HybridConfig, ratio: float | None, default: float) -> float:
    """The ratio given, else the model's own override, else `default`."""
    if ratio is not None:
        return ratio
    return MODEL_RATIOS.get(cfg.model_type, default)


# DeepSeek-V4's compressed entries ride on full pages with ceil(page / rate) slots each
# (`memory/compressed_pool.py`): with 64-token pages CSA's rate 4 wastes none and HCA's 128 one
# slot in two (2.3% more bytes per token than pages of 128, which a prefill chunk of 64, the
# library's default, could not hold).
MODEL_PAGE_SIZES = {"deepseek_v4": 64}


def resolve_page_size(cfg: HybridConfig, page_size: int | None, default: int) -> int:
    """The page size given, else the model's own, else `default`."""
    if page_size is not None:
        return page_size
    return MODEL_PAGE_SIZES.get(cfg.model_type, default)


def check_ratio(ratio: float) -> float:
    if not (isinstance(ratio, int | float) and 0 < ratio <= 1):
        raise SizingError(f"swa_full_tokens_ratio must be in (0, 1], got {ratio!r}")
    return float(ratio)


def _check_page_size(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise SizingError(f"page_size must be a positive integer, got {page_size!r}")
    return page_size


def _align(x: float, page_size: int) -> int:
    return int(x) // page_size * page_size


def _ceil_align(x: int, page_size: int) -> int:
    return round_up(x, page_size)


def cell_bytes(
    cfg: HybridConfig,
    ratio: float,
    dtype: str,
    draft: HybridConfig | None = None,
    page_size: int | None = None,
) -> float:
    """Bytes per unit of max_total_tokens for a hybrid (or all-SWA) model (and its draft)."""
    full, swa = token_bytes(cfg, dtype, draft, page_size)
    if cfg.layer_mix == "all_swa":
        return swa
    return full + check_ratio(ratio) * swa


def solve_pool_sizes(
    cfg: HybridConfig, max_tokens: int, *, ratio: float, page_size: int
) -> PoolSizes:
    """Pool sizes from a token capacity (SGLang's constraint path: it caps the full pool)."""
    ps = _check_page_size(page_size)
    if cfg.layer_mix == "full_only":
        raise SizingError(
            f"model_type {cfg.model_type!r} has no sliding or chunked layers; use a single pool"
        )
    if cfg.layer_mix == "all_swa":
        swa = _align(max_tokens, ps)
        if swa <= 0:
            raise SizingError(f"KV budget holds {max_tokens} tokens, less than page_size={ps}")
        return PoolSizes(PoolMode.ALL_SWA, 0, swa, ps)
    r = check_ratio(ratio)
    full = _align(max_tokens, ps)
    if full <= 0:
        raise SizingError(f"KV budget holds {max_tokens} tokens, less than page_size={ps}")
    swa = _align(int(full * r), ps)
    _check_swa_floor(cfg, swa, ps)
    return PoolSizes(PoolMode.HYBRID, full, swa, ps)


def _check_swa_floor(cfg: HybridConfig, swa_tokens: int, page_size: int) -> None:
    w = cfg.sliding_window
    if w is not None and w + page_size >= swa_tokens:
        raise SizingError(
            f"SWA pool of {swa_tokens} tokens cannot hold even one request: the admission floor is "
            f"W + page_size = {w} + {page_size} = {w + page_size}; raise the ratio or the budget"
        )


def size_hybrid(
    cfg: HybridConfig,
    budget_bytes: int,
    *,
    ratio: float,
    page_size: int,
    dtype: str,
    draft: HybridConfig | None = None,
) -> PoolSizes:
    """Hybrid (or all-SWA) pools for a KV budget in bytes (shared with a draft model's KV)."""
    cell = cell_bytes(cfg, ratio, dtype, draft, page_size) if cfg.layer_mix != "full_only" else 0
    if cell <= 0:
        return solve_pool_sizes(cfg, 0, ratio=ratio, page_size=page_size)
    return solve_pool_sizes(cfg, int(budget_bytes // cell), ratio=ratio, page_size=page_size)


def size_single_pool(
    cfg: HybridConfig,
    budget_bytes: int,
    *,
    page_size: int,
    dtype: str,
    draft: HybridConfig | None = None,
) -> PoolSizes:
    """One pool for every layer (hybrid memory disabled): each token costs every layer's KV."""
    ps = _check_page_size(page_size)
    full, swa = token_bytes(cfg, dtype, draft, ps)
    tokens = _align(budget_bytes // (full + swa), ps)
    if tokens <= 0:
        raise SizingError(
            f"KV budget of {budget_bytes} bytes holds no page of {ps} tokens "
            f"({full + swa} bytes per token)"
        )
    return PoolSizes(PoolMode.SINGLE, tokens, tokens, ps)


def bytes_used(
    cfg: HybridConfig, sizes: PoolSizes, dtype: str, draft: HybridConfig | None = None
) -> int:
    full, swa = token_bytes(cfg, dtype, draft, sizes.page_size)
    return int(sizes.full_tokens * full + sizes.swa_tokens * swa)


# ---------------------------------------------------------------------------------------------
# Chunk cap (spec §6.2): radix cache off, chunked prefill and max running requests set. The SWA
# pool is sized to the worst case of the running requests instead of by ratio.


@dataclasses.dataclass(frozen=True)
class Speculative:
    num_steps: int
    topk: int
    num_draft_tokens: int


@dataclasses.dataclass(frozen=True)
class ChunkCap:
    max_running_requests: int
    chunked_prefill_size: int
    eviction_interval: int = DEFAULT_EVICTION_INTERVAL
    overlap: bool = False  # overlap scheduling keeps two chunks (and spec v2 buffers) in flight
    speculative: Speculative | None = None
    pd_decode_extra_slots: int | None = None  # set: a PD-disaggregation decode server


def _decode_alloc(cap: ChunkCap, ps: int) -> int:
    spec = cap.speculative
    if spec is None:
        return ps
    if cap.overlap:  # spec v2 reserves two steps of max(topk * steps, draft tokens)
        return 2 * max(spec.topk * spec.num_steps, spec.num_draft_tokens)
    if ps == 1 or spec.topk == 1:
        return max(spec.topk * spec.num_steps, spec.num_draft_tokens)
    # Paged spec v1 with several branches: each branch may straddle a page.
    return max(
        _ceil_align(spec.num_steps + ps, ps) * spec.topk, _ceil_align(spec.num_draft_tokens, ps)
    )


def swa_residency(window: int, eviction_interval: int, page_size: int, draft: int = 1) -> int:
    """The seed's W + I + P: the most SWA tokens a decoding request holds. Its window, the
    tokens that pile up between evictions (`eviction_interval` steps of `draft` tokens each: 1,
    or a speculative round's draft tokens), and a partial page. Admission reserves the part
    beyond the window (`serving/budget.py`), the chunk cap and the ratio planner the whole."""
    return window + max(1, eviction_interval) * draft + page_size


def chunk_cap_tokens(window: int, page_size: int, cap: ChunkCap) -> int:
    """Worst-case SWA tokens of `cap.max_running_requests` requests (before page alignment)."""
    ps = _check_page_size(page_size)
    draft = cap.speculative.num_draft_tokens if cap.speculative else 1
    per_request = swa_residency(window, cap.eviction_interval, ps, draft) + _decode_alloc(cap, ps)
    total = per_request * cap.max_running_requests
    if cap.pd_decode_extra_slots is not None:
        return total + (window + ps) * cap.pd_decode_extra_slots
    chunks_in_flight = 2 if cap.overlap else 1
    return total + chunks_in_flight * cap.chunked_prefill_size + ps


def size_chunk_cap(
    cfg: HybridConfig, budget_bytes: int, cap: ChunkCap, *, page_size: int, dtype: str
) -> PoolSizes:
    """SWA pool at its worst case; everything else of the budget goes to the full pool."""
    if cfg.layer_mix != "hybrid":
        raise SizingError(
            f"chunk-cap sizing needs a hybrid model, {cfg.model_type!r} is {cfg.layer_mix}"
        )
    ps = _check_page_size(page_size)
    full_bytes, swa_bytes = token_bytes(cfg, dtype, page_size=ps)
    swa = _ceil_align(chunk_cap_tokens(cfg.sliding_window, ps, cap), ps)
    full = _align((budget_bytes - swa * swa_bytes) // full_bytes, ps)
    if full <= 0:
        raise SizingError(
            f"SWA pool cap of {swa} tokens ({swa * swa_bytes} bytes) leaves no room for the full "
            f"pool in a budget of {budget_bytes} bytes"
        )
    return PoolSizes(PoolMode.HYBRID, full, swa, ps, chunk_capped=True)


def size_chunk_cap_from_max_tokens(
    cfg: HybridConfig, max_tokens: int, cap: ChunkCap, *, page_size: int
) -> PoolSizes:
    ps = _check_page_size(page_size)
    swa = min(_ceil_align(chunk_cap_tokens(cfg.sliding_window, ps, cap), ps), max_tokens)
    return PoolSizes(PoolMode.HYBRID, _align(max_tokens, ps), swa, ps, chunk_capped=True)


def min_ratio_estimate(
    cfg: HybridConfig,
    avg_seq_len: int,
    *,
    page_size: int,
    eviction_interval: int = DEFAULT_EVICTION_INTERVAL,
) -> float:
    """The seed's estimate of the smallest useful ratio: (W + I + P) / T for average length T."""
    if avg_seq_len < 1:
        raise SizingError(f"average sequence length must be >= 1, got {avg_seq_len}")
    return swa_residency(cfg.sliding_window or 0, eviction_interval, page_size) / avg_seq_len


def with_host_tier(
    sizes: PoolSizes, cfg: HybridConfig, gib: float, dtype: str, draft: HybridConfig | None = None
) -> PoolSizes:
    """`sizes` with a host tier of `gib` GiB for the prefix cache (prefix_cache/host_tier.py):
    its full and SWA stores split in the pools' own SWA:full ratio (the SWA store keeps windows,
    as the SWA pool does). 0: none."""
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not gib >= 0:
        raise SizingError(f"host cache size must be a number of GiB >= 0, got {gib!r}")
    if not gib:
        return sizes
    if sizes.mode is not PoolMode.HYBRID:
        raise SizingError(
            f"a host tier keeps hybrid pools' two lifetimes; pool mode {sizes.mode.value!r} has "
            "one pool (turn hybrid memory on, or leave the host cache at 0)"
        )
    full_b, swa_b = token_bytes(cfg, dtype, draft, sizes.page_size)
    ratio = sizes.swa_tokens / sizes.full_tokens
    ps = sizes.page_size
    full = _align(gib_to_bytes(gib) / (full_b + ratio * swa_b), ps)
    swa = _align(full * ratio, ps)
    if swa < ps:
        raise SizingError(f"a host cache of {gib} GiB holds less than one page of each store")
    return dataclasses.replace(sizes, host_full_tokens=full, host_swa_tokens=swa)


def gib_to_bytes(gib: float) -> int:
    if not (isinstance(gib, int | float) and math.isfinite(gib) and gib > 0):
        raise SizingError(f"KV budget must be a positive number of GiB, got {gib!r}")
    return int(gib * 2**30)
