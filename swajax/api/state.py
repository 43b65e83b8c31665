"""Snapshots of an engine, running or at rest: resumed bit for bit, or restarted warm.

`save_state(engine, folder)` writes, after reading any step still launched (`Engine.flush`):

- `swajax_state.json`: the format, what the snapshot is of (swajax's version, the model's
  layers and parameter shapes, the pools' layout and dtypes, the request table's shape), the
  prefix cache's tree with the locks running requests hold (`swajax.prefix_cache.state`) and
  the engine's host state: requests, queues, counters, the seed generator
  (`swajax.serving.snapshot`);
- `requests.npz`: each request's full slots and kept logits;
- `ledger.npz`: the host's mirror of the pools' pages (`PoolLedger`);
- `host_kv.npz`: with a host tier, the bytes of its pages in use;
- `device/`: the allocator, the request table, the KV pools and the penalties' token counts,
  through orbax.

`restore_state(engine, folder)` loads it into a fresh engine built the same way: from there
the engine runs exactly as the saved one went on to (the same plans, tokens and logits, bit for
bit), and a hit reads the very KV bytes that were saved. `requests=False` restores the prefix
cache alone: the saved requests are dropped and what they held given back, so a server
restarts warm. A snapshot of another model, pool layout, dtype or swajax version is refused with
the difference named. The folder is written beside its destination and swapped into place
(`folder_swap`): a failed save leaves the destination as it was, and only a folder an earlier
save wrote (or an empty one) is replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import numpy as np

from swajax.api.resize import resizable, restore_resized, saved_template
from swajax.errors import InputError
from swajax.folder_swap import swap_in
from swajax.prefix_cache.radix import RadixCache
from swajax.prefix_cache.state import check_tree_state, load_tree_state, tree_order, tree_state
from swajax.serving.snapshot import check_engine_state, engine_state, load_engine_state
from swajax.version import __version__

FORMAT = 2
HEADER = "swajax_state.json"
REQUESTS = "requests.npz"
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
    sums = np.asarray(_sums(engine.model.params))  # the weights' values, read once
    weights = hashlib.sha256(sums.astype(np.uint32).tobytes()).hexdigest()[:16]
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


def _fresh(engine) -> None:
    if engine.requests or engine.steps:
        raise InputError(
            f"this engine has run ({engine.steps} steps, {len(engine.requests)} requests): a "
            "snapshot restores into a fresh engine"
        )


def save_state(engine, folder: str | Path, *, force: bool = False) -> dict:
    """Write a snapshot of `engine` to `folder`, its running requests included; returns its
    header. A non-empty `folder` is refused unless `force`, and then replaced only if a save
    wrote it."""
    engine.flush()  # a launched step is read, queued releases reach the device
    header = dict(format=FORMAT, of=identity(engine))
    index = None
    if isinstance(engine.cache, RadixCache):
        header["tree"] = tree_state(engine.cache)
        index = {node: i for i, node in enumerate(tree_order(engine.cache))}
    header["engine"], arrays = engine_state(engine, index)
    runner = engine.runner
    header["edit_buckets"] = [[bool(k), v] for k, v in runner.edit_buckets.items()]
    ledger = engine.ledger.state()
    device = runner.device_state()
    header["penalties"] = "penalties" in device
    host_kv = _host_pages(engine)

    def write_host(out: Path) -> None:
        (out / HEADER).write_text(json.dumps(header))
        np.savez(out / REQUESTS, **arrays)
        np.savez(out / LEDGER, **ledger)
        if host_kv is not None:
            np.savez(out / HOST_KV, **host_kv)

    if jax.process_count() > 1:
        _save_joined(Path(folder), write_host, device, force)
        return header

    def build(out: Path) -> None:
        write_host(out)
        _write_device(out, device)

    swap_in(folder, build, force=force, marker=MARKER)  # its refusals are InputErrors
    return header


def _write_device(out: Path, device: dict) -> None:
    checkpointer = _checkpointer()
    checkpointer.save((out / DEVICE).resolve(), _nonempty(device))
    checkpointer.wait_until_finished()


def _save_joined(folder: Path, write_host, device: dict, force: bool) -> None:
    """A save of an engine joined across processes (each runs the same scheduler, so each holds
    the same host state): process 0 builds the folder beside its destination and swaps it in;
    every process writes the shards it holds into it, orbax coordinating them. The folder's
    path goes from process 0 to the others (an empty one: process 0 refused, and says why)."""
    from jax.experimental import multihost_utils

    if jax.process_index() == 0:
        shared = False

        def build(out: Path) -> None:
            nonlocal shared
            write_host(out)
            _share_path(str(out))
            shared = True
            _write_device(out, device)

        try:
            swap_in(folder, build, force=force, marker=MARKER)
        except BaseException:
            if not shared:
                _share_path("")
            raise
    else:
        path = _share_path("")
        if not path:
            raise InputError(f"process 0 could not save to {folder} (its error says why)")
        _write_device(Path(path), device)
    multihost_utils.sync_global_devices("swajax snapshot in place")


def _share_path(path: str) -> str:
    """Process 0's `path`, on every process."""
    from jax.experimental import multihost_utils

    data = np.zeros(4096, np.uint8)
    raw = path.encode()
    if len(raw) > len(data):
        raise InputError(f"the snapshot path {path!r} is over {len(data)} bytes")
    data[: len(raw)] = np.frombuffer(raw, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return bytes(got[got > 0]).decode()


def restore_state(engine, folder: str | Path, *, requests: bool = True) -> dict:
    """Load the snapshot in `folder` into `engine`, fresh and built as the saved one was;
    returns what was restored (nodes and tokens of the tree, requests). `requests=False`: the
    prefix cache alone (the saved requests are dropped and what they held is given back)."""
    folder = Path(folder)
    path = folder / HEADER
    if not path.is_file():
        raise InputError(f"{folder} holds no swajax snapshot (no {HEADER})")
    try:
        header = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise InputError(f"{path} is not a snapshot header: {e}") from None
    found = header.get("format") if isinstance(header, dict) else header
    if found != FORMAT:
        raise InputError(f"{path}: snapshot format {found!r}, this swajax reads {FORMAT}")
    _fresh(engine)
    ours = identity(engine)
    diff = [k for k in ours if header["of"].get(k) != ours[k]]
    if diff and not requests and resizable(header["of"], ours):
        return _restore_resized(engine, folder, header)
    if diff:
        named = "; ".join(f"{k}: saved {header['of'].get(k)}, this engine {ours[k]}" for k in diff)
        raise InputError(f"the snapshot in {folder} is of another engine: {named}")
    if isinstance(engine.cache, RadixCache) != ("tree" in header):
        raise InputError("the snapshot and this engine differ in having a prefix cache")
    try:
        _check(engine, folder, header)
        _load(engine, folder, header)
    except Exception as e:  # the engine stays as it was: fresh
        engine.recover("abort: a snapshot failed to load")
        if isinstance(e, InputError):
            raise
        raise InputError(f"the snapshot in {folder} is damaged: {type(e).__name__}: {e}") from e
    tree = header.get("tree")
    live = [r for r in engine.requests.values() if not r.done]
    if not requests:
        drop_requests(engine)
    saved = tree["nodes"] if tree else []
    return dict(
        nodes=len(saved),
        tokens=sum(len(n["key"]) for n in saved),
        requests=len(live) if requests else 0,
        dropped_requests=0 if requests else len(live),
    )


def _check(engine, folder: Path, header: dict) -> None:
    """Every index and size of the snapshot against this engine, before anything is loaded."""
    slots = (engine.ledger.primary_pages + 1) * engine.sizes.page_size  # page 0: the dummy
    tree = header.get("tree")
    if tree is not None:
        check_tree_state(tree, slots)
    with np.load(folder / REQUESTS) as arrays:
        check_engine_state(
            header["engine"],
            arrays,
            rows=engine.options.max_running,
            context=engine.options.max_context,
            slots=slots,
            vocab=engine.model.vocab_size,
            nodes=None if tree is None else len(tree["nodes"]) + 1,
        )


def _load(engine, folder: Path, header: dict) -> None:
    runner = engine.runner
    device = _read_device(folder, runner.device_state(penalties=header["penalties"]))
    with np.load(folder / LEDGER) as ledger:
        engine.ledger.load_state(dict(ledger))
    runner.load_device_state(device)
    runner.edit_buckets = {k: v for k, v in header["edit_buckets"]}
    tree, nodes = header.get("tree"), None
    if tree is not None:
        nodes = load_tree_state(engine.cache, tree)
    if runner.host_kv is not None:
        with np.load(folder / HOST_KV) as saved:
            _load_host_pages(engine, dict(saved))
    with np.load(folder / REQUESTS) as arrays:
        load_engine_state(engine, header["engine"], arrays, nodes)


def _restore_resized(engine, folder: Path, header: dict) -> dict:
    """The prefix cache alone into pools of other sizes, evicted by LRU to fit (resize.py)."""
    saved = _read_device(folder, saved_template(engine, header))
    got = restore_resized(engine, header, saved)
    unfinished = [r for r in header["engine"]["requests"] if r["status"] in ("running", "waiting")]
    return dict(got, requests=0, dropped_requests=len(unfinished))


def _read_device(folder: Path, like: dict) -> dict:
    """The snapshot's device state, read into arrays shaped and placed as `like`'s leaves."""
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _nonempty(like)
    )
    saved = _checkpointer().restore((folder / DEVICE).resolve(), target)
    leaves, structure = jax.tree.flatten(like)
    return jax.tree.unflatten(
        structure, [saved.get(_leaf_name(i), x) for i, x in enumerate(leaves)]
    )


