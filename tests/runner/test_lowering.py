"""Every engine step program at gpt-oss-20b's widths (4 layers, weights as shapes only) lowers
for TPU v5e and v6e and for CUDA through `jax.export`, with the compiled kernels (Mosaic on
TPU; on CUDA, traced for Hopper, the decode kernel's Mosaic GPU front end and the extend
kernel's Triton one; no interpreter), and with the XLA path. No accelerator is needed: the
programs are traced for the target (`swajax.platform.lowering_for`), as that platform runs
them (its attention, none of XLA:CPU's workarounds). Deterministic mode's programs lower for
both too."""

from __future__ import annotations

import functools
import re

import jax
import pytest
from helpers.lowering import H100, on_device, tpu
from helpers.published import step_programs
from jax import export

from swajax import platform, tpu as slices

TRITON, MOSAIC_GPU = "__gpu$xla.gpu.triton", "mosaic_gpu_v2"
KERNELS = {"tpu": "tpu_custom_call", "cuda": TRITON}
PROGRAMS = ("prefill", "decode", "round", "verify")
TARGETS = [("tpu", "TPU v5 lite"), ("tpu", "TPU v6 lite"), ("cuda", None)]


@functools.cache
def programs(target: str, attention: str, deterministic: bool = False, layers: int = 4, kv=0.05):
    with platform.lowering_for(target):
        return step_programs(attention, layers, deterministic, kv_budget_gib=kv)


def lowered(target: str, device_kind, program) -> str:
    with platform.lowering_for(target):
        fn = export.export
        if target == "tpu":
            with on_device(tpu(device_kind)):
                exp = fn(program.fn, platforms=["tpu"])(*program.args, **program.statics)
        else:
            checks = [export.DisabledSafetyCheck.custom_call(c) for c in (TRITON, MOSAIC_GPU)]
            with on_device(H100):
                exp = fn(program.fn, platforms=["cuda"], disabled_checks=checks)(
                    *program.args, **program.statics
                )
    return exp.mlir_module()


def custom_calls(text: str) -> set[str]:
    return set(re.findall(r"custom_call @([\w$.]+)", text))


def clean(text: str) -> None:
    """No float64 anywhere, no call back into the host."""
    assert not re.search(r"\bf64\b", text)
    assert not any("callback" in c for c in custom_calls(text)), custom_calls(text)


# Compiled, not only exported: XLA:TPU and Mosaic run on this machine (libtpu, compile-only
# devices), so a kernel Mosaic refuses fails here. Two layers (one sliding, one full) at
# gpt-oss-20b's widths; a compile costs 20-120 s here (the speculative round the most), so the
# default run compiles decode for one v6e chip (and prefill and decode split over a v5e-4 in
# tests/cli/test_compile_check.py) and the rest waits for `-m slow`.
@pytest.mark.parametrize(
    "name, deterministic",
    [
        pytest.param("prefill", False, marks=pytest.mark.slow),  # v5e-4's compile-check has one
        ("decode", False),
        pytest.param("round", False, marks=pytest.mark.slow),
        pytest.param("verify", False, marks=pytest.mark.slow),
        pytest.param("decode", True, marks=pytest.mark.slow),
    ],
)
def test_each_step_program_compiles_for_a_tpu_chip(name, deterministic):
    # 2 GiB of pools (shapes only): a copy of one would show in the temporaries
    program = programs("tpu", "auto", deterministic, layers=2, kv=2.0)[name]
    device = slices.devices(slices.parse_slice("v6e-1"))[0]
    compiled = slices.compile_on(device, program.fn, *program.args, **program.statics)
    text = compiled.as_text()
    if not deterministic:  # the kernels, compiled by Mosaic into the program
        kernel = (
            "swajax_ragged_extend_tpu" if name in ("prefill", "verify") else "swajax_paged_decode"
        )
        assert kernel in text, name
    memory = compiled.memory_analysis()
    pools = program.args[2]
    pool_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pools))
    assert memory.argument_size_in_bytes > pool_bytes > 2**30
    # Temporaries: the embedding table copied once into the layout its row gather wants
    # (201,088 x 2,880 bfloat16, 1.08 GiB: XLA stores it vocabulary-minor since 2,880 is no
    # multiple of 128; BUILD_NOTES.md, "TPU for real") and the step's own working set; bounded
    # so that a copy of a pool (as pages of 4 made, before the pools stored heads side by
    # side) or of a weight per layer shows.
    # Measured: prefill, decode and round 1.11 GiB; the speculative round (a draft's step
    # too) 1.20; deterministic decode 1.35. Pages of 4 (a pool copied) made decode 1.34.
    bound = 1.4 if name == "verify" or deterministic else 1.2
    assert memory.temp_size_in_bytes < bound * 2**30, memory.temp_size_in_bytes


