"""Pallas kernels on their own: references, validation, the TPU interpreter's race detector,
lowering for real devices. The cases shared with the XLA path are in test_implementations.py."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from swajax.config import LayerKind, LayerSpec
from swajax.kernels.paged_decode import paged_decode, paged_decode_reference
from swajax.kernels.ragged_extend import ragged_extend

TRITON, MOSAIC_GPU = "__gpu$xla.gpu.triton", "mosaic_gpu_v2"
LAYERS = {
    "full": LayerSpec(LayerKind.FULL),
    "sliding": LayerSpec(LayerKind.SLIDING, 8),
    "chunked": LayerSpec(LayerKind.CHUNKED, 8),
}


def test_kernel_reference_agrees_with_kernel_directly():
    rng = np.random.default_rng(0)
    b, hkv, g, d, ps, pages = 3, 2, 2, 16, 4, 20
    args = (
        jnp.asarray(rng.normal(size=(b, hkv, g, d)), jnp.float32),
        jnp.asarray(rng.normal(size=(pages, ps, hkv, d)), jnp.float32),
        jnp.asarray(rng.normal(size=(pages, ps, hkv, d)), jnp.float32),
        jnp.asarray(rng.integers(1, pages, size=(b, 6)), jnp.int32),
        jnp.array([0, 2, 1], jnp.int32),
        jnp.array([17, 24, 0], jnp.int32),
    )
    for kind, window in (("full", 0), ("sliding", 5), ("chunked", 4)):
        ref = paged_decode_reference(*args, kind=kind, window=window, scale=0.3)
        out = paged_decode(*args, kind=kind, window=window, scale=0.3, interpret=True)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-6)


def test_kernel_validation_names_shapes():
    q = jnp.zeros((2, 2, 2, 16))
    pool = jnp.zeros((5, 4, 2, 16))
    table, ones = jnp.zeros((2, 3), jnp.int32), jnp.ones(2, jnp.int32)
    with pytest.raises(ValueError, match=r"k_pages must be \[pages, ps, 2, 16\]"):
        paged_decode(q, jnp.zeros((5, 4, 3, 16)), pool, table, ones, ones, kind="full", scale=1.0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        paged_decode(q, pool, pool, table, ones, ones, kind="sliding", window=0, scale=1.0)
    with pytest.raises(ValueError, match="kind must be one of"):
        paged_decode(q, pool, pool, table, ones, ones, kind="local", scale=1.0)
    with pytest.raises(ValueError, match="backend"):
        paged_decode(
            q, pool, pool, table, ones, ones, kind="full", scale=1.0, backend="npu", interpret=True
        )
    with pytest.raises(ValueError, match="block_q"):
        ragged_extend(
            jnp.zeros((2, 2, 3, 16)),
            pool,
            pool,
            table,
            ones,
            ones,
            ones,
            ones,
            g=2,
            kind="full",
            scale=1.0,
        )


# ---------------------------------------------------------------------------------------------
# TPU interpreter (Mosaic rules, NaN-filled fresh memory, race detection) and cross-lowering.


def _small_inputs(rng, b=2, hkv=2, g=2, d=16, ps=4, pages=12, cols=4):
    def f32(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return dict(
        q=f32(b, hkv, g, d),
        k=f32(pages, ps, hkv, d),
        v=f32(pages, ps, hkv, d),
        table=jnp.asarray(rng.integers(1, pages, size=(b, cols)), jnp.int32),
        first=jnp.array([0, 1], jnp.int32),
        seq=jnp.array([13, 19], jnp.int32),
    )


def _races_found() -> bool:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    return bool(interpret_pallas_call.races.races_found)


def test_tpu_interpreter_decode_no_races():
    from jax.experimental.pallas import tpu as pltpu

    x = _small_inputs(np.random.default_rng(0))
    args = (x["q"], x["k"], x["v"], x["table"], x["first"], x["seq"])
    kw = dict(kind="sliding", window=5, scale=0.3)
    ref = paged_decode_reference(*args, **kw)
    out = paged_decode(
        *args, backend="tpu", interpret=pltpu.InterpretParams(detect_races=True), **kw
    )
    assert not _races_found()
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-6)


def test_tpu_interpreter_extend_no_races():
    from jax.experimental.pallas import tpu as pltpu

    from swajax.kernels.ragged_extend import ragged_extend_reference

    rng = np.random.default_rng(1)
    x = _small_inputs(rng)
    q = jnp.asarray(rng.normal(size=(3, 2, 4 * 2, 16)), jnp.float32)  # 3 blocks of 4 queries
    blocks = (
        jnp.array([0, 1, 1], jnp.int32),
        jnp.array([9, 12, 16], jnp.int32),
        jnp.array([4, 4, 3], jnp.int32),
    )
    args = (q, x["k"], x["v"], x["table"], x["first"], *blocks)
    kw = dict(g=2, kind="chunked", window=4, scale=0.3)
    ref = ragged_extend_reference(*args, **kw)
    params = pltpu.InterpretParams(detect_races=True)
    out = ragged_extend(*args, backend="tpu", interpret=params, **kw)
    assert not _races_found()
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The decode kernel's Mosaic GPU front end (Hopper and newer), run by JAX's GPU interpreter:
# shared memory, barriers and TMA copies simulated on CPU, the warpgroup product PV as written
# (QK^T, whose operand is transposed, as an ordinary dot: the interpreter takes no transposed
# operand).

MGPU_CASES = {
    # G, dk, dv, page size, kind, window, sinks, soft cap, dtype
    "sliding-pages16": (8, 64, 64, 16, "sliding", 70, True, None, jnp.bfloat16),
    "full-pages64-f16": (4, 128, 128, 64, "full", 0, False, None, jnp.float16),
    "chunked-pages8-cap": (2, 64, 64, 8, "chunked", 32, True, 30.0, jnp.bfloat16),
    "dk-not-dv-pages128": (1, 128, 64, 128, "sliding", 200, False, None, jnp.bfloat16),
}


@pytest.mark.parametrize("case", sorted(MGPU_CASES))
def test_the_mosaic_gpu_decode_matches_the_reference(case):
    """Against the dense reference at 16-bit precision: windows that span several 64-key steps
    (the next step's pages copied while one computes), a first page past 0, a padding row."""
    g, dk, dv, ps, kind, window, sinks, cap, dt = MGPU_CASES[case]
    rng = np.random.default_rng(len(case))
    b, hkv, pages, cols = 3, 2, 40, 12
    q = jnp.asarray(rng.normal(size=(b, hkv, g, dk)), dt)
    k = jnp.asarray(rng.normal(size=(pages, ps, hkv, dk)), dt)
    v = jnp.asarray(rng.normal(size=(pages, ps, hkv, dv)), dt)
    table = jnp.asarray(rng.integers(1, pages, size=(b, cols)), jnp.int32)
    first = jnp.array([0, 1, 0], jnp.int32)
    seq = jnp.array([ps * 5 + 3, ps * cols, 0], jnp.int32)
    sink = jnp.asarray(rng.normal(size=(hkv, g)), jnp.float32) if sinks else None
    args = (q, k, v, table, first, seq, sink)
    kw = dict(kind=kind, window=window, scale=dk**-0.5, soft_cap=cap)
    out = paged_decode(*args, backend="mosaic_gpu", interpret=True, **kw)
    ref = paged_decode_reference(*args, **kw)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)
    assert not np.asarray(out[2]).any()  # the padding row


