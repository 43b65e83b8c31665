"""What XLA:CPU does with low-precision weights, at gpt-oss-20b's widths, on this machine.

    python benchmarks/cpu_products.py [--repeats 5] [--smoke]

Two tables. *Products*: x [rows, in] @ w in float32 / bfloat16 / float16, stored [in, out] or
[out, in], as one `dot_general` of w's dtype with float32 accumulation (what `layers._dot`
runs): its temporaries from XLA's own `memory_analysis()` (a widened copy of w shows there),
its time and the bytes of w read per second; then the same through `layers.dot` /
`layers.head_dot` (the engine's products). *MXFP4 values*: one expert's gate-up blocks
[5760, 90, 16] decoded to bfloat16 by multiplying floats and rounding (`_fp4` x `_e8m0`), by
writing the bits (`quantized._scaled_bits`, in 16-bit lanes) and by writing them in 32-bit
lanes (its form before 2026-12-06). *MXFP4 experts*: a block of rows times an expert through the
CPU kernel and through XLA's decode-then-multiply, by live rows. Best of `--repeats`,
interleaved.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from swajax.models import layers, quantized

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe import _best  # noqa: E402  (best of interleaved rounds, after one untimed)

F32 = jnp.float32


def _product(rows_out: bool):
    dims = (((1,), (1 if rows_out else 0,)), ((), ()))

    def product(x, w):
        return jax.lax.dot_general(
            x.astype(w.dtype), w, dims, precision=layers.HIGHEST, preferred_element_type=F32
        )

    return product


def products(hidden: int, out: int, repeats: int) -> None:
    print(f"jax {jax.__version__}: x [rows, {hidden}] @ w, {out} outputs")
    print("dtype     stored    rows  path    temp MiB      ms   GB/s of w")
    for dtype in (F32, jnp.bfloat16, jnp.float16):
        for rows_out in (False, True):
            shape = (out, hidden) if rows_out else (hidden, out)
            w = jnp.zeros(shape, dtype)
            mib = w.size * w.dtype.itemsize
            for rows in (1, 2, 8):
                x = jnp.ones((rows, hidden), F32)
                for path, fn in (("one", _product(rows_out)), ("ours", _ours(rows_out))):
                    compiled = jax.jit(fn).lower(x, w).compile()
                    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
                    s = _best({"": functools.partial(compiled, x, w)}, repeats)[""]
                    print(
                        f"{jnp.dtype(dtype).name:9s} {'[out,in]' if rows_out else '[in,out]'}"
                        f"  {rows:4d}  {path:5s} {temp:9.1f} {s * 1e3:8.2f} {mib / s / 1e9:8.1f}"
                    )
            del w


def _ours(rows_out: bool):
    """The engine's product (`layers.dot`: a zero companion row, column tiles)."""
    return lambda x, w: layers.dot(x, w, w_rows_out=rows_out)


def bits_in_32_bit_lanes(codes, scales):
    """`quantized._scaled_bits` for bfloat16 as it was before 2026-12-06, for comparison: the
    exponent and mantissa fields computed apart, in 32-bit lanes."""
    c, s = codes.astype(jnp.int32), scales.astype(jnp.int32)
    e, m = (c >> 1) & 3, c & 1
    exponent = jnp.where(e == 0, jnp.where(m == 1, s - 1, 0), e + s - 1)
    bits = (exponent << 7) | jnp.where(e == 0, 0, m << 6)
    bits = jnp.where((exponent <= 0) | (s == 0), 0, bits)
    bits = jnp.where(exponent >= 255, 255 << 7, bits)
    sign = (c >> 3) << 15
    return jax.lax.bitcast_convert_type((bits | sign).astype(jnp.uint16), jnp.bfloat16)


