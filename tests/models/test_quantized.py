"""Dequantizing inside the jit (`swajax.models.quantized`) equals the load-time numpy
dequantizers of `swajax.models.quantization`, which the fixtures check against transformers."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from swajax.models import experts as ex, quantization, quantized, tensor_split
from swajax.models.weights import interleave_halves


def test_mxfp4_every_code_and_scale_equals_the_load_path():
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 5, 2, 16), dtype=np.uint8)
    blocks[0, 0, 0] = np.arange(16, dtype=np.uint8) * 17  # every (low, high) code pair
    scales = rng.integers(100, 140, (3, 5, 2), dtype=np.uint8)
    scales[0, 0] = [2, 252]  # the extremes that stay normal and finite times 6
    want = quantization.mxfp4(blocks, scales, np.float32)  # [3, 64, 5]
    w = quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), "float32")
    assert w.shape == want.shape
    np.testing.assert_array_equal(np.asarray(jax.jit(w.dense)()), want)
    np.testing.assert_array_equal(np.asarray(w[1].dense()), want[1])
    x = rng.normal(size=(7, 64)).astype(np.float32)
    got = np.asarray(quantized.matmul(jnp.asarray(x), w[2]))
    np.testing.assert_allclose(got, x.astype(np.float64) @ want[2], rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_mxfp4_values_of_every_code_at_every_scale(dtype):
    """The values the products read, written as bits (float32, bfloat16) or multiplied
    (float16), against numpy's exact product rounded to `dtype`: every code at every scale
    (255 is refused at load). Results below float32's normal range, and every result of the
    subnormal scale 0, are zero, and past the dtype's range infinite (refused at load too), as
    the float product on CPU (which flushes subnormals) gives them."""
    codes = np.arange(256, dtype=np.uint8)  # every (low, high) pair of codes
    blocks = np.broadcast_to(codes.reshape(16, 16), (255, 16, 16)).reshape(255, 1, 1, 256)
    blocks = np.ascontiguousarray(blocks.reshape(255, 16, 1, 16))
    scales = np.broadcast_to(np.arange(255, dtype=np.uint8)[:, None, None], (255, 16, 1))
    even, odd = jax.jit(quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), dtype).halves)()
    magnitude = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    table = np.concatenate([magnitude, -magnitude])
    scale = np.ldexp(1.0, np.arange(255) - 127)[:, None, None]
    for got, nibbles in ((even, blocks & 15), (odd, blocks >> 4)):
        want = table[nibbles.reshape(255, 16, 16)] * scale
        flushed = (np.abs(want) < np.finfo(np.float32).tiny) | (scale == scale[0])
        with np.errstate(over="ignore"):
            want = np.where(flushed, 0 * want, want).astype(np.float32).astype(dtype)
        got = np.asarray(got).reshape(255, 16, 16)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize(
    "shape, block", [((48, 32), (16, 16)), ((40, 24), (16, 16)), ((24, 20), (24, 20))]
)
def test_block_fp8_equals_the_load_path(shape, block):
    """[out, in] float8 with a (bm, bn) grid, blocks that do not divide evenly included."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=shape).astype(ml_dtypes.float8_e4m3fn)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    s = rng.uniform(0.01, 2, grid).astype(np.float32)
    want = quantization.block_fp8(w, s, block, np.float32).T  # [in, out]
    q = quantized.BlockFp8(jnp.asarray(w.T), jnp.asarray(s.T[:, None, :]), block, "float32")
    np.testing.assert_array_equal(np.asarray(q.dense()), want)


def test_paired_fp8_expands_each_halfs_own_grid_interleaved():
    """Gate and up quantized apart, their columns interleaved at load: the expansion
    interleaves the two grids the same way."""
    rng = np.random.default_rng(2)
    block, (i, h) = (16, 16), (24, 32)
    halves = [rng.normal(size=(i, h)).astype(ml_dtypes.float8_e4m3fn) for _ in range(2)]
    grids = [rng.uniform(0.1, 2, (2, 2)).astype(np.float32) for _ in range(2)]
    deq = [quantization.block_fp8(w, s, block, np.float32).T for w, s in zip(halves, grids)]
    want = interleave_halves(np.concatenate(deq, axis=-1))  # [h, 2i]
    weight = interleave_halves(np.concatenate([w.T for w in halves], axis=-1))
    scale = np.stack([s.T for s in grids], axis=1)  # [gin, 2, gout]
    q = quantized.BlockFp8(jnp.asarray(weight), jnp.asarray(scale), block, "float32")
    np.testing.assert_array_equal(np.asarray(q.dense()), want)