class Snapshots:
    """What `Engine.snapshot` and `Engine.restore` call (`engine_for` gives it to each engine
    with a model on the device)."""

    save = staticmethod(save_state)
    restore = staticmethod(restore_state)


def drop_requests(engine) -> None:
    """Abort every request not done and forget them all, giving back what they held (the
    prefix cache keeps what it caches); the device follows at once."""
    for req in list(engine.requests.values()):
        if not req.done:
            engine.scheduler.abort(req, "dropped at restore")
    engine.requests.clear()
    engine.flush()


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


SAMPLE = 4096  # values per parameter the fingerprint reads


@jax.jit
def _sums(params):
    """A fingerprint of the weights' values: per parameter, two sums (uint32, wrapping) of a
    hash of each sampled value's bits mixed with its place in the sample (a strided grid of at
    most `SAMPLE` values, first and last rows included). Integer sums are associative, so the
    same weights give the same fingerprint however they are split over devices and processes
    (a float sum would not: the reduction order follows the sharding); the hash makes a change
    that shifts every value's bits alike (weights doubled) or moves values change the sums,
    where a plain sum of bits wraps to the same total. A sample, not every value: XLA:CPU
    fuses no integer reduction with its producers, so a whole gpt-oss-20b read this way took
    14 GiB of temporaries; a grid of 4,096 values per tensor tells other weights apart (other
    training, other checkpoints), not an edit of one unsampled value. Every weight dtype
    widens exactly to float32 or int32 first."""
    jnp = jax.numpy
    out = []
    for x in params:
        x = _grid(x)
        wide = x.astype(jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int32)
        bits = jax.lax.bitcast_convert_type(wide, jnp.uint32).reshape(-1)
        place = jnp.arange(bits.shape[0], dtype=jnp.uint32)
        for seed in (0x9E3779B9, 0x85EBCA6B):
            out.append(_mix(bits ^ (place * jnp.uint32(seed))).sum(dtype=jnp.uint32))
    return jnp.stack(out)