def test_the_mosaic_gpu_decode_runs_without_races_and_names_what_it_cannot_take():
    from swajax.kernels.paged_decode import _gpu_interpreter

    params = type(_gpu_interpreter(True))(detect_races=True)
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as gpu_interpreter

    rng = np.random.default_rng(3)
    bf = jnp.bfloat16
    q = jnp.asarray(rng.normal(size=(2, 2, 4, 64)), bf)
    k = jnp.asarray(rng.normal(size=(30, 16, 2, 64)), bf)
    table = jnp.asarray(rng.integers(1, 30, size=(2, 10)), jnp.int32)
    args = (q, k, k, table, jnp.array([0, 2], jnp.int32), jnp.array([100, 150], jnp.int32))
    kw = dict(kind="sliding", window=70, scale=0.1)
    out = paged_decode(*args, backend="mosaic_gpu", interpret=params, **kw)
    assert not gpu_interpreter.get_races().races_found
    ref = paged_decode_reference(*args, **kw)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)
    for bad, match in (
        (dict(k=k.astype(jnp.float32)), "KV dtype float32 .16-bit only"),
        (dict(q=q[..., :48], k=k[..., :48]), "head dims 48 / 48 .multiples of 64 only"),
        (dict(k=k[:, :4]), "page size 4 .8 to 64 dividing 64"),
    ):
        x = {"q": q, "k": k, **bad}
        with pytest.raises(ValueError, match=f"Mosaic GPU decode kernel does not take {match}"):
            paged_decode(x["q"], x["k"], x["k"], *args[3:], backend="mosaic_gpu", **kw)


