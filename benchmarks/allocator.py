"""Allocator benchmark: the jitted allocator against the plain-Python model, side by side.

    python benchmarks/allocator.py [--json] [--iters N]

Prints the median microseconds per call (after warm-up) of alloc_decode (64 and 256 running
requests, page sizes 1, 16, 64, sequence lengths 1k-32k), alloc_extend (8 requests x 2,048 new
tokens) and free_swa (a page-aligned 128-token span of each of 64 requests in one call, passed as
one slot per page as runtime eviction does), for swajax and for
the Python model of tests/helpers/allocator_model.py measured in the same run, with the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from allocator_model import ModelAllocator  # noqa: E402

from swajax.memory import allocator as A  # noqa: E402


def median_us(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


class Requests:
    """Both allocators holding the same running requests (full slot of every position)."""

    def __init__(self, lens, ps, spare_tokens):
        # A serving pool is not full: the requests occupy about three quarters of it.
        used = int(sum(-(-n // ps) * ps for n in lens))
        total = -(-(max(used * 4 // 3, used + spare_tokens)) // ps) * ps
        self.state = A.init_allocator(total, total, ps)
        self.model = ModelAllocator(total, total, ps)
        zeros, minus = [0] * len(lens), [-1] * len(lens)
        self.state, res = A.alloc_extend(self.state, zeros, lens, minus)
        status, full, _ = self.model.alloc_extend(zeros, list(lens), minus)
        assert int(res.status) == status == A.OK
        flat = np.asarray(res.full_slots)[: sum(lens)]
        assert flat.tolist() == full
        self.rows = np.split(flat, np.cumsum(lens)[:-1])
        self.lens = np.asarray(lens, np.int32)


def bench_decode(n_reqs, ps, iters, rng):
    reqs = Requests(
        rng.integers(1024, 32768, n_reqs).tolist(), ps, spare_tokens=n_reqs * (iters + 8) * ps
    )
    last = np.array([row[-1] for row in reqs.rows], np.int32)
    seq = reqs.lens.copy()
    box = {"state": reqs.state, "last": last, "seq": seq}

    def jitted():
        box["seq"] = box["seq"] + 1
        box["state"], res = A.alloc_decode(box["state"], box["seq"], box["last"])
        box["last"] = res.full_slots[:n_reqs]
        jax.block_until_ready(box["last"])

    mbox = {"last": last.tolist(), "seq": seq.tolist()}

    def model():
        mbox["seq"] = [s + 1 for s in mbox["seq"]]
        status, full, _ = reqs.model.alloc_decode(mbox["seq"], mbox["last"])
        mbox["last"] = full

    return median_us(jitted, iters), median_us(model, iters)


def bench_extend(ps, iters, rng):
    n, new = 8, 2048
    total = (iters + 8) * n * (new + ps) * 4 // 3 // ps * ps
    state = A.init_allocator(total, total, ps)
    model = ModelAllocator(total, total, ps)
    box = {"state": state}
    zeros, lens, minus = [0] * n, [new] * n, [-1] * n

    def jitted():
        box["state"], res = A.alloc_extend(box["state"], zeros, lens, minus)
        jax.block_until_ready(res.full_slots)

    return median_us(jitted, iters), median_us(
        lambda: model.alloc_extend(zeros, lens, minus), iters
    )


def bench_free_swa(ps, iters, rng):
    n, span = 64, 128
    reqs = Requests([span * (iters + 4)] * n, ps, spare_tokens=0)
    box = {"i": 0, "state": reqs.state}

    def spans():
        i = box["i"]
        box["i"] += 1
        # As runtime eviction calls it: the span is page aligned, so one slot per page suffices.
        return np.concatenate([row[i * span : (i + 1) * span : ps] for row in reqs.rows])

    def jitted():
        box["state"] = A.free_swa(box["state"], spans())
        jax.block_until_ready(box["state"].swa.count)

    jit_us = median_us(jitted, iters)
    box["i"] = 0
    return jit_us, median_us(lambda: reqs.model.free_swa(spans().tolist()), iters)


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    if args.smoke:
        args.iters = 2
    for ps in (16,) if args.smoke else (1, 16, 64):
        for n in (64,) if args.smoke else (64, 256):
            rows.append((f"alloc_decode {n} reqs", ps, *bench_decode(n, ps, args.iters, rng)))
        rows.append(("alloc_extend 8 x 2048", ps, *bench_extend(ps, args.iters, rng)))
        rows.append(("free_swa 64 x 128", ps, *bench_free_swa(ps, args.iters, rng)))
    results = [
        dict(
            op=op,
            page_size=ps,
            swajax_us=round(j, 1),
            python_model_us=round(m, 1),
            speedup=round(m / j, 2),
        )
        for op, ps, j, m in rows
    ]
    if args.json:
        print(json.dumps({"jax": jax.__version__, "results": results}))
        return
    print(f"{'operation':24} {'ps':>3} {'swajax us':>10} {'model us':>10} {'model/swajax':>12}")
    for r in results:
        print(
            f"{r['op']:24} {r['page_size']:>3} {r['swajax_us']:>10.1f} "
            f"{r['python_model_us']:>10.1f} {r['speedup']:>12.2f}"
        )


if __name__ == "__main__":
    main()
