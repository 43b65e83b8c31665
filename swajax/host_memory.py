"""Host memory this process freed but the C allocator still holds.

Building an engine frees about as much as it keeps: every tensor is read through a host copy,
and restacking the layers (`layer_stack`, with `consume`) frees each layer's arrays once its
stack holds them. glibc keeps those blocks for reuse, scattered in its arenas, and the step
programs' compilations and buffers then allocate around them: at gpt-oss-20b's published shapes
0.86 GiB stayed resident for nothing, and the first steps peaked at 17.3 GiB instead of 16.4
(benchmarks/README.md, "Published shapes").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# Weights below which a build does not ask: a call walks the whole heap (50-100 ms measured in a
# test process), and what a small model's build frees is small too.
WORTH_FROM_BYTES = 256 * 2**20


def release_free_memory() -> bool:
    """Give freed heap pages back to the OS (glibc's `malloc_trim`). True if any went back;
    False where the C library has no such call (not glibc) or nothing was free."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
