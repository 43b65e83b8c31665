"""The MXFP4 CPU kernel (`swajax.kernels.mxfp4_cpu`) against the dequantized weight in numpy,
value for value against the decode XLA runs, and where the routed experts use it."""

from __future__ import annotations

import os
import platform as platform_module
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swajax import platform
from swajax.kernels import mxfp4_cpu
from swajax.models import experts as ex, quantization, quantized

if mxfp4_cpu._compiler() is None:  # a machine without one runs XLA's path (tested below)
    pytest.skip("no C++ compiler to build the CPU kernel with", allow_module_level=True)


@pytest.fixture(autouse=True)
def _built():
    assert mxfp4_cpu.available(), mxfp4_cpu.unavailable_reason()


def _stack(rng, lead, n, groups, scales=(110, 140)):
    blocks = rng.integers(0, 256, (*lead, n, groups, 16), dtype=np.uint8)
    scale = rng.integers(*scales, (*lead, n, groups), dtype=np.uint8)
    return blocks, scale


# Shapes that differ in every way: no leading axis and two, one block of inputs and several, an
# output or two and enough to split over threads with a remainder, live rows none, some, all.
@pytest.mark.parametrize(
    ("lead", "index", "n", "groups", "m", "live"),
    [
        ((), (), 1, 1, 1, 1),
        ((3,), (2,), 7, 3, 5, 5),
        ((2, 3), (1, 0), 300, 2, 9, 4),
        ((2, 2), (0, 1), 1030, 5, 4, 3),
        ((4,), (1,), 513, 1, 17, 0),
        ((4,), (9,), 20, 2, 2, 2),  # clamped into the stack, as a dynamic slice is
        ((3,), (1,), 40, 90, 6, 6),  # gpt-oss-20b's inputs (2880), rows past one tile
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bfloat16: its own path
def test_rows_times_a_matrix_of_the_stack_equal_numpy(lead, index, n, groups, m, live, dtype):
    rng = np.random.default_rng(sum(lead) + n + m)
    blocks, scales = _stack(rng, lead, n, groups)
    x = jnp.asarray(rng.standard_normal((m, groups * 32)), dtype)
    at = tuple(min(i, d - 1) for i, d in zip(index, lead, strict=True))
    w = quantization.mxfp4(blocks[at], scales[at], np.float32).astype(np.float64)  # [K, N]
    got = np.asarray(jax.jit(mxfp4_cpu.mxfp4_rows)(x, blocks, scales, jnp.asarray(index), live))
    x = np.asarray(x, np.float64)
    want = x @ w
    bound = 1e-6 * (np.abs(x) @ np.abs(w)) + 1e-30
    assert np.all(np.abs(got[:live] - want[:live]) <= bound[:live])
    assert not np.any(got[live:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_code_at_every_scale_equals_xlas_decode(dtype):
    """One-hot rows read single weights: each is the value XLA's decode writes, bit for bit,
    at every code and at scales from 0 (zeros) through the subnormal edge to the largest
    finite values."""
    scales = np.array([0, 1, 2, 3, 100, 127, 200, 252], np.uint8)  # 252: 6 x 2^125, finite
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every (low, high) nibble pair
    # Two blocks of inputs per output (the bfloat16 path's pair; rows of one block take its
    # float32 tail): the second block holds the codes reversed, under the next scale.
    blocks = np.stack([codes, codes[::-1, ::-1]], axis=1)  # [N, 2, 16]
    blocks = np.stack([blocks] * len(scales))  # [S, N, 2, 16]
    pair = np.stack([scales, np.roll(scales, -1)], axis=-1)  # [S, 2]
    scale = np.broadcast_to(pair[:, None, :], (len(scales), 16, 2)).copy()
    for groups in (1, 2):
        x = jnp.eye(32 * groups, dtype=dtype)  # one-hot rows in the weight's dtype
        b, sc = blocks[:, :, :groups].copy(), scale[:, :, :groups].copy()
        w = quantized.Mxfp4(jnp.asarray(b), jnp.asarray(sc), dtype)
        for s in range(len(scales)):
            got = jax.jit(mxfp4_cpu.mxfp4_rows)(x, b, sc, jnp.asarray([s]), 32 * groups)
            want = jax.jit(lambda w: w.dense().astype(jnp.float32))(w[s])
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), f"{groups} {s}")


def _moe(rng, e=4, h=64, f=96):
    def mxfp4(din, dout):
        blocks, scales = _stack(rng, (e,), dout, din // 32, (118, 124))
        return quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), "bfloat16")

    bias = rng.normal(size=(e, 2 * f)).astype(np.float32), rng.normal(size=(e, h))
    return ex.Experts(mxfp4(h, 2 * f), jnp.asarray(bias[0]), mxfp4(f, h), jnp.asarray(bias[1]))


def _act(g):
    return jax.nn.silu(g[..., 0::2]) * g[..., 1::2]


def _routed(experts, t, valid=None):
    rng = np.random.default_rng(t)
    x = jnp.asarray(rng.normal(size=(t, experts.w1.shape[1])), jnp.bfloat16)
    ids = jnp.asarray(rng.integers(0, experts.count, (t, 2)), jnp.int32)
    routing = ex.Routing(ids, None, jnp.full((t, 2), 0.5, jnp.float32), valid)
    return jax.jit(lambda x, w: ex.routed(x, routing, w, _act)), x


def test_decode_blocks_run_the_kernel_and_prefill_blocks_do_not():
    experts = _moe(np.random.default_rng(0))
    name = mxfp4_cpu.target_name()
    decode, x = _routed(experts, 8)  # 16 pairs over 4 experts: blocks of 8 rows
    assert name in decode.lower(x, experts).as_text()
    prefill, x = _routed(experts, 200)  # blocks of 128 rows
    assert name not in prefill.lower(x, experts).as_text()
    with platform.lowering_for("tpu"):  # traced afresh: jit's cache does not see the target
        decode, x = _routed(experts, 8)
        assert "mxfp4_rows" not in decode.lower(x, experts).as_text()


@pytest.mark.parametrize("t", [1, 8])
def test_routed_experts_through_the_kernel_equal_xlas_path(monkeypatch, t):
    """The same block loop with and without the kernel (its padding rows, past the live ones,
    are not computed: their outputs are never read)."""
    experts = _moe(np.random.default_rng(1))
    valid = jnp.arange(t) < max(1, t - 3)
    run, x = _routed(experts, t, valid)
    got = np.asarray(run(x, experts), np.float32)
    monkeypatch.setattr(ex, "KERNEL_ROWS", 0)
    run, x = _routed(experts, t, valid)
    assert mxfp4_cpu.target_name() not in run.lower(x, experts).as_text()
    want = np.asarray(run(x, experts), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_without_a_compiler_xlas_path_runs(monkeypatch, tmp_path):
    """No compiler (or `SWAJAX_CPU_KERNELS=off`): not available, with the reason, and the
    experts run through XLA's decode."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    mxfp4_cpu._target.cache_clear()
    try:
        assert not mxfp4_cpu.available()
        assert "no-such-compiler" in mxfp4_cpu.unavailable_reason()
        run, x = _routed(_moe(np.random.default_rng(2)), 1)
        assert "mxfp4_rows" not in run.lower(x, _moe(np.random.default_rng(2))).as_text()
        monkeypatch.setenv(mxfp4_cpu.ENV, "off")
        mxfp4_cpu._target.cache_clear()
        assert mxfp4_cpu.unavailable_reason() == "SWAJAX_CPU_KERNELS=off"
    finally:
        mxfp4_cpu._target.cache_clear()
        monkeypatch.undo()
    assert mxfp4_cpu.available()


@pytest.mark.skipif(platform_module.machine() != "x86_64", reason="an x86-64 build option")
def test_the_portable_path_passes_the_same_tests():
    """Built for plain x86-64 (no AVX-512: what such a CPU compiles), the kernel passes the
    comparisons with numpy and with XLA's decode, in a process of its own."""
    env = {**os.environ, mxfp4_cpu.ARCH_ENV: "x86-64"}
    select = "numpy or every_code"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    done = subprocess.run(
        [*command, "-k", select], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]  # 5: none ran


CHECK = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING)
from swajax.kernels import mxfp4_cpu as k

lib = Path(sys.argv[1])
print(k.available(), k._verified(lib), k.unavailable_reason(), flush=True)
"""


def test_a_damaged_cached_kernel_is_rebuilt_never_loaded(tmp_path):
    """Between runs, the cached library cut in half (loading it would kill the process with
    SIGBUS), garbage, empty or another file: the next process rebuilds it and lives; a folder
    in its place is refused with a warning naming it; `none` turns the kernel off. A stand-in
    compiler copies the real build, so each rebuild is instant."""
    real, _ = mxfp4_cpu._build(mxfp4_cpu._compiler())
    fake = tmp_path / "fake-c++"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo fake 1; exit 0; fi\n'
        'while [ "$#" -gt 1 ]; do if [ "$1" = -o ]; then cp "'
        + str(real)
        + '" "$2"; exit 0; fi; shift; done\nexit 1\n'
    )
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "CXX": str(fake)}
    env.pop(mxfp4_cpu.ENV, None)

    def run(lib, **extra):
        done = subprocess.run(
            [sys.executable, "-c", CHECK, str(lib)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1], done.stderr

    folder = cache / "swajax" / "cpu-kernels"
    line, _ = run(folder / "none-yet.so")
    assert line.startswith("True")
    (lib,) = folder.glob("*.so")
    good = lib.read_bytes()
    for kind, data in [
        ("truncated", good[: len(good) // 2]),
        ("garbage", os.urandom(len(good))),
        ("empty", b""),
        ("foreign", Path(np.__file__).read_bytes()),
    ]:
        lib.write_bytes(data)
        line, err = run(lib)
        assert line.startswith("True True"), (kind, line, err)
        assert "does not match its recorded size and hash" in err and lib.read_bytes() == good
    lib.unlink()
    lib.mkdir()
    line, err = run(lib)
    assert line.startswith("False False") and str(lib) in line and str(lib) in err
    line, _ = run(lib, **{mxfp4_cpu.ENV: "none"})
    assert line == "False False SWAJAX_CPU_KERNELS=none"
