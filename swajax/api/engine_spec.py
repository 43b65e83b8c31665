"""Building engines: `EngineSpec` (the pools, cache and scheduling settings), `load_model`
(the demo or a checkpoint folder, with its tokenizer), `make_engine` (a decoder and a spec) and
`engine_for` (a model, pool sizes and options: the runner is built here, below the engine)."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import Mesh

from swajax import platform, sizing
from swajax.api.hub import resolve_model
from swajax.api.state import Snapshots
from swajax.config import HybridConfig
from swajax.demo import demo_decoder
from swajax.errors import InputError
from swajax.host_memory import WORTH_FROM_BYTES, release_free_memory
from swajax.models import HybridLM, load_decoder
from swajax.models.decoder import Decoder
from swajax.models.mtp import MtpLayer, MtpLM, V4MtpLayer, is_mtp_layer
from swajax.models.sharding import kv_mesh
from swajax.runner import DeviceRunner, HostRunner
from swajax.serving.engine import Engine, engine_window, resolve_context
from swajax.serving.options import EngineOptions
from swajax.sizing import PoolSizes
from swajax.tokenizer import Tokenizer

# The library's defaults for small models and short generations (the demo): chunked prefill,
# frequent eviction so the SWA KV is seen going back, a model-derived context (None).
SPEC_OPTIONS = EngineOptions(
    max_running=16, max_context=None, chunk_size=64, eviction_interval=16, cache_policy="lean"
)


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything an engine is built from besides the model: the pools, the kernels and dtypes,
    and the engine's `options` (scheduling and cache, passed down unchanged). `max_context=None`
    in the options means the checkpoint's own `max_position_embeddings` (DEFAULT_CONTEXT if it
    names none), capped by what one request can hold in the pools."""

    # None: enough for AUTO_REQUESTS contexts of the model's own length (at most AUTO_CONTEXT
    # tokens each, AUTO_BUDGET_GIB in all).
    kv_budget_gib: float | None = None
    # Instead of kv_budget_gib: the share of the device's memory (the host's on CPU) that the
    # weights and the KV pools take together (vLLM's gpu_memory_utilization, SGLang's
    # mem_fraction_static); the pools get what the weights leave of it.
    mem_fraction: float | None = None
    ratio: float | None = None  # None: 0.5, or the model's own (sizing.MODEL_RATIOS)
    page_size: int | None = None  # None: 4, or the model's own (sizing.MODEL_PAGE_SIZES)
    hybrid_memory: bool = True
    # "auto": the Pallas kernels, compiled, on GPU and TPU; the XLA path on CPU. "pallas" on
    # CPU runs the kernels in Pallas' interpreter (a test of the kernels, not a fast path).
    attention: str = "auto"
    # Batch-invariant numerics: a request's logits are the same bits however its prefix was
    # obtained (cold, prefix hit, tail rebuild, host tier, after retraction) and whatever it
    # was batched with (`swajax.models.invariant`). Runs the XLA attention path.
    deterministic: bool = False
    scan_layers: bool = True  # repeating runs of layers as one scan (swajax.models.layer_stack)
    # Devices the model splits over (KV heads, MLP intermediate: `swajax.models.sharding`).
    # None: 1 in one process; every device of every process when several are joined.
    tensor_parallel: int | None = None
    # parameters and activations; "auto": the checkpoint's own (`loading.checkpoint_dtype`)
    dtype: str = "auto"
    kv_dtype: str | None = None  # KV pools; None: the same as dtype
    # A host tier for the prefix cache (prefix_cache/host_tier.py): GiB of host memory that
    # KV evicted from the device moves to, and hits load back from; 0: none. One process only.
    host_cache_gib: float = 0.0
    options: EngineOptions = SPEC_OPTIONS

    @classmethod
    def of(cls, **fields) -> EngineSpec:
        """A spec from one flat set of fields: its own, and any `EngineOptions` field."""
        return cls().replace(**fields)

    def replace(self, **fields) -> EngineSpec:
        """This spec with fields changed, its own or its options' (by name)."""
        mine = {f.name for f in dataclasses.fields(self)}
        options = {k: v for k, v in fields.items() if k not in mine}
        own = {k: v for k, v in fields.items() if k in mine}
        if options:
            own["options"] = dataclasses.replace(own.get("options", self.options), **options)
        return dataclasses.replace(self, **own)


