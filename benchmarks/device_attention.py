"""Compiled Pallas attention kernels on a GPU or TPU: check them, measure their bandwidth.

    python benchmarks/device_attention.py [--json]            # on a GPU / TPU machine, < 5 min
    python benchmarks/device_attention.py --small --interpret # anywhere (a smoke run on CPU)

Decode at batch 64, T = 32K cached tokens per sequence, 8 KV heads x 8 query heads each, head dim
128, bf16, page size 16, permuted page tables: a full layer (reads every page) and a sliding
layer (W = 128). Prints the kernel time and the achieved memory bandwidth (K and V bytes the
kernel must read / time), after checking the output against the jnp reference on a few
sequences. On a Hopper or newer GPU both GPU front ends run side by side (Mosaic GPU, the
engine's default there, and Triton); `--backend` picks one. The smoke run interprets the
Triton-style front end and, with JAX's GPU interpreter, the Mosaic GPU one.
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
    parser.add_argument("--backend", choices=("gpu", "mosaic_gpu", "tpu"), default=None)
    parser.add_argument("--smoke", action="store_true", help="--small --interpret (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.small = args.interpret = True
    backends = [args.backend] if args.backend else _front_ends(args.interpret)
    batch, seq, hkv, g, d, ps = (2, 64, 2, 2, 64, 16) if args.small else (64, 32768, 8, 8, 128, 16)
    window = 24 if args.small else 128
    q, k, v, table, first, seq_lens = _inputs(batch, seq, hkv, g, d, ps, np.random.default_rng(0))
    results = dict(device=str(jax.devices()[0]), batch=batch, seq=seq, front_ends={})
    for backend in backends:
        results["front_ends"][backend] = _measure(
            backend, args, (q, k, v, table, first, seq_lens), window
        )
    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['device']}: decode, batch {batch}, T = {seq}")
    for backend, kinds in results["front_ends"].items():
        for kind, r in kinds.items():
            print(
                f"  {backend:10} {kind:8} {r['ms']:9.3f} ms  {r['gb_per_s']:8.1f} GB/s  "
                f"rel err {r['rel_err']:.1e}"
            )


def _front_ends(interpret: bool) -> list[str]:
    """The decode kernel's front ends for this machine: the TPU one; on a GPU, Mosaic GPU
    (Hopper and newer) beside Triton; interpreted on CPU, both GPU ones."""
    from swajax import platform

    if jax.default_backend() == "tpu":
        return ["tpu"]
    if interpret or platform.mosaic_gpu():
        return ["mosaic_gpu", "gpu"]
    return ["gpu"]


def _measure(backend: str, args, inputs, window: int) -> dict:
    q, k, v, table, first, seq_lens = inputs
    batch, seq, hkv, d = q.shape[0], int(seq_lens[0]), q.shape[1], q.shape[3]
    out = {}
    for kind, w in (("full", 0), ("sliding", window)):
        kw = dict(kind=kind, window=w, scale=d**-0.5, backend=backend, interpret=args.interpret)
        n = min(batch, 4)  # the reference gathers every page: check a few sequences
        check = (q[:n], k, v, table[:n], first[:n], seq_lens[:n])
        ref_kw = {key: kw[key] for key in ("kind", "window", "scale")}
        ref = paged_decode_reference(*check, **ref_kw).astype(jnp.float32)
        got = paged_decode(*check, **kw)
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
        seconds = _time(
            lambda kw=kw: paged_decode(q, k, v, table, first, seq_lens, **kw),
            2 if args.small else 20,
        )
        keys = seq if kind == "full" else min(seq, w + 1)
        read = batch * keys * hkv * d * 2 * k.dtype.itemsize  # K and V
        out[kind] = dict(ms=seconds * 1e3, rel_err=err, gb_per_s=read / seconds / 1e9)
        assert err < 2e-2, f"{backend} {kind}: relative error {err} against the reference"
    return out


if __name__ == "__main__":
    main()
