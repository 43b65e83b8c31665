"""The bytes of a prefix cache's host tier (prefix_cache/host_tier.py decides what moves): numpy
page stores in host memory, and the copies each step's `Transfer`s ask for.

A save gathers whole pages on the device, in order before the step that frees them (programs
run in launch order), and starts their copy to the host without waiting
(`copy_to_host_async`); the bytes land in the store when the next load needs them or the step's
result is read. A load takes the bytes from the store and runs one program after the step's
releases (`memory.host_copy.load_pages`). Stores are `np.empty`: the operating system commits
host memory only as pages are written.
"""

from __future__ import annotations

import jax
import numpy as np

from swajax.arith import bucket
from swajax.memory.host_copy import gather_pages, load_pages, page_layouts
from swajax.memory.padding import pad

MIN_PAGES = 4
POOLS = ("full", "swa")


class HostKV:
    def __init__(self, pools, full_pages: int, swa_pages: int):
        """Stores for `full_pages` / `swa_pages` host pages (ids from 1) shaped like `pools`."""
        self.stores = {}
        for pool, pages in (("full", full_pages), ("swa", swa_pages)):
            self.stores[pool] = tuple(
                np.empty((pages + 1, *shape), dtype)
                for shape, dtype in page_layouts(pools, pool == "swa")
            )
            for store in self.stores[pool]:
                store[0] = 0  # the dummy page padding reads: finite, like the pools' own
        self._pending = []  # (pool, host pages, (K, V) device arrays on their way)
        self.bytes_saved = self.bytes_loaded = 0

    @staticmethod
    def by_pool(transfers, page_size: int):
        """{pool: (full pages, host pages)} of `transfers`, concatenated in order."""
        out = {}
        for pool in POOLS:
            mine = [t for t in transfers if t.pool == pool]
            if mine:
                pages = np.concatenate([t.slots[::page_size] // page_size for t in mine])
                host = np.concatenate([t.host_pages for t in mine])
                out[pool] = (pages.astype(np.int32), host)
        return out

    def save(self, alloc, pools, saves) -> None:
        """Start the saves' device->host copies (before the step's releases run)."""
        for pool, (pages, host) in self.by_pool(saves, alloc.page_size).items():
            n = bucket(len(pages), MIN_PAGES)
            kv = gather_pages(alloc, pools, pad(pages, n), swa=pool == "swa")
            for x in kv:
                x.copy_to_host_async()
            self._pending.append((pool, host, kv))

    def settle(self) -> None:
        """Land every started save in its store."""
        for pool, host, kv in self._pending:
            for store, x in zip(self.stores[pool], kv):
                pages = np.asarray(x)[: len(host)]
                store[host] = pages
                self.bytes_saved += pages.nbytes
        self._pending = []

    def read(self, pool: str, host: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
        """The stored pages `host`, padded to n pages (the padding goes to the dummy page)."""
        out = []
        for store in self.stores[pool]:
            x = store[np.concatenate([host, np.zeros(n - len(host), host.dtype)])]
            self.bytes_loaded += x[: len(host)].nbytes
            out.append(x)
        return tuple(out)


def run_loads(alloc, pools, host_kv: HostKV, loads, placement=None):
    """Apply the loads (after the step's releases): (alloc, pools)."""
    ps = alloc.page_size
    groups = HostKV.by_pool(loads, ps)
    args = {}
    for pool in POOLS:
        pages, host = groups.get(pool, (np.zeros(0, np.int32), np.zeros(0, np.int32)))
        n = bucket(len(pages), MIN_PAGES)
        kv = host_kv.read(pool, host, n)
        args[pool] = (pad(pages, n), kv)
    (claim, full_kv), (pair, swa_kv) = jax.device_put((args["full"], args["swa"]), placement)
    return load_pages(alloc, pools, claim, full_kv, pair, swa_kv)
