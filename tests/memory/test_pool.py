"""KV pools: routing through the layers mapping, per-kind shapes, the SWA-location error, slot 0."""

import jax.numpy as jnp
import numpy as np
import pytest

from swajax.memory import bits, pool as P
from swajax.presets import load_preset
from swajax.sizing import PoolSizes


def sizes(mode="hybrid", full=32, swa=16, ps=4):
    return PoolSizes(mode, full, swa, ps)


def test_mimo_per_kind_shapes():
    cfg = load_preset("tiny-mimo")  # FSSSSF: 2 full layers (1 KV head), 4 SWA (2 KV heads)
    pools = P.init_pools(cfg, sizes(), "fp32")
    # stored with a token's heads side by side, read per head
    assert pools.full_k.shape == (2, 36, 1 * 24) and pools.full_v.shape == (2, 36, 1 * 16)
    assert pools.swa_k.shape == (4, 20, 2 * 24) and pools.swa_v.shape == (4, 20, 2 * 16)
    assert pools.heads == (1, 2)
    assert [x.shape for x in pools.stacked(True)] == [(4, 20, 2, 24), (4, 20, 2, 16)]
    assert [x.shape for x in pools.stacked(False)] == [(2, 36, 1, 24), (2, 36, 1, 16)]
    assert pools.layers == ((0, False), (0, True), (1, True), (2, True), (3, True), (1, False))


def test_writes_route_by_layer_kind():
    cfg = load_preset("tiny-hybrid")  # SFSF, 2 KV heads, head dim 16
    pools = P.init_pools(cfg, sizes(), "fp32")
    k = jnp.ones((2, 2, 16))
    loc = P.KVWriteLoc(full=jnp.array([5, 6]), swa=jnp.array([9, 10]))
    pools = P.write_kv_jit(pools, 1, k, 2 * k, loc)  # full layer 1 -> full index 0
    pools = P.write_kv_jit(pools, 2, 3 * k, 4 * k, loc)  # SWA layer 2 -> SWA index 1
    full_k, full_v = pools.layer(1)
    swa_k, swa_v = pools.layer(2)
    assert np.asarray(full_k[5:7]).min() == 1 and np.asarray(full_v[5:7]).max() == 2
    assert np.asarray(swa_k[9:11]).min() == 3 and np.asarray(swa_v[9:11]).max() == 4
    assert np.asarray(pools.full_k).sum() == 2 * 2 * 16  # nothing else was written
    assert not np.asarray(pools.swa_k[0]).any()  # the other SWA layer untouched
    assert not np.asarray(pools.full_k[0, :5]).any() and not np.asarray(swa_k[:9]).any()


def test_swa_write_without_swa_location_fails_at_trace_time():
    cfg = load_preset("tiny-hybrid")
    pools = P.init_pools(cfg, sizes(), "fp32")
    k = jnp.ones((1, 2, 16))
    with pytest.raises(ValueError, match="layer 0 is an SWA layer"):
        P.write_kv_jit(pools, 0, k, k, P.KVWriteLoc(full=jnp.array([3])))
    P.write_kv_jit(pools, 1, k, k, P.KVWriteLoc(full=jnp.array([3])))  # full layers need none


def test_padding_writes_land_in_the_dummy_slot():
    cfg = load_preset("tiny-hybrid")
    pools = P.init_pools(cfg, sizes(), "fp32")
    k = jnp.arange(3 * 2 * 16, dtype=jnp.float32).reshape(3, 2, 16) + 1
    loc = P.KVWriteLoc(full=jnp.array([7, 0, 0]), swa=jnp.array([5, 0, 0]))
    pools = P.write_kv_jit(pools, 0, k, k, loc)
    swa_k, _ = pools.layer(0)
    np.testing.assert_array_equal(swa_k[5], k[0])
    assert np.count_nonzero(np.asarray(swa_k[1:5])) == 0 and np.count_nonzero(swa_k[6:]) == 0


@pytest.mark.parametrize(
    "dtype, jdtype", [("bf16", jnp.bfloat16), ("fp16", jnp.float16), ("fp32", jnp.float32)]
)
def test_modes_and_dtypes(dtype, jdtype):
    cfg = load_preset("tiny-hybrid")
    single = P.init_pools(cfg, sizes("single", 32, 32), dtype)
    assert single.full_k.shape[1] == single.swa_k.shape[1] == 36
    assert single.stacked(False)[0].dtype == jdtype  # read as its dtype
    # held as its bits where XLA:CPU would widen it (memory.bits), in the same bytes
    assert (
        single.full_k.dtype == bits.held(jdtype)
        and single.full_k.dtype.itemsize == jdtype(0).itemsize
    )
    all_swa = P.init_pools(load_preset("tiny-all-swa"), sizes("all_swa", 0, 16), dtype)
    assert all_swa.full_k.shape[0] == 0 and all_swa.swa_k.shape[:2] == (2, 20)
    with pytest.raises(ValueError, match="int8"):
        P.init_pools(cfg, sizes(), "int8")


def test_a_bfloat16_pool_is_written_and_read_as_bfloat16():
    """Held as bits on CPU (`memory.bits`), the pool still stores and returns bfloat16 values."""
    cfg = load_preset("tiny-hybrid")
    pools = P.init_pools(cfg, sizes(), "bf16")
    k = (jnp.arange(3 * 2 * 16, dtype=jnp.float32).reshape(3, 2, 16) / 7).astype(jnp.bfloat16)
    loc = P.KVWriteLoc(full=jnp.array([7, 0, 0]), swa=jnp.array([5, 0, 0]))
    pools = P.write_kv_jit(pools, 0, k, -k, loc)
    swa_k, swa_v = pools.layer(0)
    assert swa_k.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(swa_k[5], np.float32), np.asarray(k[0], np.float32))
    np.testing.assert_array_equal(np.asarray(swa_v[5], np.float32), -np.asarray(k[0], np.float32))