# CUDA by default; TPU with `-m slow` (the default run compiles for TPU, above, which exports
# on the way).
@pytest.mark.parametrize(
    "target, device_kind",
    [
        pytest.param(*TARGETS[0], marks=pytest.mark.slow),
        pytest.param(*TARGETS[1], marks=pytest.mark.slow),
        TARGETS[2],
    ],
)
def test_each_step_program_lowers_with_the_compiled_kernels(target, device_kind):
    found = programs("cuda" if target == "cuda" else "tpu", "pallas")
    assert set(found) == set(PROGRAMS)
    for name in PROGRAMS:
        text = lowered(target, device_kind, found[name])
        clean(text)
        # which kernel: the extend kernel reads a prompt, the decode kernel one token a row
        extend = name in ("prefill", "verify")
        kernel = KERNELS[target] if extend or target == "tpu" else MOSAIC_GPU
        assert kernel in custom_calls(text), (name, custom_calls(text))
        wanted = "swajax_ragged_extend" if extend else "swajax_paged_decode"
        if target == "cuda" and not extend:
            wanted = "swajax_paged_decode_mosaic_gpu"
        assert wanted in text, name


# The XLA path has no platform-specific kernels: TPU in the default run, CUDA with `-m slow`.
@pytest.mark.parametrize(
    "target, device_kind", [TARGETS[0], pytest.param(*TARGETS[2], marks=pytest.mark.slow)]
)
def test_each_step_program_lowers_with_the_xla_path(target, device_kind):
    found = programs("cuda" if target == "cuda" else "tpu", "xla")
    for name in PROGRAMS:
        text = lowered(target, device_kind, found[name])
        clean(text)
        assert not custom_calls(text) & {*KERNELS.values(), MOSAIC_GPU}, name


# Deterministic mode (its fenced tile loops and per-query attention) on the accelerators it is
# meant for: CUDA in the default run, TPU with `-m slow`.
@pytest.mark.parametrize(
    "target, device_kind", [TARGETS[2], pytest.param(*TARGETS[0], marks=pytest.mark.slow)]
)
def test_each_step_program_lowers_in_deterministic_mode(target, device_kind):
    found = programs("cuda" if target == "cuda" else "tpu", "auto", deterministic=True)
    for name in PROGRAMS:
        text = lowered(target, device_kind, found[name])
        clean(text)
        assert not custom_calls(text) & {*KERNELS.values(), MOSAIC_GPU}, name  # XLA, by design
        # the fenced tile loops (their trip counts behind barriers; the default path has none)
        assert "stablehlo.optimization_barrier" in text, name


def test_the_target_decides_what_is_traced():
    """Traced for TPU, nothing of XLA:CPU's workarounds is in the program: the pools hold
    bfloat16 (not their bits), the attention is the kernel's."""
    found = programs("tpu", "auto")
    pools = found["decode"].args[2]
    assert pools.full_k.dtype == jax.numpy.bfloat16 and pools.bits_of == (None, None)
    assert platform.target() == jax.default_backend()  # outside the block: this machine's


def test_which_gpus_run_the_mosaic_gpu_kernel(monkeypatch):
    """Hopper or newer NVIDIA GPUs (and CUDA lowered ahead of time) take the decode kernel's
    Mosaic GPU front end and its page size of 16; older ones, AMD GPUs (which report an
    architecture name) and CPUs keep the defaults."""
    from swajax.api.engine_spec import (
        DEFAULT_PAGE_SIZE,
        MOSAIC_GPU_PAGE_SIZE,
        TPU_PAGE_SIZE,
        default_page_size,
    )

    assert not platform.mosaic_gpu() and default_page_size() == DEFAULT_PAGE_SIZE  # this CPU
    with platform.lowering_for("cuda"):
        assert platform.mosaic_gpu() and default_page_size() == MOSAIC_GPU_PAGE_SIZE
    with platform.lowering_for("rocm"):
        assert not platform.mosaic_gpu()
    with platform.lowering_for("tpu"):
        assert default_page_size() == TPU_PAGE_SIZE

    class Gpu:
        def __init__(self, capability):
            self.compute_capability = capability

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for capability, mosaic in (("9.0", True), ("10.0", True), ("8.0", False), ("gfx90a", False)):
        monkeypatch.setattr(jax, "devices", lambda c=capability: [Gpu(c)])
        assert platform.mosaic_gpu() is mosaic, capability


