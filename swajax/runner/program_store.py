"""Compiled step programs kept on disk, so that a warm start neither traces nor lowers them.

JAX's persistent compilation cache (`swajax.compile_cache`) skips XLA's compile on a warm start,
but not what comes before it and finds the cache entry: tracing the program in Python and
lowering it to StableHLO. For the fused step of a model (allocator, request table, metadata,
every layer, sampling) those two took longer than the whole rest of a warm `swajax generate`.
This store keeps each compiled step program itself (`jax.experimental.serialize_executable`)
in a folder beside the compilation cache, under a key computed without tracing: swajax's own
source, JAX's version, the device, the program, its static arguments (a model by its graph
definition, not its weights) and the shapes of its inputs. A warm start loads the executable
and calls it.

Within one runner a program's inputs have the same shapes at every call (the pools, the request
table and the weights are fixed; the packed upload's size follows its static layout), so a
runner looks its programs up by their static arguments alone and computes a disk key once per
program. A loaded program checks its inputs like any compiled one, so a wrong assumption is an
error, never a wrong result. Entries are written whole (a temporary file, then a rename), so
processes sharing the folder never read half an entry; one that does not load is compiled
afresh and replaced. Only single-device programs are stored.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pickle
import re
import tempfile
import typing
import weakref
from collections import Counter
from pathlib import Path

import jax
from jax.experimental import serialize_executable

from swajax.compile_cache import OFF, compile_uncached
from swajax.kernels import mxfp4_cpu

SUBFOLDER = "swajax-programs"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # the default repr of an object
ENV = "SWAJAX_PROGRAM_STORE"  # off / 0 / false / no: trace and compile through jit only
_log = logging.getLogger(__name__)
# Programs in use by any runner of this process, by disk key: a second engine over the same
# model reuses them as jit's own cache would. Weak: a program goes when its runners do (the
# test suite drops compiled programs between modules to stay within LLVM's memory maps).
_IN_USE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# Compiled programs a runner keeps alive at once, the least recently used going first. Every
# XLA:CPU executable holds memory maps; a server whose mixed load reached 112 step programs
# died when LLVM could map no more (vm.max_map_count, 65,530 by default: "LLVM compilation
# error: Cannot allocate memory", then SIGSEGV). A program dropped here is read back from the
# folder when it is needed again (milliseconds), not compiled.
MAX_LIVE_PROGRAMS = 32


def source_files() -> list[tuple[Path, Path]]:
    """(root, file) of every Python (and C++) file of the installed package and of its kernels
    (installed as `swajax.kernels`, from wherever they live)."""
    roots = [Path(__file__).resolve().parents[1]]  # the swajax package
    kernels = importlib.util.find_spec("swajax.kernels")  # found, not imported
    roots += [Path(p).resolve() for p in kernels.submodule_search_locations or ()]
    return [
        (root, path)
        for root in dict.fromkeys(roots)
        for suffix in ("*.py", "*.cc")  # the CPU kernels' C++ source too
        for path in sorted(root.rglob(suffix))
    ]


@functools.cache
def source_fingerprint() -> str:
    """A hash of `source_files()`: a change to the code that builds a program changes every
    key."""
    digest = hashlib.sha256()
    for root, path in source_files():
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _jaxlib_version() -> str:
    return importlib.metadata.version("jaxlib")


def store_folder() -> Path | None:
    """The store's folder: inside the persistent compilation cache's, if that is on and
    `$SWAJAX_PROGRAM_STORE` does not turn the store off."""
    cache = jax.config.jax_compilation_cache_dir
    if not cache or os.environ.get(ENV, "on").strip().lower() in OFF:
        return None
    return Path(cache) / SUBFOLDER


class Recorded(typing.NamedTuple):
    """A step program as launched: the jitted function, its arguments and static arguments."""

    fn: typing.Any
    args: tuple
    statics: dict

    def lower(self):
        return self.fn.lower(*self.args, **self.statics)


RECORDED_ZEROS_BYTES = 64 * 2**20  # float outputs larger than this come back as shapes


def _stand_in(shape: jax.ShapeDtypeStruct):
    """What a recorded launch answers for one output: zeros the host may read or pass to its
    own small programs (the allocator, the request table, the step's results), but a chip's
    worth of KV (large float arrays: the pools) as its shape."""
    large = shape.size * shape.dtype.itemsize > RECORDED_ZEROS_BYTES
    if large and jax.numpy.issubdtype(shape.dtype, jax.numpy.floating):
        return shape
    return jax.numpy.zeros(shape.shape, shape.dtype)


def _placed_like(out: tuple, args: tuple) -> tuple:
    """A step program returns the state it takes first (allocator, request table, pools, ...)
    where it took it: the outputs of the arguments' structure take their shardings, so the
    next recorded launch is traced with its pools split as the engine keeps them."""

    def like(o, a):
        sharding = getattr(a, "sharding", None)
        if o.shape == getattr(a, "shape", None) and isinstance(sharding, jax.sharding.Sharding):
            return jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=sharding)
        return o

    return tuple(
        jax.tree.map(like, o, a) if jax.tree.structure(o) == jax.tree.structure(a) else o
        for o, a in zip(out, args)
    ) + tuple(out[len(args) :])


_RECORDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("recording", default=None)


@contextlib.contextmanager
def recording(calls: list):
    """Inside the block no step program runs: each launch is appended to `calls` and answered
    with zeros of its outputs' shapes, so an engine over a decoder built as shapes only
    (`nnx.eval_shape`) schedules as usual and yields the programs it would run, to compile for
    another machine (`swajax compile-check`). The ledgers compare nothing meanwhile: zeros are
    no device's counts."""
    from swajax.serving import ledger

    token = _RECORDING.set(calls)
    try:
        with ledger.unchecked():
            yield calls
    finally:
        _RECORDING.reset(token)


def recording_now() -> bool:
    """Inside `recording`: nothing runs, nothing is uploaded."""
    return _RECORDING.get() is not None


class ProgramStore:
    """The compiled programs of one runner, loaded from `folder` or compiled and saved there."""

    def __init__(self, folder: Path | None, device, max_live: int = MAX_LIVE_PROGRAMS):
        self.folder, self.device, self.max_live = folder, device, max_live
        self.programs: dict = {}  # in use order: the least recently used first
        self.loaded = self.saved = 0  # programs read from / written to the folder
        # Per program (the jitted function's name): how many were compiled in this process and
        # how many were loaded from the folder instead (/metrics: "compilations").
        self.compiled: Counter[str] = Counter()
        self.reused: Counter[str] = Counter()
        self._described: dict[int, tuple[object, str]] = {}  # id(static) -> (it, its text)

    def call(self, fn, args: tuple, statics: dict):
        """`fn(*args, **statics)` (fn: a jitted function, statics: its static arguments, always
        passed in the same order), through the stored executable when there is one."""
        calls = _RECORDING.get()
        if calls is not None:
            calls.append(Recorded(fn, args, statics))
            out = _placed_like(jax.eval_shape(lambda *a: fn(*a, **statics), *args), args)
            return jax.tree.map(_stand_in, out)
        key = self.key(fn, args, statics)
        program = self.programs.pop(key, None)
        if program is not None:
            self.programs[key] = program  # the most recently used, last
        else:
            self._make(key, fn, args, statics)
            program = self.programs[key]
        return program(*args)

    def prepare(self, fn, args: tuple, statics: dict) -> bool:
        """Make `fn`'s program for these arguments ready without running it (a server's
        warm-up): compiled, or loaded from the folder. Returns whether it was compiled.
        Inside `recording`: recorded, as a launch is."""
        calls = _RECORDING.get()
        if calls is not None:
            calls.append(Recorded(fn, args, statics))
            return False
        key = self.key(fn, args, statics)
        if key in self.programs:
            return False
        return self._make(key, fn, args, statics, ahead=True)

    @staticmethod
    def key(fn, args: tuple, statics: dict):
        """A program's key within one runner (its inputs' shapes are fixed: module doc)."""
        return (fn, *statics.items(), *(a is None for a in args))

    def _make(self, key, fn, args: tuple, statics: dict, ahead: bool = False) -> bool:
        if len(self.programs) >= self.max_live:
            self._drop_oldest()
        program, made = self._program(fn, args, statics, ahead)
        self.programs[key] = program
        name = getattr(fn, "__name__", type(fn).__name__)
        (self.compiled if made else self.reused)[name] += 1
        return made

    def _drop_oldest(self) -> None:
        """Drop the least recently used half, then JAX's own caches: `.compile()` keeps every
        executable it made in them (and so its memory maps) until they are cleared; measured,
        40 compiles of a small program grew the maps by 700 without this and by none with it.
        The programs kept here stay alive (they are held), and JAX's helpers trace again."""
        for key in list(self.programs)[: max(1, self.max_live // 2)]:
            del self.programs[key]
        jax.clear_caches()

    def _program(self, fn, args: tuple, statics: dict, ahead: bool = False):
        """(the program, whether this call compiled it: False when it was loaded from the
        folder or another runner of this process had it). `ahead`: compiled now even where
        no folder keeps it (jit would compile it at its first call)."""
        if self.folder is None:
            if ahead:
                return fn.lower(*args, **statics).compile(), True
            return functools.partial(fn, **statics), True
        key = self._disk_key(fn, args, statics)
        if key is None:  # a static argument without a stable text: not stored
            if ahead:
                return fn.lower(*args, **statics).compile(), True
            return functools.partial(fn, **statics), True
        program = _IN_USE.get(key)
        if program is not None:  # another runner of this process made it
            return program, False
        path = self.folder / f"{key}.bin"
        program = self._load(path)
        made = program is None
        if made:
            program = compile_uncached(fn.lower(*args, **statics))
            self._save(path, program)
        else:
            self.loaded += 1
        _IN_USE[key] = program
        return program, made

    def _describe(self, value) -> str:
        """A static argument as text that is the same in every process. A model's forward (an
        interned object without a stable repr of its own) by its graph definition, mode and
        parameter structure: computed once."""
        if hasattr(value, "graphdef"):
            hit = self._described.get(id(value))
            if hit is None:
                parts = (value.graphdef, value.mode, value.treedef)
                hit = self._described[id(value)] = (value, repr(parts))
            return hit[1]
        return repr(value)

    def _disk_key(self, fn, args: tuple, statics: dict) -> str | None:
        """The entry's name, or None if a static argument's text names a memory address (it
        would differ in every process: an entry no later run finds, written every run)."""
        leaves, treedef = jax.tree.flatten(args)
        shapes = [(x.shape, str(x.dtype), getattr(x, "weak_type", False)) for x in leaves]
        parts = [
            source_fingerprint(),
            jax.__version__,
            _jaxlib_version(),
            self.device.platform,
            self.device.device_kind,
            # Whether a CPU program may call the MXFP4 kernel (`_load` checks the build).
            f"cpu kernels {mxfp4_cpu.requested()}" if self.device.platform == "cpu" else "",
            fn.__name__,
            str(treedef),
            repr(shapes),
            *(f"{k}={self._describe(v)}" for k, v in statics.items()),
        ]
        text = "\n".join(parts)
        if _ADDRESS.search(text):
            return None
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _load(self, path: Path):
        try:
            payload, in_tree, out_tree, kernels = pickle.loads(path.read_bytes())
            if any(name != mxfp4_cpu.target_name() for name in kernels):
                # Built by another compiler or CPU, or not available here: compiled afresh.
                # Asking also registers this process's build before the program is loaded.
                return None
            return serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, execution_devices=[self.device]
            )
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 - an unreadable entry is compiled afresh
            _log.warning("stored program %s did not load (%s); compiling it again", path.name, e)
            return None

    def _save(self, path: Path, compiled) -> None:
        try:
            # The CPU kernels it calls, by target name (their build's hash): a process loading
            # it must have registered the same build.
            kernels = sorted(set(mxfp4_cpu.TARGET.findall(compiled.as_text())))
            blob = pickle.dumps((*serialize_executable.serialize(compiled), kernels))
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
                f.write(blob)
            os.replace(f.name, path)
            self.saved += 1
        except Exception as e:  # noqa: BLE001 - the store is an optimisation: the run goes on
            _log.warning("could not store program %s (%s)", path.name, e)
