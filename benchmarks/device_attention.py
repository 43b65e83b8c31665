"""Compiled Pallas attention kernels on a GPU or TPU: check them, measure their bandwidth.

    python benchmarks/device_attention.py [--json]            # on a GPU / TPU machine, < 5 min
    python benchmarks/device_attention.py --small --interpret # anywhere (a smoke run on CPU)

Decode at batch 64, T = 32K cached tokens per sequence, 8 KV heads x 8 query heads each, head dim
128, bf16, page size 16, permuted page tables: a full layer (reads every page) and a sliding
layer (W = 128). Prints the kernel time and the achieved memory bandwidth (K and V bytes the
kernel must read / time), after checking both front-end outputs against the jnp reference on
a few sequences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from swajax.kernels.paged_decode import paged_decode, paged_decode_reference


def _inputs(batch, seq, hkv, g, d, ps, rng):
    cols = -(-seq // ps)
    pages = batch * cols + 1
    table = (rng.permutation(pages - 1)[: batch * cols] + 1).reshape(batch, cols).astype(np.int32)
    k = jax.random.normal(jax.random.key(0), (pages, ps, hkv, d), jnp.bfloat16)
    v = jax.random.normal(jax.random.key(1), (pages, ps, hkv, d), jnp.bfloat16)
    q = jax.random.normal(jax.random.key(2), (batch, hkv, g, d), jnp.bfloat16)
    zeros = jnp.zeros(batch, jnp.int32)
    return q, k, v, jnp.asarray(table), zeros, jnp.full(batch, seq, jnp.int32)


def _time(fn, iters):
    jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--small", action="store_true", help="tiny shapes (smoke run)")
    parser.add_argument("--interpret", action="store_true", help="Pallas interpret mode")
    parser.add_argument("--backend", choices=("gpu", "tpu"), default=None)
    parser.add_argument("--smoke", action="store_true", help="--small --interpret (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.small = args.interpret = True
    backend = args.backend or ("tpu" if jax.default_backend() == "tpu" else "gpu")
    batch, seq, hkv, g, d, ps = (2, 64, 2, 2, 16, 4) if args.small else (64, 32768, 8, 8, 128, 16)
    window = 8 if args.small else 128
    q, k, v, table, first, seq_lens = _inputs(batch, seq, hkv, g, d, ps, np.random.default_rng(0))
    results = dict(device=str(jax.devices()[0]), backend=backend, batch=batch, seq=seq)
    for kind, w in (("full", 0), ("sliding", window)):
        kw = dict(kind=kind, window=w, scale=d**-0.5)
        n = min(batch, 4)  # the reference gathers every page: check a few sequences
        check = (q[:n], k, v, table[:n], first[:n], seq_lens[:n])
        ref = paged_decode_reference(*check, **kw).astype(jnp.float32)
        got = paged_decode(*check, backend=backend, interpret=args.interpret, **kw)
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
        seconds = _time(
            lambda kw=kw: paged_decode(
                q, k, v, table, first, seq_lens, backend=backend, interpret=args.interpret, **kw
            ),
            2 if args.small else 20,
        )
        keys = seq if kind == "full" else min(seq, w + 1)
        read = batch * keys * hkv * d * 2 * k.dtype.itemsize  # K and V
        results[kind] = dict(ms=seconds * 1e3, rel_err=err, gb_per_s=read / seconds / 1e9)
        assert err < 2e-2, f"{kind}: relative error {err} against the reference"
    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['device']} ({backend} front end): decode, batch {batch}, T = {seq}")
    for kind in ("full", "sliding"):
        r = results[kind]
        print(
            f"  {kind:8} {r['ms']:9.3f} ms  {r['gb_per_s']:8.1f} GB/s  rel err {r['rel_err']:.1e}"
        )


if __name__ == "__main__":
    main()