def test_the_host_tier_and_snapshot_programs_compile_in_place_for_a_tpu_chip():
    """The page copies of the host tier and of a snapshot restored into other pools
    (`memory.host_copy`: gather pages for the host, load pages back) compiled for a v6e chip at
    gpt-oss-20b's KV widths with 2 GiB of pools (shapes only): a load writes into the donated
    pools (their bytes aliased, no pool copied), a gather holds only the pages it moves."""
    from swajax import sizing
    from swajax.memory import pool as pool_lib
    from swajax.memory.allocator import init_allocator
    from swajax.memory.host_copy import gather_pages, load_pages
    from swajax.presets import load_preset

    cfg = load_preset("gpt-oss-20b")
    sizes = sizing.size_hybrid(cfg, 2 * 2**30, ratio=0.5, page_size=32, dtype="bf16")
    alloc = jax.eval_shape(lambda: init_allocator(sizes.full_tokens, sizes.swa_tokens, 32))
    pools = jax.eval_shape(lambda: pool_lib.init_pools(cfg, sizes, "bf16"))
    device = slices.devices(slices.parse_slice("v6e-1"))[0]
    pages = jax.ShapeDtypeStruct((64,), jax.numpy.int32)
    pool_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pools))
    moved = 0
    for swa in (False, True):
        compiled = slices.compile_on(device, gather_pages, alloc, pools, pages, swa=swa)
        kv = jax.eval_shape(
            lambda a, p, g, s=swa: gather_pages(a, p, g, swa=s), alloc, pools, pages
        )
        moved = max(moved, sum(x.size * x.dtype.itemsize for x in kv))
        assert compiled.memory_analysis().temp_size_in_bytes < 4 * moved
    full_kv = jax.eval_shape(lambda a, p, g: gather_pages(a, p, g, swa=False), alloc, pools, pages)
    swa_kv = jax.eval_shape(lambda a, p, g: gather_pages(a, p, g, swa=True), alloc, pools, pages)
    compiled = slices.compile_on(device, load_pages, alloc, pools, pages, full_kv, pages, swa_kv)
    memory = compiled.memory_analysis()
    assert memory.alias_size_in_bytes >= pool_bytes > 2**30
    assert memory.temp_size_in_bytes < 4 * moved


@pytest.mark.slow  # 16 compiles of 10-20 s each here (`pytest -m slow tests/runner`)
def test_every_program_a_warm_up_makes_compiles_for_a_tpu_chip():
    """A server's warm-up (fixed shapes: every batch and chunk size the scheduler can give,
    one-step and multi-step decode) recorded instead of compiled, then each program compiled for
    a v6e chip by XLA:TPU and Mosaic, the kernels inside: the shapes a warm-up reaches beyond the
    one the test above compiles are all ones the TPU compiler takes. gpt-oss's layer kinds and
    head width (64) over narrower layers, so each compile stays short."""
    from helpers.published import abstract_decoder, narrowed_config

    from swajax.api.engine_spec import EngineSpec, make_engine
    from swajax.runner import program_store

    cfg = narrowed_config()
    options = EngineSpec.of(kv_budget_gib=0.05, max_context=512, chunk_size=64, warmup=True)
    calls: list = []
    with platform.lowering_for("tpu"), program_store.recording(calls):
        engine = make_engine(abstract_decoder(cfg), options)
        ready, compiled = engine.warm_up()
    assert ready == len(calls) > 8 and compiled == 0
    names = {c.fn.__name__ for c in calls}
    assert names == {"fused_step", "fused_round"}, names
    device = slices.devices(slices.parse_slice("v6e-1"))[0]
    kernels = set()
    for call in calls:
        with platform.lowering_for("tpu"):
            text = slices.compile_on(device, call.fn, *call.args, **call.statics).as_text()
        kernels |= {k for k in ("swajax_paged_decode", "swajax_ragged_extend_tpu") if k in text}
    assert kernels == {"swajax_paged_decode", "swajax_ragged_extend_tpu"}


def test_a_tail_rebuilds_write_compiles_in_place_for_a_tpu_chip():
    """A step that rebuilds an SWA tail stores the prefix cache's own full KV (`full_src`):
    compiled for a v6e chip at gpt-oss-20b's KV widths with 2 GiB of pools (shapes only), the
    write reads its rows where the pool keeps them. Gathering them from the per-head view made
    XLA:TPU relay each full pool out whole ([.., 512] and [.., 8, 64] tile differently): 2 GiB
    of temporaries for 2 GiB of pools, found by `compile-check --warm-up`."""
    from swajax import sizing
    from swajax.memory import pool as pool_lib
    from swajax.presets import load_preset

    cfg = load_preset("gpt-oss-20b")
    sizes = sizing.size_hybrid(cfg, 2 * 2**30, ratio=0.5, page_size=32, dtype="bf16")
    with platform.lowering_for("tpu"):  # pools as TPU holds them (bfloat16 as itself)
        pools = jax.eval_shape(lambda: pool_lib.init_pools(cfg, sizes, "bf16"))
    shape = cfg.full_attention
    tokens, heads, dim = 64, shape.num_kv_heads, shape.head_dim
    kv = jax.ShapeDtypeStruct((tokens, heads, dim), jax.numpy.bfloat16)
    slots = jax.ShapeDtypeStruct((tokens,), jax.numpy.int32)
    loc = pool_lib.KVWriteLoc(full=slots, full_src=slots)
    full_layer = cfg.full_layer_ids[0]
    device = slices.devices(slices.parse_slice("v6e-1"))[0]
    compiled = slices.compile_on(device, pool_lib.write_kv_jit, pools, full_layer, kv, kv, loc)
    memory = compiled.memory_analysis()
    pool_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pools))
    assert memory.alias_size_in_bytes >= pool_bytes > 2**30
    assert memory.temp_size_in_bytes < 2**20, memory.temp_size_in_bytes
