"""The persistent compilation cache: a second run on the same machine reuses the first's programs.

JAX's on-disk cache, in a per-user folder: `$SWAJAX_COMPILE_CACHE` if set (`off` disables it),
else `$XDG_CACHE_HOME/swajax/jax` (`~/.cache/swajax/jax`). Every compiled program is kept
(no minimum compile time), one file each, from tens of KB to a few MB; delete the folder to
reclaim the space. The command line turns it on unless `--no-compile-cache`; a library user calls
`enable()`.

The cache is an optimisation, so it never takes a run down: a folder that cannot be created or
written is reported once and the run goes on without it. JAX writes entries in place (not
atomically) and never overwrites one, so an entry cut short by a killed process, or being
written by another process sharing the folder, reads as corrupt: JAX then compiles afresh, and
the hook here deletes the unreadable entry so that the fresh program takes its place.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import jax

ENV = "SWAJAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "")
_READ_ERROR = re.compile(r"Error reading persistent compilation cache entry for '([^']+)'")


def default_dir() -> Path | None:
    """The cache folder, or None when the environment turns the cache off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "swajax" / "jax"


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def enable(path: str | Path | None = None, *, report: Callable[[str], None] = _warn) -> Path | None:
    """Turn the cache on (at `path`, or the default folder); returns the folder, or None if it
    is off or unusable (then `report` gets one line saying why, and nothing else changes)."""
    folder = Path(path) if path is not None else default_dir()
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass  # can write there
    except OSError as e:
        report(f"the compile cache {folder} cannot be used ({e.strerror or e}); running without it")
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _replace_unreadable_entries(folder, report)
    logging.getLogger(__name__).info("compile cache: %s", folder)
    return folder


def _unreadable(entry: Path) -> bool:
    from jax._src import compilation_cache  # JAX's own format: compressed executable + time

    try:
        compilation_cache.decompress_executable(entry.read_bytes())
    except FileNotFoundError:
        return False  # another process replaced it meanwhile
    except Exception:  # noqa: BLE001 - whatever fails to decode is what JAX failed to read
        return True
    return False


def _replace_unreadable_entries(folder: Path, report: Callable[[str], None]) -> None:
    """When JAX reports an entry it cannot read (it then compiles the program again), delete the
    unreadable entries of that program, so JAX's write of the fresh one is not skipped."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        found = _READ_ERROR.search(str(message))
        if found is None:
            return previous(message, category, filename, lineno, file, line)
        for entry in folder.glob(f"{glob.escape(found.group(1))}-*-cache"):
            if _unreadable(entry):
                entry.unlink(missing_ok=True)
                report(f"the compile cache entry {entry.name} was unreadable; replaced")
        return None

    if getattr(previous, "swajax_cache_folder", None) != folder:
        show.swajax_cache_folder = folder  # type: ignore[attr-defined]
        warnings.showwarning = show


def compile_uncached(lowered):
    """Compile without JAX's persistent cache. On CPU an executable that cache loaded does not
    serialize whole: it loads, then fails at its first call ("Function ... not found"); found
    with a warm cache whose program-store entries were removed. A compile for a TPU this
    machine does not have (`swajax.tpu`) cannot be read back from it at all ("PjRtCompiler
    must be constructed with a Client"). The cache's use is decided once per process and
    remembered, so it is reset around the switch."""
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    try:
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
        return lowered.compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()