KV_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DEFAULT_PAGE_SIZE = 4
# On Hopper and newer GPUs: the decode kernel's Mosaic GPU front end copies whole pages of at
# least 8 tokens into 64-key steps (`kernels.paged_decode.mosaic_gpu_misfit`); 16 is vLLM's.
MOSAIC_GPU_PAGE_SIZE = 16


# On TPU: a page is whole (rows, 128-lane) tiles of the pool's buffers for every KV dtype (16
# rows of bfloat16, 32 of an 8-bit float), so viewing a buffer as pages is free and the kernels
# read the pool where it lies; pages of 4 made XLA copy every pool around each kernel (its
# temporaries: the pools once more, measured with `swajax compile-check`).
TPU_PAGE_SIZE = 32


def default_page_size() -> int:
    """The page size where neither the spec nor the model names one, for the platform."""
    if platform.target() == "tpu":
        return TPU_PAGE_SIZE
    return MOSAIC_GPU_PAGE_SIZE if platform.mosaic_gpu() else DEFAULT_PAGE_SIZE


DEFAULT_RATIO = 0.5  # swa_full_tokens_ratio when neither the spec nor the model names one
DEFAULT_CONTEXT = 4096  # a config without max_position_embeddings
AUTO_CONTEXT, AUTO_REQUESTS, AUTO_BUDGET_GIB = 32_768, 2, 2.0


def model_folder(model: str, flag: str = "--model", revision: str | None = None) -> Path:
    """`tiny` (the embedded demo, swajax.demo), a checkpoint directory, or a hub id found in the
    local Hugging Face cache (`swajax.api.hub`)."""
    return resolve_model(model, revision, flag)


def tensor_mesh(tensor_parallel: int | None) -> Mesh | None:
    """The mesh of `EngineSpec.tensor_parallel` devices, or None for one device. Joined to
    other processes (`swajax.cluster`), the mesh is every device of every process: each
    process runs the same program, so none may sit outside it."""
    count, joined = jax.device_count(), jax.process_count() > 1
    n = tensor_parallel or (count if joined else 1)
    if joined and n != count:
        raise InputError(
            f"tensor_parallel={n}: {jax.process_count()} joined processes split the model over "
            f"all {count} of their devices"
        )
    if not 1 <= n <= count:
        raise InputError(f"tensor_parallel={n} needs that many devices; {count} are visible")
    return kv_mesh(n) if n > 1 else None


def load_model(
    model: str,
    dtype: str = "auto",
    chat: bool = False,
    *,
    flag: str = "--model",
    dequantize_weights: bool = False,
    mesh: Mesh | None = None,
    revision: str | None = None,
) -> tuple[Decoder, Tokenizer]:
    """`tiny` (the embedded byte-level demo model), or a checkpoint directory; `flag` names the
    argument in errors. A quantized checkpoint stays quantized on the device unless
    `dequantize_weights`. `mesh` (`tensor_mesh`): each weight loaded straight into its
    shards (across processes, each reads only its own devices' shards)."""
    path = model_folder(model, flag, revision)
    if model == "tiny":
        if chat:
            raise InputError("the embedded demo model has no chat template: give a checkpoint")
        return demo_decoder(dtype=dtype, mesh=mesh), Tokenizer(None)
    decoder = load_decoder(path, dtype=dtype, dequantize_weights=dequantize_weights, mesh=mesh)
    return decoder, Tokenizer(path, chat=chat)