def _grid(x):
    """At most `SAMPLE` values of `x` on a strided grid, each axis's last index included."""
    per_axis = max(2, int(SAMPLE ** (1 / max(1, x.ndim))))
    for axis, n in enumerate(x.shape):
        if n > per_axis:
            step = -(-(n - 1) // (per_axis - 1))
            index = list(range(0, n - 1, step)) + [n - 1]
            x = jax.numpy.take(x, jax.numpy.asarray(index), axis=axis)
    return x


def _mix(h):
    """A 32-bit integer hash (xor-shift-multiply rounds): nearby inputs, far-apart outputs."""
    u32 = jax.numpy.uint32
    h = (h ^ (h >> u32(16))) * u32(0x45D9F3B)
    h = (h ^ (h >> u32(16))) * u32(0x45D9F3B)
    return h ^ (h >> u32(16))


def _nonempty(device: dict) -> dict:
    """The device state's leaves that hold anything, by their place in it: orbax refuses an
    empty array (an all-SWA engine's full pools have no slots), and the restoring engine, built
    the same way, has the same empty ones."""
    leaves = jax.tree.leaves(device)
    return {_leaf_name(i): x for i, x in enumerate(leaves) if x.size}


def _leaf_name(i: int) -> str:
    return f"leaf{i:04d}"


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()
