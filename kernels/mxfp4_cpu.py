"""A few rows times an MXFP4 matrix on CPU, read where it is multiplied (`mxfp4_cpu.cc`).

XLA:CPU multiplies an MXFP4 weight only after decoding it to bfloat16, four times its packed
bytes written and read again; at gpt-oss-20b's shapes that was most of a decode step
(BUILD_NOTES.md, "Decode speed, fourth pass"). This kernel decodes each block of 32 inputs into
vector registers and multiplies it there. It is an XLA FFI custom call, compiled from its C++
source by the machine's C++ compiler the first time a process needs it (for that machine's
instruction set: AVX-512 where the CPU has it, portable code elsewhere) and kept in
`$XDG_CACHE_HOME/swajax/cpu-kernels` under a name that hashes the source, the compiler, JAX's
FFI headers and the CPU, so a changed one is rebuilt. The custom call's target name carries the
same hash, so a compiled program kept on disk never calls another build's kernel. Beside each
library its size and SHA-256 are recorded (`.sha256`); a library that does not match them (cut
short by a full disk or a killed copy, overwritten, foreign) is rebuilt, never loaded: loading
a truncated shared library kills the process with SIGBUS.

Where no compiler is found, or `SWAJAX_CPU_KERNELS=off` (or `disable`, `none`, `0`), `available()`
is False, says why in `unavailable_reason()` (and, but for the variable, warns once), and the
callers keep XLA's decode-then-multiply path. The reference is
that path (and the dense dequantized product): the same values, summed in another order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

ENV = "SWAJAX_CPU_KERNELS"
ARCH_ENV = "SWAJAX_CPU_KERNEL_ARCH"
OFF = ("off", "0", "false", "no", "disable", "disabled", "none")
PREFIX = "swajax_mxfp4_rows_"  # + the build's hash: the custom call's target
TARGET = re.compile(PREFIX + "[0-9a-f]{16}")  # a target in a program's text
SOURCE = Path(__file__).with_name("mxfp4_cpu.cc")
SYMBOL = "SwajaxMxfp4Rows"
log = logging.getLogger(__name__)
_REGISTERED: set[str] = set()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "swajax" / "cpu-kernels"


def _cpu() -> str:
    """What the build's instruction set depends on (the compiler targets this CPU)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}"


def _arch() -> str:
    """The instruction set built for: this CPU's, or `$SWAJAX_CPU_KERNEL_ARCH` (a `-march`
    value: "x86-64" builds the portable path, which the tests run that way)."""
    return os.environ.get(ARCH_ENV) or "native"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _build(compiler: str) -> tuple[Path, str]:
    """The shared library (built now unless already cached) and its hash."""
    include = jax.ffi.include_dir()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), version.stdout.encode(), _cpu().encode(), _arch().encode()):
        digest.update(part)
    for header in sorted(Path(include, "xla", "ffi", "api").glob("*.h")):
        digest.update(header.read_bytes())
    key = digest.hexdigest()[:16]
    folder = _cache_dir()
    library = folder / f"mxfp4_cpu-{key}.so"
    if _verified(library):
        return library, key
    if library.is_dir() or library.is_symlink():
        raise OSError(f"{library} is not a library this process wrote: remove it to rebuild")
    if library.exists():
        log.warning("%s does not match its recorded size and hash: rebuilding it", library)
    folder.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed: processes building at once (pytest -n) never
    # load half a library.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
    os.close(fd)
    command = [
        compiler,
        *("-O3", f"-march={_arch()}", "-std=c++17", "-shared", "-fPIC", "-pthread"),
        f"-I{include}",
        str(SOURCE),
        "-o",
        tmp,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    _record(Path(tmp), _seal(library))
    os.replace(tmp, library)
    if not _verified(library):  # another process replaced it meanwhile: its record follows
        raise OSError(f"{library} changed while it was written; the next run rebuilds it")
    return library, key


def _seal(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _fingerprint(path: Path) -> str:
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _record(built: Path, seal: Path) -> None:
    """Write `built`'s size and hash to `seal` (through a temporary name: never half of one)."""
    fd, tmp = tempfile.mkstemp(dir=seal.parent, prefix=".seal-")
    with os.fdopen(fd, "w") as f:
        f.write(_fingerprint(built))
    os.replace(tmp, seal)


def _verified(library: Path) -> bool:
    """A regular file whose size and hash are the ones recorded when it was built."""
    try:
        if not library.is_file() or library.is_symlink():
            return False
        return _seal(library).read_text().strip() == _fingerprint(library)
    except OSError:
        return False


@functools.cache
def _target() -> tuple[str | None, str]:
    """(the registered custom call target, or None; why not)."""
    if not requested():
        return None, f"{ENV}={os.environ[ENV]}"
    compiler = _compiler()
    if compiler is None:
        reason = "no C++ compiler found (set CXX, or install g++ / clang++)"
        log.warning("the MXFP4 CPU kernel is not available, XLA's path runs instead: %s", reason)
        return None, reason
    try:
        library, key = _build(compiler)
        handler = getattr(ctypes.CDLL(str(library)), SYMBOL)
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        log.warning("the MXFP4 CPU kernel is not available, XLA's path runs instead: %s", e)
        return None, str(e)
    name = f"{PREFIX}{key}"
    if name not in _REGISTERED:  # XLA keeps a target for the process's life
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
        _REGISTERED.add(name)
    return name, ""


def requested() -> bool:
    """Not turned off by `$SWAJAX_CPU_KERNELS` (whether it is built is `available()`)."""
    return os.environ.get(ENV, "").strip().lower() not in OFF


def target_name() -> str | None:
    """The kernel's registered custom call target (built and registered now if it has not
    been), or None where it is not available."""
    return _target()[0]


def available() -> bool:
    return target_name() is not None


def unavailable_reason() -> str:
    return _target()[1]


def mxfp4_rows(x, blocks, scales, index, live) -> jax.Array:
    """x [M, K] (bfloat16 or float32; other floats are widened) times matrix `index` of the
    stack (blocks [..., N, K/32, 16] uint8, scales [..., N, K/32] uint8; `index` one int per
    leading axis, clamped into the stack) in float32, for the first `live` rows; the other
    rows are 0. `available()` must be True."""
    name = _target()[0]
    if name is None:
        raise RuntimeError(f"the MXFP4 CPU kernel is not available: {unavailable_reason()}")
    n = blocks.shape[-3]
    call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))
    index = jnp.asarray(index, jnp.int32).reshape(-1)
    if x.dtype not in (jnp.float32, jnp.bfloat16):
        x = x.astype(jnp.float32)
    return call(x, blocks, scales, index, jnp.asarray(live, jnp.int32))
