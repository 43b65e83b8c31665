"""Attention benchmark on the CPU XLA path: an SWA layer against a full layer, side by side.

    python benchmarks/attention.py [--json] [--quick]

Decode: batch 8, 8 KV heads (8 query heads), head dim 64, W = 128, page size 16: the time of a
sliding layer over the time of a full layer at T = 4K, 16K, 32K cached tokens (the ideal is about
2W/T). Prefill: one request of T = 4K and 16K new tokens; the growth of each kind's time from 4K
to 16K (a sliding layer should grow about 4x, a full layer about 16x).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from swajax.attention import as_pages, attention, build_metadata
from swajax.config import LayerKind, LayerSpec
from swajax.memory import allocator as A, req_to_token as R

W, PS, HKV, D = 128, 16, 8, 64
FULL, SLIDING = LayerSpec(LayerKind.FULL), LayerSpec(LayerKind.SLIDING, W)


def median_s(fn, iters):
    fn()  # compile
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def setup(batch, cached, new):
    """Pools holding `cached` tokens per request, then `new` tokens being extended."""
    total = batch * (cached + new)
    size = -(-total // PS) * PS + PS * batch
    alloc = A.init_allocator(size, size, PS)
    r2t = R.ReqToToken.init(batch, cached + new + PS)
    rows = np.arange(batch)
    alloc, res = A.alloc_extend(alloc, [0] * batch, [cached + new] * batch, [-1] * batch)
    r2t = R.write(r2t, rows, [0] * batch, [cached + new] * batch, res.full_slots)
    meta = build_metadata(r2t, alloc, rows, [cached] * batch, [cached + new] * batch, window=W)
    rng = np.random.default_rng(0)
    rows_total = size + PS
    pool = jnp.asarray(rng.normal(size=(rows_total, HKV, D)), jnp.bfloat16)
    pages = as_pages(pool, PS)
    q = jnp.asarray(rng.normal(size=(meta.num_tokens, HKV, D)), jnp.bfloat16)
    return meta, pages, q


def time_layer(meta, pages, q, layer, iters):
    fn = jax.jit(functools.partial(attention, layer=layer, scale=D**-0.5))
    return median_s(lambda: fn(q, pages, pages, meta), iters)


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smaller T")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    lengths = (1024, 2048, 4096) if args.quick else (4096, 16384, 32768)
    lengths = (256, 512) if args.smoke else lengths
    iters = 1 if args.smoke else 10
    decode = []
    for t in lengths:
        meta, pages, q = setup(8, t - 1, 1)
        full = time_layer(meta, pages, q, FULL, iters)
        swa = time_layer(meta, pages, q, SLIDING, iters)
        decode.append(
            dict(
                T=t, full_ms=full * 1e3, swa_ms=swa * 1e3, swa_over_full=swa / full, ideal=2 * W / t
            )
        )
        del meta, pages, q
    prefill = {}
    for t in (256, 1024) if args.smoke else (1024, 4096) if args.quick else (4096, 16384):
        meta, pages, q = setup(1, 0, t)
        prefill[t] = {
            name: time_layer(meta, pages, q, layer, min(iters, 2))
            for name, layer in (("full", FULL), ("swa", SLIDING))
        }
    small, large = sorted(prefill)
    growth = {kind: prefill[large][kind] / prefill[small][kind] for kind in ("full", "swa")}
    result = dict(
        jax=jax.__version__,
        decode=decode,
        prefill_s=prefill,
        prefill_growth=dict(growth, length_ratio=large / small),
    )
    if args.json:
        print(json.dumps(result))
        return
    print(f"decode, batch 8, {HKV} KV heads, head dim {D}, W = {W}, page size {PS}:")
    print(f"{'T':>7} {'full ms':>9} {'SWA ms':>9} {'SWA/full':>9} {'2W/T':>7}")
    for r in decode:
        print(
            f"{r['T']:>7} {r['full_ms']:>9.2f} {r['swa_ms']:>9.3f} {r['swa_over_full']:>9.4f} "
            f"{r['ideal']:>7.4f}"
        )
    print(f"prefill of one request, T {small} -> {large} ({large // small}x tokens):")
    for kind in ("full", "swa"):
        print(
            f"  {kind:4}: {prefill[small][kind]:.3f} s -> {prefill[large][kind]:.3f} s "
            f"({growth[kind]:.1f}x)"
        )


if __name__ == "__main__":
    main()
