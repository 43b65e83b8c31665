"""The Pallas kernels through the whole TPU compiler (libtpu, compile-only devices: no TPU
needed): Mosaic lays out and compiles every kernel at the published families' attention shapes.
A compile proves Mosaic accepts a kernel, not that it is right: the interpret-mode tests against
the dense reference (test_kernels.py, test_implementations.py) stay the correctness check.

Default: a representative few on v6e and v5e. `pytest -m slow tests/attention/test_tpu_compile.py`:
every family's attention on v5e, v6e and v5p."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swajax import tpu
from swajax.kernels import common
from swajax.kernels.paged_decode import paged_decode, window_pages
from swajax.kernels.ragged_extend import ragged_extend

S = jax.ShapeDtypeStruct
F8 = jnp.float8_e4m3fn

# name: (dk, dv, G, Hkv, page size, kind, window, sinks, soft cap, KV dtype): each a published
# family's attention (per chip, one device), the windows as the kernels count them (W).
CASES = {
    "gpt-oss": (64, 64, 8, 8, 16, "sliding", 127, True, None, jnp.bfloat16),
    "gemma-3-27b": (128, 128, 2, 16, 64, "sliding", 1023, False, 50.0, jnp.bfloat16),
    "gemma-4-31b-global-k-eq-v": (512, 512, 8, 4, 128, "full", 0, False, None, jnp.bfloat16),
    "llama-4-scout-chunked": (128, 128, 5, 8, 16, "chunked", 8192, False, None, jnp.bfloat16),
    "mimo-v2-flash-swa-fp8": (192, 128, 8, 8, 64, "sliding", 127, True, None, F8),
    "step-3.5-flash": (128, 128, 12, 8, 128, "sliding", 511, False, None, jnp.bfloat16),
    "gemma-4-local-gqa16": (256, 256, 16, 2, 16, "sliding", 1023, False, None, jnp.bfloat16),
    "mqa-full-f32": (128, 128, 1, 1, 64, "full", 0, True, 30.0, jnp.float32),
}
DEFAULT = {
    ("v6e-1", "gpt-oss"),
    ("v6e-1", "llama-4-scout-chunked"),
    ("v5e-1", "mimo-v2-flash-swa-fp8"),
}
DEFAULT |= {("v6e-1", "gemma-4-31b-global-k-eq-v")}
SLICES = ("v5e-1", "v6e-1", "v5p-2")


def _matrix():
    for slice_name in SLICES:
        for name in CASES:
            slow = () if (slice_name, name) in DEFAULT else (pytest.mark.slow,)
            yield pytest.param(slice_name, name, marks=slow, id=f"{slice_name}-{name}")


@functools.cache
def _device(slice_name: str):
    return tpu.devices(tpu.parse_slice(slice_name))[0]


def _decode_args(case, batch=8, pages=512, cols=128):
    dk, dv, g, hkv, ps, _, _, sinks, _, kv = case
    return (
        S((batch, hkv, g, dk), jnp.bfloat16),
        S((pages, ps, hkv, dk), kv),
        S((pages, ps, hkv, dv), kv),
        S((batch, cols), jnp.int32),
        S((batch,), jnp.int32),
        S((batch,), jnp.int32),
        S((hkv, g), jnp.float32) if sinks else None,
    )


def _statics(case):
    _, _, _, _, _, kind, window, _, soft_cap, _ = case
    return dict(kind=kind, window=window, scale=0.125, soft_cap=soft_cap, backend="tpu")


@pytest.mark.parametrize("slice_name, name", list(_matrix()))
def test_both_kernels_compile_for_tpu(slice_name, name):
    case = CASES[name]
    dk, dv, g, hkv, ps, kind, window, sinks, soft_cap, kv = case
    device = _device(slice_name)
    decode = functools.partial(paged_decode, **_statics(case))
    compiled = tpu.compile_on(device, jax.jit(decode), *_decode_args(case))
    assert "swajax_paged_decode_tpu" in compiled.as_text()
    nb, bq = 16, 16
    q, k, v, table, first, _, sink = _decode_args(case, batch=4)
    blocks = (S((nb,), jnp.int32),) * 3
    extend = functools.partial(ragged_extend, g=g, **_statics(case))
    args = (S((nb, hkv, bq * g, dk), jnp.bfloat16), k, v, table, first, *blocks, sink)
    compiled = tpu.compile_on(device, jax.jit(extend), *args)
    assert "swajax_ragged_extend_tpu" in compiled.as_text()


def test_kernels_cost_what_their_window_reads():
    """The cost estimate each kernel gives XLA is what its grid reads: a sliding layer's decode
    reads the pages of its window whatever the table's width (a full layer reads the table);
    every page a sequence's index map selects is within the estimate, and a sequence whose
    window is whole reads exactly the estimate's pages. XLA's cost analysis of the compiled
    program takes the estimate's flops and exponentials."""
    case = CASES["gpt-oss"]
    dk, dv, g, hkv, ps, kind, window, *_ = case
    q, k, v, table, first, seq, sink = _decode_args(case)
    page_bytes = 2 * ps * hkv * dk * 2  # K and V, bfloat16
    steps = window_pages(kind, window, ps, table.shape[1])
    assert steps == -(-window // ps) + 1 < table.shape[1]
    cost = common.paged_cost(q, k, v, (table, first, seq), steps)
    io = 2 * q.size * 2 + sum(x.size * 4 for x in (table, first, seq))
    assert cost.bytes_accessed == q.shape[0] * steps * page_bytes + io
    wider = S((table.shape[0], 4 * table.shape[1]), jnp.int32)
    wide_cost = common.paged_cost(q, k, v, (wider, first, seq), steps)
    assert wide_cost.bytes_accessed - cost.bytes_accessed == (wider.size - table.size) * 4
    full_steps = window_pages("full", 0, ps, table.shape[1])
    assert common.paged_cost(q, k, v, (table, first, seq), full_steps).flops == (
        cost.flops * full_steps // steps
    )
    # the pages the kernel's grid reads, from its own window arithmetic
    from swajax.kernels.paged_decode import _window

    seqs = np.array([1, 5, ps, ps + 1, window, window + 1, 3 * window, 1000])
    fps = np.maximum((seqs - 1 - window) // ps, 0)
    _, _, lo_col, hi_col = _window(
        jnp.asarray(seqs), jnp.asarray(fps), np.arange(8), ps, 128, kind, window
    )
    read = np.asarray(hi_col) - np.asarray(lo_col) + 1
    assert (read <= steps).all() and read.max() == steps, read
    compiled = tpu.compile_on(
        _device("v6e-1"),
        jax.jit(functools.partial(paged_decode, **_statics(case))),
        q,
        k,
        v,
        table,
        first,
        seq,
        sink,
    )
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert analysis["flops"] >= cost.flops and analysis["transcendentals"] >= cost.transcendentals
    assert analysis["flops"] < 1.1 * cost.flops  # the kernel is nearly all of the program


def test_slices_are_named_as_cloud_tpu_names_them():
    assert tpu.parse_slice("v5e-4").chips == 4 and tpu.parse_slice("v5p-8").chips == 4
    assert tpu.parse_slice("V6E-1").name == "v6e-1"
    for bad, said in (
        ("v4-8", "generation"),
        ("v5e-3", "v5e-1, v5e-4"),
        ("v5p-3", "v5p-2"),
        ("tpu", "e.g. v6e-4"),
    ):
        with pytest.raises(ValueError, match=said):
            tpu.parse_slice(bad)


def test_sixteen_bit_expert_products_compile_for_tpu():
    """A routed-experts product of bfloat16 operands (`lax.ragged_dot`, Llama 4 Scout's width)
    at the precision the models ask for on TPU: at HIGHEST, XLA:TPU (libtpu 0.0.42) sends it
    through a Mosaic kernel that refuses it ("Bad lhs type"); exact in float32 either way."""
    from swajax import platform
    from swajax.models import quantized

    with platform.lowering_for("tpu"):
        assert quantized.precision(jnp.bfloat16) == jax.lax.Precision.DEFAULT
        assert quantized.precision(jnp.float32) == jax.lax.Precision.HIGHEST
    assert quantized.precision(jnp.bfloat16) == jax.lax.Precision.HIGHEST  # this CPU: as ever

    def grouped(x, w, sizes):
        with platform.lowering_for("tpu"):
            prec = quantized.precision(w.dtype)
        return jax.lax.ragged_dot(x, w, sizes, precision=prec, preferred_element_type=jnp.float32)

    args = (S((512, 5120), jnp.bfloat16), S((16, 5120, 1024), jnp.bfloat16), S((16,), jnp.int32))
    tpu.compile_on(_device("v6e-1"), jax.jit(grouped), *args)


def test_decode_reads_the_pools_as_they_lie():
    """A page's heads side by side ([pages, ps, Hkv * D], `memory.pool`) is the layout the
    pools are stored in and the one the TPU kernel reads: viewed per head in the program, as
    the model does, the views cancel and the compiled decode copies no pool (a pool passed in
    per head would be relaid out whole, 2 x 128 MiB here, at every call)."""
    dk, dv, g, hkv, ps, kind, window, sinks, soft_cap, kv = CASES["step-3.5-flash"]
    pages = 512
    q, _, _, table, first, seq, sink = _decode_args(CASES["step-3.5-flash"], pages=pages)

    def decode(q, k, v, *rest):
        shape = (pages, ps, hkv, dk)
        return paged_decode(
            q, k.reshape(shape), v.reshape(shape), *rest, **_statics(CASES["step-3.5-flash"])
        )

    flat = S((pages, ps, hkv * dk), kv)
    compiled = tpu.compile_on(
        _device("v6e-1"), jax.jit(decode), q, flat, flat, table, first, seq, sink
    )
    memory = compiled.memory_analysis()
    assert memory.temp_size_in_bytes < 2**20, memory
    assert memory.argument_size_in_bytes >= 2 * pages * ps * hkv * dk * 2
