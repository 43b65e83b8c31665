"""Compiled step programs on disk (runner/program_store.py): a warm start loads them instead of
tracing; a key follows the static arguments and the input shapes; an entry that does not load
is compiled afresh and replaced; what a loaded program computes is what a traced one does."""

import functools
import json
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swajax.kernels import mxfp4_cpu
from swajax.runner import program_store
from swajax.runner.program_store import ProgramStore


@functools.partial(jax.jit, static_argnames="power", donate_argnums=0)
def _step(x, y, *, power):
    return x**power + y, jnp.sum(y)


def _store(folder):
    return ProgramStore(folder, jax.devices()[0])


def _args(n=4):
    return jnp.arange(n, dtype=jnp.float32), jnp.ones(n, jnp.float32)


def test_a_second_store_loads_what_the_first_compiled(tmp_path):
    first = _store(tmp_path)
    expected = [np.asarray(a) for a in first.call(_step, _args(), dict(power=2))]
    first.call(_step, _args(), dict(power=3))  # another static argument: another program
    _store(tmp_path).call(_step, _args(8), dict(power=2))  # another shape: another program
    assert first.saved == 2 and first.loaded == 0 and len(list(tmp_path.iterdir())) == 3
    del first
    program_store._IN_USE.clear()  # as in a fresh process
    second = _store(tmp_path)
    got = second.call(_step, _args(), dict(power=2))
    assert second.loaded == 1 and second.saved == 0
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    x, y = _args()
    second.call(_step, (x, y), dict(power=2))
    assert x.is_deleted()  # donation holds for a loaded program too


def test_a_runner_whose_shapes_change_gets_an_error_not_a_wrong_result(tmp_path):
    """A runner looks its programs up by static arguments alone (its inputs keep their shapes):
    if that ever broke, the loaded program refuses the call."""
    store = _store(tmp_path)
    store.call(_step, _args(), dict(power=2))
    with pytest.raises(TypeError, match="compiled with float32\\[4\\]"):
        store.call(_step, _args(8), dict(power=2))


def test_an_entry_that_does_not_load_is_compiled_again_and_replaced(tmp_path):
    _store(tmp_path).call(_step, _args(), dict(power=2))
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(b"not a program")
    program_store._IN_USE.clear()
    again = _store(tmp_path)
    out, _ = again.call(_step, _args(), dict(power=2))
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 5, 10])
    assert again.loaded == 0 and again.saved == 1 and entry.read_bytes() != b"not a program"


def test_programs_past_the_live_limit_are_dropped_and_read_back_not_compiled(tmp_path):
    """Compiled executables hold memory maps (a server's mixed load ran out of them): a store
    keeps `max_live` alive, the least recently used going first, and reads a dropped one back
    from its folder."""
    store = ProgramStore(tmp_path, jax.devices()[0], max_live=2)
    for power in (2, 3, 2, 4):  # 2 is used again before 4 comes: 3 goes
        store.call(_step, _args(), dict(power=power))
    assert [k[1][1] for k in store.programs] == [2, 4]
    program_store._IN_USE.clear()  # nothing else holds the dropped one
    out, _ = store.call(_step, _args(), dict(power=3))
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 9, 28])
    assert store.compiled["_step"] == 3 and store.reused["_step"] == 1 and store.loaded == 1
    assert [k[1][1] for k in store.programs] == [4, 3]


def test_without_a_folder_programs_are_plain_jit_calls():
    store = _store(None)
    out, total = store.call(_step, _args(), dict(power=2))
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 5, 10])
    assert float(total) == 4 and store.saved == store.loaded == 0


def test_a_warm_cli_run_loads_its_step_programs_and_generates_the_same(tmp_path):
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "swajax", "generate", "--prompt-ids", "1,2,3,4,5"]
    argv += ["--max-tokens", "12", "--json"]

    def run():
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        lines = [json.loads(line) for line in out.stdout.strip().splitlines()]
        return lines[0], lines[-1]["summary"]

    (cold, cold_summary), (warm, warm_summary) = run(), run()
    assert cold_summary["programs_loaded"] == 0
    assert warm_summary["programs_loaded"] >= 2  # prefill and decode: neither traced
    assert warm_summary["compilations"] == 0
    assert warm == cold


@functools.partial(jax.jit, static_argnames="power")
def _other(x, y, *, power):
    return x**power - y


