"""Building engines: `EngineSpec` (the pools, cache and scheduling settings), `load_model`
(the demo or a checkpoint folder, with its tokenizer), `make_engine` (a decoder and a spec) and
`engine_for` (a model, pool sizes and options: the runner is built here, below the engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from swajax import sizing
from swajax.config import HybridConfig
from swajax.demo import DEMO_DIR, demo_decoder
from swajax.errors import InputError
from swajax.models import HybridLM, load_decoder
from swajax.models.decoder import Decoder
from swajax.runner import DeviceRunner
from swajax.serving.engine import Engine, EngineOptions, engine_window
from swajax.sizing import PoolMode, PoolSizes
from swajax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything an engine is built from besides the model: pools, cache, scheduling, kernels
    and dtypes. The CLI's flags map onto it one to one."""

    # None: enough for AUTO_REQUESTS contexts of the model's own length (at most AUTO_CONTEXT
    # tokens each, AUTO_BUDGET_GIB in all).
    kv_budget_gib: float | None = None
    ratio: float = 0.5
    page_size: int = 4
    hybrid_memory: bool = True
    prefix_cache: bool = True
    cache_policy: str = "lean"  # swajax.prefix_cache.policy.DEFAULT
    tail_rebuild: bool = True
    num_speculative_tokens: int = 0  # with a draft model (make_engine's `draft`)
    overlap: bool = True  # plan a decode step while the one before runs
    attention: str = "xla"
    chunk_size: int | None = 64
    eviction_interval: int = 16  # small models, short generations: show the SWA KV going back
    max_running: int = 16
    # None: the checkpoint's max_position_embeddings (DEFAULT_CONTEXT if it names none), capped
    # by what one request can hold in the pools.
    max_context: int | None = None
    dtype: str = "float32"  # parameters and activations
    kv_dtype: str | None = None  # KV pools; None: the same as dtype


KV_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DEFAULT_CONTEXT = 4096  # a config without max_position_embeddings
AUTO_CONTEXT, AUTO_REQUESTS, AUTO_BUDGET_GIB = 32_768, 2, 2.0


def model_folder(model: str, flag: str = "--model") -> Path:
    """`tiny` (the embedded demo, swajax.demo) or a checkpoint directory."""
    if model == "tiny":
        return DEMO_DIR
    path = Path(model)
    if not path.is_dir():
        raise InputError(f"{flag} must be 'tiny' or a checkpoint directory, got {model!r}")
    return path


def load_model(
    model: str, dtype: str = "float32", chat: bool = False, *, flag: str = "--model"
) -> tuple[Decoder, Tokenizer]:
    """`tiny` (the embedded byte-level demo model), or a checkpoint directory; `flag` names the
    argument in errors."""
    path = model_folder(model, flag)
    if model == "tiny":
        if chat:
            raise InputError("--chat needs a checkpoint folder with a chat template")
        return demo_decoder(dtype=dtype), Tokenizer(None)
    return load_decoder(path, dtype=dtype), Tokenizer(path, chat=chat)


def _budget_bytes(decoder: Decoder, spec: EngineSpec, kv: str, draft_cfg, hybrid: bool) -> int:
    if spec.kv_budget_gib is not None:
        return sizing.gib_to_bytes(spec.kv_budget_gib)
    cfg = decoder.spec.hybrid
    context = min(spec.max_context or decoder.spec.max_position or DEFAULT_CONTEXT, AUTO_CONTEXT)
    full, swa = sizing.token_bytes(cfg, kv, draft_cfg)
    per_token = sizing.cell_bytes(cfg, spec.ratio, kv, draft_cfg) if hybrid else full + swa
    tokens = AUTO_REQUESTS * (context + 2 * spec.page_size)
    return int(min(tokens * per_token, sizing.gib_to_bytes(AUTO_BUDGET_GIB)))


def _max_context(decoder: Decoder, spec: EngineSpec, sizes: PoolSizes) -> int:
    """The given limit, else the model's own capped by one request's share of the pools (the
    engine refuses a request that cannot fit with a page to spare)."""
    if spec.max_context is not None:
        return spec.max_context
    hold = sizes.full_tokens
    if sizes.mode is PoolMode.ALL_SWA or (sizes.mode is PoolMode.HYBRID and not spec.chunk_size):
        hold = min(sizes.full_tokens or sizes.swa_tokens, sizes.swa_tokens)  # Engine.capacity
    return max(1, min(decoder.spec.max_position or DEFAULT_CONTEXT, hold - sizes.page_size))


def make_engine(decoder: Decoder, spec: EngineSpec, draft: Decoder | None = None) -> Engine:
    """An engine for `decoder`; `draft`: a speculative draft model, whose KV shares the pools
    (the sizing counts its layers)."""
    cfg = decoder.spec.hybrid
    draft_cfg = draft.spec.hybrid if draft is not None else None
    kv = spec.kv_dtype or KV_DTYPE[decoder.spec.dtype]
    hybrid = spec.hybrid_memory and cfg.layer_mix != "full_only"
    budget = _budget_bytes(decoder, spec, kv, draft_cfg, hybrid)
    if hybrid:
        sizes = sizing.size_hybrid(
            cfg, budget, ratio=spec.ratio, page_size=spec.page_size, dtype=kv, draft=draft_cfg
        )
    else:
        sizes = sizing.size_single_pool(
            cfg, budget, page_size=spec.page_size, dtype=kv, draft=draft_cfg
        )
    pallas = spec.attention == "pallas"
    model = HybridLM(decoder, dtype=kv, implementation=spec.attention, interpret=pallas)
    draft_lm = None
    if draft is not None:
        draft_lm = HybridLM(draft, dtype=kv, implementation=spec.attention, interpret=pallas)
    options = EngineOptions(
        max_running=spec.max_running,
        max_context=_max_context(decoder, spec, sizes),
        chunk_size=spec.chunk_size,
        prefix_cache=spec.prefix_cache,
        eviction_interval=spec.eviction_interval,
        cache_policy=spec.cache_policy,
        tail_rebuild=spec.tail_rebuild,
        num_speculative_tokens=spec.num_speculative_tokens,
        overlap=spec.overlap,
    )
    return engine_for(cfg, model, sizes, options, draft=draft_lm)


def engine_for(
    cfg: HybridConfig,
    model,
    sizes: PoolSizes,
    options: EngineOptions | None = None,
    *,
    draft=None,
) -> Engine:
    """An engine over `model` (a `HybridLM` or the null model) with its device runner."""
    options = options or EngineOptions()
    runner = DeviceRunner(
        model,
        sizes,
        max_running=options.max_running,
        max_context=options.max_context,
        window=engine_window(cfg, draft),
        draft=draft,
    )
    return Engine(cfg, model, sizes, options, runner=runner, draft=draft)