# 48 * 256 bytes, chunks along the hidden axis (64): w1 [64, 128] 24 float input rows at a time
# (64 = 2 x 24 + 16), w2 [64, 64] 48 output columns at a time (64 = 48 + 16), MXFP4 or float;
# an MXFP4 w1 48 of its outputs at a time (128 = 2 x 48 + 32) unless they are split.
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 48 * 256])
def test_routed_experts_over_mxfp4_equal_the_dense_reference(monkeypatch, chunk_bytes, split):
    if chunk_bytes:
        monkeypatch.setattr(ex, "CHUNK_BYTES", chunk_bytes)
        assert [ex.k_rows(64, 128, 4), ex.k_rows(64, 64, 4), ex.k_rows(128, 64, 4)] == [24, 48, 48]
    rng = np.random.default_rng(3)
    e, h, t, k = 4, 64, 9, 2

    def mxfp4(din, dout):
        blocks = rng.integers(0, 256, (e, dout, din // 32, 16), dtype=np.uint8)
        scales = np.full((e, dout, din // 32), 121, np.uint8)
        return quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), "float32")

    packed = ex.Experts(mxfp4(h, 2 * h), None, mxfp4(h, h), None)
    plain = packed._replace(w1=packed.w1.dense(), w2=packed.w2.dense())
    x = jnp.asarray(rng.normal(size=(t, h)), jnp.float32)
    idx = jnp.asarray(rng.permuted(np.tile(np.arange(e), (t, 1)), axis=1)[:, :k], jnp.int32)
    routing = ex.Routing(idx, None, jnp.full((t, k), 0.5, jnp.float32))

    def act(g):
        return jax.nn.silu(g[..., 0::2]) * g[..., 1::2]

    want = np.asarray(ex.dense(x, routing, plain, act))

    def routed(x, w):
        with tensor_split.split_over_devices(split):
            return ex.routed(x, routing, w, act)

    for weights in (packed, plain):
        got = np.asarray(jax.jit(routed)(x, weights))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_split_mxfp4_experts_are_never_gathered():
    """Tensor parallel splits w1's outputs over the devices: its chunks then run along the
    hidden axis (MXFP4: it runs whole), never slicing the split axis, which XLA would gather
    (the contrast: the same program traced as if unsplit)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from swajax.memory.mesh_axis import AXIS
    from swajax.models.sharding import kv_mesh

    mesh, (e, h, f) = kv_mesh(2), (4, 256, 256)
    rng = np.random.default_rng(4)

    def put(a, *spec):
        return jax.device_put(jnp.asarray(a), NamedSharding(mesh, P(*spec)))

    def mxfp4(din, dout, axis):  # as `sharding.PARAM_SPECS` splits gate_up / down blocks
        split = [None, None, None, None]
        split[axis] = AXIS
        blocks = put(rng.integers(0, 256, (e, dout, din // 32, 16), np.uint8), *split)
        return quantized.Mxfp4(
            blocks, put(np.full((e, dout, din // 32), 121, np.uint8), *split[:3]), "bfloat16"
        )

    weights = ex.Experts(mxfp4(h, 2 * f, 1), None, mxfp4(f, h, 2), None)
    x, ids = put(rng.normal(size=(3, h)).astype(np.float32)), put(np.arange(6).reshape(3, 2) % e)
    routing = ex.Routing(ids.astype(jnp.int32), None, put(np.full((3, 2), 0.5, np.float32)))

    def gathers(split):
        def routed(x, w):
            with tensor_split.split_over_devices(split):
                return ex.routed(x, routing, w, lambda g: jax.nn.silu(g[:, 0::2]) * g[:, 1::2])

        return jax.jit(routed).lower(x, weights).compile().as_text().count("all-gather")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ex, "CHUNK_BYTES", 64 * 256)  # several chunks at these widths
        assert gathers(True) == 0
        assert gathers(False) > 0
