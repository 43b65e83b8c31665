"""Snapshots of an engine at rest: a warm prefix cache kept across a restart.

`save_state(engine, folder)` writes, for an engine with no request waiting or running:

- `swajax_state.json`: the format, what the snapshot is of (swajax's version, the model's
  layers and parameter shapes, the pools' layout and dtypes, the request table's shape) and
  the prefix cache's tree (`swajax.prefix_cache.state`: nodes, tombstones, both recency lists);
- `ledger.npz`: the host's mirror of the pools' pages (`PoolLedger`);
- `host_kv.npz`: with a host tier, the bytes of its pages in use;
- `device/`: the allocator, the request table and the KV pools, through orbax.

`restore_state(engine, folder)` loads it into a fresh engine built the same way: the cache then
matches, evicts and explains exactly as the saved one would have, and a hit reads the very KV
bytes that were saved. A snapshot of another model, pool layout, dtype or swajax version is
refused with the difference named. The folder is written beside its destination and swapped
into place (`folder_swap`): a failed save leaves the destination as it was, and only a folder
an earlier save wrote (or an empty one) is replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import numpy as np

from swajax.errors import InputError
from swajax.folder_swap import swap_in
from swajax.prefix_cache.radix import RadixCache
from swajax.prefix_cache.state import load_tree_state, tree_state
from swajax.version import __version__

FORMAT = 1
HEADER = "swajax_state.json"
LEDGER = "ledger.npz"
HOST_KV = "host_kv.npz"
DEVICE = "device"
MARKER = ".swajax-state"


def identity(engine) -> dict:
    """What a snapshot must match to load: everything that decides a slot's meaning."""
    runner = engine.runner
    if not hasattr(runner, "device_state"):
        raise InputError("a snapshot needs a model on the device (the null model holds no KV)")
    params = [(tuple(x.shape), str(x.dtype)) for x in engine.model.params]
    digest = hashlib.sha256(repr(params).encode()).hexdigest()[:16]
    sums = np.asarray(_sums(engine.model.params)).tolist()  # the weights' values, read once
    weights = hashlib.sha256(np.asarray(sums, np.float32).tobytes()).hexdigest()[:16]
    sizes = dataclasses.asdict(engine.sizes)
    sizes["mode"] = engine.sizes.mode.value
    pools = jax.tree.map(lambda x: f"{x.dtype}{list(x.shape)}", runner.pools)
    return dict(
        swajax=__version__,
        layers=repr(engine.cfg),
        parameters=digest,
        weights=weights,
        pools=sizes,
        kv=[str(x) for x in jax.tree.leaves(pools)],
        request_table=list(runner.r2t.table.shape),
    )


def _at_rest(engine) -> None:
    busy = len(engine.scheduler.waiting) + len(engine.scheduler.running)
    if busy:
        raise InputError(
            f"the engine has {busy} requests waiting or running: a snapshot is of an engine at "
            "rest (finish or abort them first)"
        )
    engine.flush()


def save_state(engine, folder: str | Path, *, force: bool = False) -> dict:
    """Write a snapshot of `engine` (at rest) to `folder`; returns its header. A non-empty
    `folder` is refused unless `force`, and then replaced only if a save wrote it."""
    _at_rest(engine)
    header = dict(format=FORMAT, of=identity(engine))
    if isinstance(engine.cache, RadixCache):
        header["tree"] = tree_state(engine.cache)
    ledger = engine.ledger.state()
    device = engine.runner.device_state()
    host_kv = _host_pages(engine)

    def build(out: Path) -> None:
        (out / HEADER).write_text(json.dumps(header))
        np.savez(out / LEDGER, **ledger)
        if host_kv is not None:
            np.savez(out / HOST_KV, **host_kv)
        checkpointer = _checkpointer()
        checkpointer.save((out / DEVICE).resolve(), device)
        checkpointer.wait_until_finished()

    swap_in(folder, build, force=force, marker=MARKER)  # its refusals are InputErrors
    return header


def restore_state(engine, folder: str | Path) -> dict:
    """Load the snapshot in `folder` into `engine`, fresh and built as the saved one was;
    returns what was restored (nodes and tokens of the tree)."""
    folder = Path(folder)
    path = folder / HEADER
    if not path.is_file():
        raise InputError(f"{folder} holds no swajax snapshot (no {HEADER})")
    header = json.loads(path.read_text())
    if header.get("format") != FORMAT:
        raise InputError(
            f"{path}: snapshot format {header.get('format')}, this swajax reads {FORMAT}"
        )
    _at_rest(engine)
    ours = identity(engine)
    diff = [k for k in ours if header["of"].get(k) != ours[k]]
    if diff:
        named = "; ".join(f"{k}: saved {header['of'].get(k)}, this engine {ours[k]}" for k in diff)
        raise InputError(f"the snapshot in {folder} is of another engine: {named}")
    if isinstance(engine.cache, RadixCache) != ("tree" in header):
        raise InputError("the snapshot and this engine differ in having a prefix cache")
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        engine.runner.device_state(),
    )
    device = _checkpointer().restore((folder / DEVICE).resolve(), target)
    with np.load(folder / LEDGER) as ledger:
        engine.ledger.load_state(dict(ledger))
    engine.runner.load_device_state(device)
    tree = header.get("tree")
    if tree is not None:
        load_tree_state(engine.cache, tree)
    if engine.runner.host_kv is not None:
        with np.load(folder / HOST_KV) as saved:
            _load_host_pages(engine, dict(saved))
    nodes = tree["nodes"] if tree else []
    return dict(nodes=len(nodes), tokens=sum(len(n["key"]) for n in nodes))


def _host_pages(engine) -> dict | None:
    """The host tier's pages in use, by store: their ids and bytes."""
    host_kv = engine.runner.host_kv
    if host_kv is None:
        return None
    host_kv.settle()  # copies still on their way land first
    out = {}
    tier = engine.cache.tier
    for pool, pages in (("full", tier.full), ("swa", tier.swa)):
        free = pages.free_ids()
        ids = np.asarray([p for p in range(1, pages.total + 1) if p not in free], np.int64)
        out[f"{pool}_ids"] = ids
        for i, store in enumerate(host_kv.stores[pool]):
            out[f"{pool}_{i}"] = store[ids]
    return out


def _load_host_pages(engine, saved: dict) -> None:
    for pool, stores in engine.runner.host_kv.stores.items():
        ids = saved[f"{pool}_ids"]
        for i, store in enumerate(stores):
            store[ids] = saved[f"{pool}_{i}"]


@jax.jit
def _sums(params):
    """Each parameter's sum in float32: a fingerprint of the weights (the same weights give
    the same bits; other weights, other sums)."""
    return jax.numpy.stack([x.astype(jax.numpy.float32).sum() for x in params])


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()
