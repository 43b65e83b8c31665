"""One upload per step: arrays of any 4-byte dtype pack into one int32 buffer and come back
bit for bit inside a jitted function."""

import jax
import numpy as np
import pytest

from swajax.runner.packing import pack, unpack


def test_round_trip_through_jit():
    arrays = {
        "rows": np.arange(8, dtype=np.int32),
        "count": np.int32(5),
        "temperature": np.array([0.0, 0.7, -1.5, np.inf], np.float32),
        "seeds": np.array([0, 1, 2**32 - 1], np.uint32),
        "table": np.arange(12, dtype=np.int32).reshape(3, 4),
    }
    flat, layout = pack(arrays)
    assert flat.dtype == np.int32 and flat.ndim == 1
    out = jax.jit(unpack, static_argnums=1)(jax.device_put(flat), layout)
    for name, value in arrays.items():
        got = np.asarray(out[name])
        assert got.dtype == np.asarray(value).dtype and got.shape == np.shape(value)
        np.testing.assert_array_equal(got, value)


def test_only_four_byte_dtypes_pack():
    with pytest.raises(TypeError, match="4-byte"):
        pack({"x": np.zeros(3, np.int64)})