def test_a_program_already_in_jaxs_cache_is_stored_whole(tmp_path):
    """On CPU an executable loaded from JAX's persistent cache serializes without its code (it
    loads, then fails at its first call); the store compiles its programs afresh instead."""
    from jax.experimental.compilation_cache import compilation_cache

    from swajax import compile_cache

    before = jax.config.jax_compilation_cache_dir
    compile_cache.enable(tmp_path / "jax")
    try:
        x, y = _args()
        expected = np.asarray(_other(x, y, power=3))  # compiled, written to JAX's cache
        jax.clear_caches()  # as in a later process: the next compile would read that entry
        store = _store(tmp_path / "programs")
        store.call(_other, (x, y), dict(power=3))
        assert store.saved == 1
        program_store._IN_USE.clear()
        again = _store(tmp_path / "programs")
        out = again.call(_other, (x, y), dict(power=3))
        np.testing.assert_array_equal(np.asarray(out), expected)
        assert again.loaded == 1
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


def test_the_store_follows_the_compilation_cache_and_its_switch(monkeypatch, tmp_path):
    from swajax.runner.program_store import store_folder

    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert store_folder() == tmp_path / "swajax-programs"
        monkeypatch.setenv("SWAJAX_PROGRAM_STORE", "off")
        assert store_folder() is None
        monkeypatch.setenv("SWAJAX_PROGRAM_STORE", "on")
        jax.config.update("jax_compilation_cache_dir", None)
        assert store_folder() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_keys_cover_the_package_and_its_kernels():
    from swajax.runner.program_store import source_files

    names = {path.name for _, path in source_files()}
    assert {"program_store.py", "allocator.py", "paged_decode.py", "ragged_extend.py"} <= names


class _Opaque:  # hashable, with the default repr (a memory address)
    pass


@functools.partial(jax.jit, static_argnames="tag")
def _tagged(x, *, tag):
    return x + 1


def test_a_static_argument_without_a_stable_text_is_not_stored(tmp_path):
    store = _store(tmp_path)
    out = store.call(_tagged, (jnp.ones(2),), dict(tag=_Opaque()))
    np.testing.assert_array_equal(np.asarray(out), [2, 2])
    assert store.saved == 0 and not list(tmp_path.iterdir())


_KERNEL_PROGRAM = """
import pathlib, sys, jax, jax.numpy as jnp, numpy as np
from swajax.kernels import mxfp4_cpu
from swajax.runner.program_store import ProgramStore

@jax.jit
def rows(x, blocks, scales):
    return mxfp4_cpu.mxfp4_rows(x, blocks, scales, jnp.zeros(1, jnp.int32), 2)

rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(2, 64)), jnp.float32)
blocks = jnp.asarray(rng.integers(0, 256, (1, 8, 2, 16), dtype=np.uint8))
store = ProgramStore(pathlib.Path(sys.argv[1]), jax.devices()[0])
out = store.call(rows, (x, blocks, jnp.full((1, 8, 2), 127, jnp.uint8)), {})
print(store.loaded, store.saved, np.asarray(out).tobytes().hex())
"""


@pytest.mark.skipif(mxfp4_cpu._compiler() is None, reason="no C++ compiler for the CPU kernel")
def test_a_stored_program_that_calls_the_cpu_kernel(tmp_path):
    """A fresh process loads it (the key's lookup registers the kernel first) and gets the same
    result; an entry recorded with another build of the kernel is compiled afresh."""

    def run():
        argv = [sys.executable, "-c", _KERNEL_PROGRAM, str(tmp_path)]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()

    cold, warm = run(), run()
    assert cold[:2] == ["0", "1"] and warm == ["1", "0", cold[2]]
    (entry,) = tmp_path.iterdir()
    *program, kernels = pickle.loads(entry.read_bytes())
    assert kernels == [mxfp4_cpu.target_name()]
    entry.write_bytes(pickle.dumps((*program, [mxfp4_cpu.PREFIX + "0" * 16])))
    assert run() == ["0", "1", cold[2]]


def test_dropped_programs_give_their_memory_maps_back(tmp_path):
    """Each compile left its executable in JAX's caches, and its memory maps with it, until a
    server ran out of them: past `max_live` the store drops its oldest half and JAX's caches,
    so the maps stay bounded however many programs a run makes."""

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    store = ProgramStore(tmp_path, jax.devices()[0], max_live=4)
    for power in range(2, 12):
        store.call(_step, _args(), dict(power=power))
    settled = maps()
    for power in range(12, 42):
        store.call(_step, _args(), dict(power=power))
    assert len(store.programs) <= 4
    # Measured: flat with the drops; without them about 5 more maps per compile of this small
    # program (150 here), 18 for a larger one, hundreds for a model's step.
    assert maps() - settled < 40
