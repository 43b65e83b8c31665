"""The persistent compilation cache: a second run on the same machine reuses the first's programs.

JAX's on-disk cache, in a per-user folder: `$SWAJAX_COMPILE_CACHE` if set (`off` disables it),
else `$XDG_CACHE_HOME/swajax/jax` (`~/.cache/swajax/jax`). Every compiled program is kept
(no minimum compile time), one file each, from tens of KB to a few MB; delete the folder to
reclaim the space. The command line turns it on unless `--no-compile-cache`; a library user calls
`enable()`.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV = "SWAJAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "")


def default_dir() -> Path | None:
    """The cache folder, or None when the environment turns the cache off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "swajax" / "jax"


def enable(path: str | Path | None = None) -> Path | None:
    """Turn the cache on (at `path`, or the default folder); returns the folder, or None if off."""
    folder = Path(path) if path is not None else default_dir()
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