def mxfp4_values(rows: int, groups: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    blocks = jnp.asarray(rng.integers(0, 256, (rows, groups, 16), dtype=np.uint8))
    scales = jnp.asarray(rng.integers(100, 140, (rows, groups), dtype=np.uint8))[..., None]

    def floats(b, s):
        return tuple(
            (quantized._fp4(c) * quantized._e8m0(s)).astype(jnp.bfloat16) for c in (b & 15, b >> 4)
        )

    def bits(b, s):
        return tuple(quantized._scaled_bits(c, s, jnp.bfloat16) for c in (b & 15, b >> 4))

    def wide_bits(b, s):
        return tuple(bits_in_32_bit_lanes(c, s) for c in (b & 15, b >> 4))

    fns = {
        "multiply and round": jax.jit(floats),
        "bits": jax.jit(bits),
        "bits, 32-bit lanes": jax.jit(wide_bits),
    }
    want = fns["multiply and round"](blocks, scales)
    same = all(
        np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
        for name in ("bits", "bits, 32-bit lanes")
        for a, b in zip(fns[name](blocks, scales), want)
    )
    print(f"MXFP4 [{rows}, {groups}, 16] to bfloat16 (the same bits: {same}):")
    best = _best({name: functools.partial(fn, blocks, scales) for name, fn in fns.items()}, repeats)
    for name, s in best.items():
        print(f"  {name:20s} {s * 1e3:7.2f} ms")


def mxfp4_experts(experts: int, out: int, groups: int, repeats: int) -> None:
    """One [rows, in] block times an MXFP4 expert, as the routed loop runs it: through the
    CPU kernel (`swajax.kernels.mxfp4_cpu`) and through XLA's decode-then-multiply (the loop's
    path without it), by live rows. Each call reads the next of `experts` experts, so the
    weights come from memory, not the cache, as in a decode step."""
    from swajax.kernels import mxfp4_cpu
    from swajax.models import experts as ex

    rng = np.random.default_rng(0)
    blocks = jnp.asarray(rng.integers(0, 256, (experts, out, groups, 16), dtype=np.uint8))
    scales = jnp.asarray(rng.integers(118, 126, (experts, out, groups), dtype=np.uint8))
    w = quantized.Mxfp4(blocks, scales, jnp.bfloat16)
    mb = (blocks.size + scales.size) / experts / 1e6
    print(f"MXFP4 experts [{out}, {groups * 32}] ({mb:.1f} MB each), bfloat16 rows, cold:")
    if not mxfp4_cpu.available():
        print(f"  (the kernel is not available: {mxfp4_cpu.unavailable_reason()})")
        return
    kernel_rows = ex.KERNEL_ROWS

    def sweep(x, live):  # traced once per path (each `jax.jit(sweep)` below is its own)
        def one(i, acc):
            return acc + ex.expert_product(x, w, i, "out", live=live)

        return jax.lax.fori_loop(0, experts, one, jnp.zeros((x.shape[0], out), F32))

    print(f"  (the engine's blocks of at most {kernel_rows} rows take the kernel)")
    print("  live rows   kernel ms   GB/s   XLA ms   GB/s")
    for live in (1, 4, 8, 16):
        x = jnp.asarray(rng.normal(size=(16, groups * 32)), jnp.bfloat16)
        live = jnp.int32(live)
        times = {}
        for name, rows in (("kernel", x.shape[0]), ("xla", 0)):  # forced either way
            ex.KERNEL_ROWS = rows
            try:
                times[name] = jax.jit(lambda x, live: sweep(x, live)).lower(x, live).compile()
            finally:
                ex.KERNEL_ROWS = kernel_rows
        best = _best(
            {n: functools.partial(f, x, jnp.int32(live)) for n, f in times.items()}, repeats
        )
        k, x_ = best["kernel"] / experts, best["xla"] / experts
        print(
            f"  {live:9d} {k * 1e3:10.2f} {mb / k / 1e3:6.1f} {x_ * 1e3:8.2f} {mb / x_ / 1e3:6.1f}"
        )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny shapes (tests)")
    a = p.parse_args(argv)
    if a.smoke:
        products(64, 96, 1)
        mxfp4_values(8, 2, 1)
        mxfp4_experts(2, 64, 2, 1)
        return
    products(2880, 5760, a.repeats)
    mxfp4_values(5760, 90, a.repeats)
    mxfp4_experts(48, 5760, 90, a.repeats)  # 48 x 8.8 MB: past the 300 MB last-level cache


if __name__ == "__main__":
    main()
