"""Pallas kernels on their own: references, validation, the TPU interpreter's race detector,
lowering for real devices. The cases shared with the XLA path are in test_implementations.py."""

import jax.numpy as jnp
import numpy as np
import pytest

from swajax.config import LayerKind, LayerSpec
from swajax.kernels.paged_decode import paged_decode, paged_decode_reference
from swajax.kernels.ragged_extend import ragged_extend

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


def _export(fn, args, platform, device_kind=None):
    import functools

    import jax
    from jax import export

    f = jax.jit(
        functools.partial(
            fn, kind="sliding", window=128, scale=0.1, backend="tpu" if platform == "tpu" else "gpu"
        )
    )
    if platform == "tpu":
        from jax.sharding import AbstractDevice, AbstractMesh

        device = AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")
        with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
            return export.export(f, platforms=["tpu"])(*args)
    check = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    return export.export(f, platforms=["cuda"], disabled_checks=[check])(*args)


@pytest.mark.parametrize(
    "platform, device_kind", [("tpu", "TPU v5 lite"), ("tpu", "TPU v6 lite"), ("cuda", None)]
)
def test_front_ends_lower_at_production_shapes(platform, device_kind):
    """Lowering only (no hardware): GPT-OSS-like decode, batch 8, 8 KV heads x 8, head dim 128."""
    import functools

    import jax

    s = jax.ShapeDtypeStruct
    b, hkv, g, d, ps, pages, cols = 8, 8, 8, 128, 16, 512, 64
    pool = s((pages, ps, hkv, d), jnp.bfloat16)
    small = (s((b, cols), jnp.int32), s((b,), jnp.int32), s((b,), jnp.int32))
    _export(
        paged_decode, (s((b, hkv, g, d), jnp.bfloat16), pool, pool, *small), platform, device_kind
    )
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