def device_memory_bytes() -> int | None:
    """The first device's memory (`bytes_limit`), or the host's on CPU."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return host_memory_bytes()


def _budget_bytes(decoder: Decoder, spec: EngineSpec, kv: str, draft_cfg, hybrid: bool) -> int:
    if spec.kv_budget_gib is not None and spec.mem_fraction is not None:
        raise InputError("give the KV budget once: kv_budget_gib or a memory fraction, not both")
    if spec.kv_budget_gib is not None:
        return sizing.gib_to_bytes(spec.kv_budget_gib)
    if spec.mem_fraction is not None:
        return _fraction_budget(decoder, spec.mem_fraction)
    cfg = decoder.spec.hybrid
    own = spec.options.max_context
    context = min(own or decoder.spec.max_position or DEFAULT_CONTEXT, AUTO_CONTEXT)
    full, swa = sizing.token_bytes(cfg, kv, draft_cfg)
    ratio = sizing.resolve_ratio(cfg, spec.ratio, DEFAULT_RATIO)
    per_token = sizing.cell_bytes(cfg, ratio, kv, draft_cfg) if hybrid else full + swa
    page_size = sizing.resolve_page_size(cfg, spec.page_size, default_page_size())
    tokens = AUTO_REQUESTS * (context + 2 * page_size)
    return int(min(tokens * per_token, sizing.gib_to_bytes(AUTO_BUDGET_GIB)))


def _fraction_budget(decoder: Decoder, fraction) -> int:
    """KV bytes under a memory fraction: fraction x memory, less the weights."""
    number = isinstance(fraction, int | float) and not isinstance(fraction, bool)
    if not number or not 0 < fraction <= 1:
        raise InputError(f"the memory fraction must be in (0, 1], got {fraction!r}")
    total = device_memory_bytes()
    if total is None:
        raise InputError("this machine's memory cannot be read: give kv_budget_gib instead")
    weights = sum(int(x.nbytes) for x in jax.tree.leaves(nnx.state(decoder)))
    budget = int(fraction * total) - weights
    if budget <= 0:
        raise InputError(
            f"a memory fraction of {fraction:g} is {fraction * total / 2**30:.2f} GiB, and the "
            f"weights alone take {weights / 2**30:.2f} GiB: raise the fraction"
        )
    return budget


def _options(decoder: Decoder, spec: EngineSpec, sizes: PoolSizes) -> EngineOptions:
    """The spec's options with the context limit made concrete: the given one, else the
    model's own capped by one request's share of the pools."""
    options = spec.options
    own = decoder.spec.max_position
    if options.max_context is not None:
        if own is not None and options.max_context > own:
            logging.getLogger(__name__).warning(
                "the context limit %d is longer than the model's positions "
                "(max_position_embeddings %d, its RoPE scaling included): positions past %d "
                "were never trained and its output there is not to be trusted",
                options.max_context,
                own,
                own,
            )
        return options
    hold = resolve_context(options, sizes).max_context
    own = decoder.spec.max_position or DEFAULT_CONTEXT
    return dataclasses.replace(options, max_context=min(own, hold))


ATTENTION = ("auto", "xla", "pallas")


def attention_path(
    attention: str, backend: str | None = None, *, deterministic: bool = False
) -> tuple[str, bool]:
    """(implementation, interpret) for `EngineSpec.attention` on `backend` (default: JAX's):
    the compiled Pallas kernels on GPU and TPU, the XLA path on CPU for "auto"; Pallas' interpreter
    only on CPU, where the kernels cannot be compiled. Deterministic mode runs the XLA path
    (its batch-invariant form) everywhere."""
    if attention not in ATTENTION:
        raise InputError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if deterministic and attention == "pallas":
        raise InputError(
            "attention 'pallas' cannot run deterministic (--deterministic): the kernels fold "
            "keys a page at a time, so their sums follow the page size; use 'auto' or 'xla'"
        )
    backend = backend or platform.target()
    device = backend in ("gpu", "cuda", "rocm", "tpu")
    if attention == "auto":
        attention = "pallas" if device and not deterministic else "xla"
    return attention, attention == "pallas" and not device


def host_memory_bytes() -> int | None:
    """This machine's memory as this process may use it: physical memory, or the cgroup's
    limit where one is lower (None where neither can be read)."""
    found = []
    try:
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append(int(text))
    return min(found) if found else None


def _check_host_memory(gib: float) -> None:
    """A host tier is allocated up front: one larger than the machine is refused by name."""
    total = host_memory_bytes()
    if isinstance(gib, int | float) and total is not None and gib * 2**30 > total:
        raise InputError(
            f"host_cache_gib {gib:g} (--host-cache-gib) is more than this machine's memory "
            f"({total / 2**30:.1f} GiB)"
        )


def make_engine(
    decoder: Decoder,
    spec: EngineSpec,
    draft: Decoder | MtpLayer | V4MtpLayer | None = None,
    *,
    consume: bool = False,
    mesh: Mesh | None = None,
) -> Engine:
    """An engine for `decoder`; `draft`: a speculative draft model or the checkpoint's own MTP
    layer (`swajax.models.mtp`), whose KV shares the pools (the sizing counts its layers).
    With `spec.scan_layers` the engine's model holds the layer weights restacked
    (`swajax.models.layer_stack`): drop `decoder` afterwards, or its per-layer arrays stay
    alive beside them. `mesh`: the devices to split over instead of `spec.tensor_parallel`'s
    (a decoder of shapes only traced for a slice this machine does not have: `swajax.tpu`)."""
    cfg = decoder.spec.hybrid
    draft_cfg = draft.spec.hybrid if draft is not None else None
    kv = spec.kv_dtype or KV_DTYPE[decoder.spec.dtype]
    hybrid = spec.hybrid_memory and cfg.layer_mix != "full_only"
    page_size = sizing.resolve_page_size(cfg, spec.page_size, default_page_size())
    budget = _budget_bytes(decoder, spec, kv, draft_cfg, hybrid)
    if hybrid:
        ratio = sizing.resolve_ratio(cfg, spec.ratio, DEFAULT_RATIO)
        sizes = sizing.size_hybrid(
            cfg, budget, ratio=ratio, page_size=page_size, dtype=kv, draft=draft_cfg
        )
    else:
        sizes = sizing.size_single_pool(cfg, budget, page_size=page_size, dtype=kv, draft=draft_cfg)
    if spec.host_cache_gib and jax.process_count() > 1:
        raise InputError(
            "a host cache (host_cache_gib) runs in one process; it is not split across joined "
            "processes"
        )
    _check_host_memory(spec.host_cache_gib)
    sizes = sizing.with_host_tier(sizes, cfg, spec.host_cache_gib, kv, draft_cfg)
    implementation, interpret = attention_path(spec.attention, deterministic=spec.deterministic)
    lm = dict(
        dtype=kv,
        implementation=implementation,
        interpret=interpret,
        deterministic=spec.deterministic,
        scan_layers=spec.scan_layers,
        mesh=mesh if mesh is not None else tensor_mesh(spec.tensor_parallel),
    )
    model = HybridLM(decoder, consume=consume, **lm)
    draft_lm = None
    if is_mtp_layer(draft):  # the checkpoint's own draft layer
        draft_lm = MtpLM(draft, model)
    elif draft is not None:
        draft_lm = HybridLM(draft, consume=consume, **lm)
    options = _options(decoder, spec, sizes)
    if spec.ratio is not None and not hybrid:
        why = (
            "the hybrid SWA memory is off (--disable-hybrid-swa-memory)"
            if not spec.hybrid_memory
            else "the model has no sliding-window layers"
        )
        logging.getLogger(__name__).warning(
            "swa_full_tokens_ratio %g has no effect: %s, so one pool holds every layer's KV",
            spec.ratio,
            why,
        )
    logging.getLogger(__name__).info(
        "pools: %d full + %d SWA tokens (%s, page %d, %s KV); context limit %d",
        sizes.full_tokens,
        sizes.swa_tokens,
        sizes.mode.value,
        sizes.page_size,
        kv,
        options.max_context,
    )
    engine = engine_for(cfg, model, sizes, options, draft=draft_lm)
    if not model.abstract and sum(int(x.nbytes) for x in model.params) >= WORTH_FROM_BYTES:
        release_free_memory()  # what loading and restacking freed, before the steps allocate
    return engine


def engine_for(
    cfg: HybridConfig,
    model,
    sizes: PoolSizes,
    options: EngineOptions | None = None,
    *,
    draft=None,
) -> Engine:
    """An engine over `model` (a `HybridLM` on the device, or the null model on the host) and
    its runner."""
    options = resolve_context(options or EngineOptions(), sizes)
    if not model.needs_kv:
        runner = HostRunner(model, sizes, draft=draft)
        return Engine(cfg, model, sizes, options, runner=runner, draft=draft)
    runner = DeviceRunner(
        model,
        sizes,
        max_running=options.max_running,
        max_context=options.max_context,
        window=engine_window(cfg, draft),
        draft=draft,
    )
    return Engine(cfg, model, sizes, options, runner=runner, draft=draft, snapshots=Snapshots)
