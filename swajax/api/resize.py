"""Restoring a snapshot's prefix cache into pools of another size (`restore_state` calls it when
only the pools' sizes differ).

The saved tree is loaded on the host over a ledger of the saved sizes, the locks of the saved
requests are released (the requests are not restored), and the tree is evicted by its own
recency lists until what it holds fits the new pools: full KV by the full LRU, SWA KV by the SWA
LRU, exactly as the engine would have evicted under that pressure. Each node left gets pages of
the new pools (the lowest free, as a host-tier load takes them, its SWA pages paired when its
window is live), and its KV is copied page by page from the saved pools into them through the
host tier's load program (`memory.host_copy`), so the device allocator and the host's ledger
agree as after any load. One-pool layouts (single, all-SWA) take their pages the same way off
the one free list (`memory.host_copy.load_primary_pages`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from swajax.arith import bucket
from swajax.errors import InputError
from swajax.memory import allocator as A
from swajax.memory.host_copy import gather_pages, load_pages, load_primary_pages, page_sets
from swajax.memory.padding import pad
from swajax.prefix_cache.locks import LockHandle
from swajax.prefix_cache.radix import RadixCache
from swajax.prefix_cache.state import load_tree_state, tree_order, tree_state
from swajax.serving.ledger import PoolLedger
from swajax.sizing import PoolMode, PoolSizes

SIZES = ("full_tokens", "swa_tokens")  # what may differ between the saved pools and these
MIN_PAGES = 8


def resizable(saved: dict, ours: dict) -> bool:
    """Whether two identities differ only in the pools' token counts (and the arrays' shapes
    that follow from them)."""
    if {k for k in ours if saved.get(k) != ours[k]} - {"pools", "kv"}:
        return False
    a, b = saved["pools"], ours["pools"]
    return {k for k in b if a.get(k) != b[k]} <= set(SIZES)


def restore_resized(engine, header: dict, saved_device: dict) -> dict:
    """Load the saved tree into `engine` (fresh, pools of other sizes), evicted by LRU to fit;
    `saved_device`: the snapshot's device state as saved (allocator and pools, on the host's
    CPU device). Returns the tokens kept and dropped."""
    sizes = engine.sizes
    if engine.runner.pools.compressed is not None and sizes.mode is not PoolMode.HYBRID:
        raise InputError("compressed pools restore into other sizes only as hybrid pools")
    if engine.runner.host_kv is not None or engine.draft is not None:
        raise InputError(
            "a snapshot restores into pools of another size without a host tier or a draft "
            "model (build the engine with the saved sizes)"
        )
    tree = header.get("tree")
    if tree is None or not isinstance(engine.cache, RadixCache):
        raise InputError("only a prefix cache restores into pools of another size")
    saved_sizes = PoolSizes(**header["of"]["pools"])
    scratch = _scratch_tree(engine.cache, saved_sizes, tree, header["engine"])
    held = _held(scratch)
    evicted = scratch.evict(*_excess(scratch, held, _capacity(engine.ledger)))
    moves = _readdress(scratch, engine.ledger)
    if sizes.mode is PoolMode.HYBRID:
        _copy(engine.runner, saved_device, moves, sizes.page_size)
    else:
        _copy_one_pool(engine.runner, saved_device, moves)
    load_tree_state(engine.cache, tree_state(scratch))
    kept = _held(engine.cache)
    return dict(
        nodes=sum(1 for _ in engine.cache.nodes()),
        tokens=kept[0],
        dropped_tokens=held[0] - kept[0],
        dropped_swa_tokens=held[1] - kept[1],
        evicted=list(evicted),
    )


def _held(tree: RadixCache) -> tuple[int, int]:
    """(full, SWA) tokens whose KV the tree holds on the device (its requests' locks gone).
    One pool: the tokens with KV in it, for both."""
    if tree.mode is PoolMode.HYBRID:
        return tree.full_evictable, tree.sizes.swa_evictable
    kv = tree.swa_evictable if tree.mode is PoolMode.ALL_SWA else tree.full_evictable
    return kv, kv


def _excess(tree: RadixCache, held, capacity) -> tuple[int, int]:
    """What `evict(full, swa)` must free for `held` to fit `capacity`: both in hybrid pools;
    in an all-SWA tree with tombstones only SWA eviction (a tombstone holds no KV there); in a
    tree without an SWA component only full eviction (the other figure mirrors it)."""
    full, swa = (max(0, h - c) for h, c in zip(held, capacity))
    if tree.mode is PoolMode.HYBRID:
        return full, swa
    return (0, swa) if tree.swa else (full, 0)


def _capacity(ledger: PoolLedger) -> tuple[int, int]:
    ps = ledger.page_size
    full = ledger.primary_pages * ps
    return full, (ledger.swa_pages * ps if ledger.mode is PoolMode.HYBRID else full)


def _scratch_tree(cache: RadixCache, saved: PoolSizes, tree: dict, state: dict) -> RadixCache:
    """The saved tree on the host over a ledger of the saved sizes, its requests' locks
    released as aborting them would."""
    ledger = PoolLedger(saved)
    scratch = RadixCache(
        ledger,
        page_size=cache.ps,
        window=cache.window,
        pool_mode=cache.mode,
        cap_leaf_to_window=cache.cap_leaf,
        policy=cache.policy,
    )
    nodes = load_tree_state(scratch, tree)
    for req in state["requests"]:
        if req["handle"] is not None and req["status"] in ("running", "waiting"):
            node, lock_id, released = req["handle"]
            scratch.unlock(LockHandle(nodes[node], lock_id, released))
    return scratch


@dataclasses.dataclass
class _Moves:
    """Pages to copy: the saved full pages and the new ones they go to; likewise those whose
    SWA KV goes with them (by their full pages, the SWA pages follow through `full_to_swa`)."""

    full_from: list = dataclasses.field(default_factory=list)
    full_to: list = dataclasses.field(default_factory=list)
    swa_from: list = dataclasses.field(default_factory=list)
    swa_to: list = dataclasses.field(default_factory=list)


def _readdress(scratch: RadixCache, ledger: PoolLedger) -> _Moves:
    """Give every node left new full pages (and SWA pages if its window is live), parents first;
    its slots in the tree become the new ones. All-SWA: a tombstone holds no KV and gets none
    (its slots are the dummy's, as stale as the freed ones it had)."""
    ps, moves = scratch.ps, _Moves()
    hybrid = scratch.mode is PoolMode.HYBRID
    for node in tree_order(scratch)[1:]:
        if scratch.mode is PoolMode.ALL_SWA and not node.swa_live:
            node.value = np.zeros(len(node), np.int32)
            continue
        old = node.value[::ps] // ps
        new_slots = ledger.claim(len(node))
        new = new_slots[::ps] // ps
        moves.full_from += old.tolist()
        moves.full_to += new.tolist()
        if hybrid and node.swa_live:
            ledger.pair_swa(new_slots)
            moves.swa_from += old.tolist()
            moves.swa_to += new.tolist()
        node.value = new_slots
    return moves


def _copy(runner, saved: dict, moves: _Moves, page_size: int) -> None:
    """Copy the moved pages' KV from the saved pools into the runner's, taking the new pages
    off its allocator as a host-tier load does."""
    n, m = bucket(len(moves.full_to), MIN_PAGES), bucket(len(moves.swa_to), MIN_PAGES)
    full_from = pad(np.asarray(moves.full_from, np.int32), n)
    swa_from = pad(np.asarray(moves.swa_from, np.int32), m)
    full_kv = jax.device_get(gather_pages(saved["alloc"], saved["pools"], full_from, swa=False))
    swa_kv = jax.device_get(gather_pages(saved["alloc"], saved["pools"], swa_from, swa=True))
    claim = pad(np.asarray(moves.full_to, np.int32), n)
    pair = pad(np.asarray(moves.swa_to, np.int32), m)
    claim, pair, full_kv, swa_kv = jax.device_put((claim, pair, full_kv, swa_kv), runner.placement)
    runner.alloc, runner.pools = load_pages(
        runner.alloc, runner.pools, claim, full_kv, pair, swa_kv
    )


def _copy_one_pool(runner, saved: dict, moves: _Moves) -> None:
    """A one-pool layout's copy: every buffer set at the pool's slots, the pages taken off its
    free list."""
    n = bucket(len(moves.full_to), MIN_PAGES)
    old = pad(np.asarray(moves.full_from, np.int32), n)
    kv = tuple(
        jax.device_get(gather_pages(saved["alloc"], saved["pools"], old, swa=swa))
        for swa in page_sets(runner.pools)
    )
    claim = pad(np.asarray(moves.full_to, np.int32), n)
    claim, kv = jax.device_put((claim, kv), runner.placement)
    runner.alloc, runner.pools = load_primary_pages(runner.alloc, runner.pools, claim, kv)


def saved_template(engine, header: dict) -> dict:
    """The shapes of the snapshot's device state (the saved pools' sizes), placed on the
    host's CPU device: what `restore_state` reads it into."""
    saved = PoolSizes(**header["of"]["pools"])
    runner, mode = engine.runner, saved.mode
    template = dict(
        alloc=jax.eval_shape(
            lambda: A.init_allocator(saved.full_tokens, saved.swa_tokens, saved.page_size, mode)
        ),
        r2t=runner.r2t,
        pools=jax.eval_shape(lambda: engine.model.init_pools(saved)),
    )
    if header["penalties"]:
        template["penalties"] = runner.device_state(penalties=True)["penalties"]
    device = jax.sharding.make_single_device_sharding(_host_device())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), template)


def _host_device():
    """This process's CPU device: the saved pools (larger than the new ones, perhaps larger
    than the accelerator has room for) are read into host memory, and the kept pages are
    gathered there; only those go to the engine's devices. The first local device where JAX
    runs without a CPU backend."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return jax.local_devices()[0]