def _export(fn, args, platform, device_kind=None):
    import functools

    import jax
    from jax import export

    backend = {"tpu": "tpu", "cuda": "gpu", "cuda-mosaic": "mosaic_gpu"}[platform]
    f = jax.jit(functools.partial(fn, kind="sliding", window=128, scale=0.1, backend=backend))
    from helpers.lowering import H100, on_device, tpu

    if platform == "tpu":
        with on_device(tpu(device_kind)):
            return export.export(f, platforms=["tpu"])(*args)
    checks = [export.DisabledSafetyCheck.custom_call(c) for c in (TRITON, MOSAIC_GPU)]
    with on_device(H100):
        exp = export.export(f, platforms=["cuda"], disabled_checks=checks)(*args)
    calls = set(re.findall(r"custom_call @([\w$.]+)", exp.mlir_module()))
    assert calls == {MOSAIC_GPU if platform == "cuda-mosaic" else TRITON}, calls
    return exp


@pytest.mark.parametrize(
    "platform, device_kind",
    [("tpu", "TPU v5 lite"), ("tpu", "TPU v6 lite"), ("cuda", None), ("cuda-mosaic", None)],
)
def test_front_ends_lower_at_production_shapes(platform, device_kind):
    """Lowering only (no hardware): GPT-OSS-like decode, batch 8, 8 KV heads x 8, head dim 128
    (the extend kernel has no Mosaic GPU front end: Triton on every GPU)."""
    import functools

    import jax

    s = jax.ShapeDtypeStruct
    b, hkv, g, d, ps, pages, cols = 8, 8, 8, 128, 16, 512, 64
    pool = s((pages, ps, hkv, d), jnp.bfloat16)
    small = (s((b, cols), jnp.int32), s((b,), jnp.int32), s((b,), jnp.int32))
    _export(
        paged_decode, (s((b, hkv, g, d), jnp.bfloat16), pool, pool, *small), platform, device_kind
    )
    if platform == "cuda-mosaic":
        return
    blocks = tuple(s((b,), jnp.int32) for _ in range(3))
    extend = functools.partial(ragged_extend, g=g)
    _export(
        extend,
        (s((b, hkv, 16 * g, d), jnp.bfloat16), pool, pool, *small[:2], *blocks),
        platform,
        device_kind,
    )


@pytest.mark.parametrize(
    "attention, backend, expected",
    [
        ("auto", "cpu", ("xla", False)),
        ("auto", "gpu", ("pallas", False)),
        ("auto", "tpu", ("pallas", False)),
        ("pallas", "cpu", ("pallas", True)),  # the interpreter: only where kernels cannot compile
        ("pallas", "gpu", ("pallas", False)),
        ("pallas", "tpu", ("pallas", False)),
        ("xla", "tpu", ("xla", False)),
    ],
)
def test_the_engine_runs_compiled_kernels_on_accelerators(attention, backend, expected):
    """The engine's attention: the compiled Pallas kernels on GPU / TPU by default, never the
    interpreter there (it once ran the interpreter on every backend), XLA on CPU."""
    from swajax.api.engine_spec import attention_path

    assert attention_path(attention, backend) == expected


def test_the_default_engine_on_cpu_runs_the_xla_path():
    from swajax.api import EngineSpec, make_engine
    from swajax.demo import demo_decoder

    engine = make_engine(demo_decoder(), EngineSpec.of(kv_budget_gib=0.01, max_context=64))
    assert EngineSpec().attention == "auto"
    assert (engine.model.implementation, engine.model.interpret) == ("xla", False)
    with pytest.raises(ValueError, match="attention must be one of"):
        make_engine(demo_decoder(), EngineSpec.of(attention="cuda", kv_budget_gib=0.01))
