"""Routed experts vs every expert on every token, GPT-OSS-shaped MoE block, CPU.

    python benchmarks/moe.py [--json] [--tokens 256] [--hidden 2880] [--repeats 3] [--bound]
                             [--dtype bfloat16]

gpt-oss-20b's block: 32 experts of width 2880, top-4, hidden 2880, float32; 256 tokens (a
prefill chunk). Both paths run jitted, interleaved, best of `--repeats`; the outputs are compared
(same routing, relative error printed). A third row runs the routed path over the same experts
kept as MXFP4 blocks (GPT-OSS as published), dequantizing each routed block's expert inside the
jit. The ratios are the numbers to read: these machines are noisy.

`--bound` times what bounds the routed loop instead: one block per expert, [block, H] x [H, 2H]
each, in a loop reading the stacked [E, H, 2H] weights whole (`w[e]`), the same loop reading
them a cache-sized chunk of rows at a time (as `experts.routed` does), the loop choosing among
E separate weight buffers (`lax.switch`), and one product of all the rows with one expert's
weights (the same arithmetic as a single large GEMM).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from swajax.models import experts as ex, quantized


def gpt_oss_act(h, limit=7.0, alpha=1.702):
    gate = jnp.minimum(h[..., 0::2], limit)
    up = jnp.clip(h[..., 1::2], -limit, limit)
    return (up + 1) * gate * jax.nn.sigmoid(gate * alpha)


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--hidden", type=int, default=2880)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--block", type=int, default=None, help="rows per block (default: automatic)")
    p.add_argument("--dtype", default="float32", help="what the MXFP4 products run in")
    p.add_argument("--json", action="store_true")
    p.add_argument("--bound", action="store_true", help="time the loop's weight reads instead")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args(argv)
    if a.smoke:
        a.tokens, a.hidden, a.experts, a.top_k, a.repeats = 16, 64, 8, 2, 1
        weights_bound(a)  # both paths, tiny
    if a.bound:
        return weights_bound(a)
    t, h, e, k = a.tokens, a.hidden, a.experts, a.top_k
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(t, h)), jnp.float32)

    def mxfp4(din, dout):  # random codes, scales 2^-6: values within +-0.09
        blocks = rng.integers(0, 256, (e, dout, din // 32, 16), dtype=np.uint8)
        scales = np.full((e, dout, din // 32), 127 - 6, np.uint8)
        return quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), a.dtype)

    packed = ex.Experts(
        mxfp4(h, 2 * h),
        jnp.asarray(rng.normal(size=(e, 2 * h)) * 0.02, jnp.float32),
        mxfp4(h, h),
        jnp.asarray(rng.normal(size=(e, h)) * 0.02, jnp.float32),
    )
    # The float rows run the very values the MXFP4 row holds, dequantized once up front.
    weights = packed._replace(w1=jax.jit(packed.w1.dense)(), w2=jax.jit(packed.w2.dense)())
    router = jnp.asarray(rng.normal(size=(h, e)), jnp.float32)

    def routing(x):
        top, idx = jax.lax.top_k(x @ router, k)
        return ex.Routing(idx, None, jax.nn.softmax(top, -1))

    dense = jax.jit(lambda x, w: ex.dense(x, routing(x), w, gpt_oss_act))
    routed = jax.jit(lambda x, w: ex.routed(x, routing(x), w, gpt_oss_act, block=a.block))
    runs = (("dense", dense, weights), ("routed", routed, weights), ("mxfp4", routed, packed))
    calls = {name: functools.partial(fn, x, w) for name, fn, w in runs}
    outs = {name: jax.block_until_ready(call()) for name, call in calls.items()}  # compiles
    best = _best(calls, a.repeats)

    def err(name):
        return float(jnp.max(jnp.abs(outs[name] - outs["dense"])) / jnp.max(jnp.abs(outs["dense"])))

    result = {
        "shape": dict(tokens=t, hidden=h, experts=e, top_k=k),
        "dense_s": best["dense"],
        "routed_s": best["routed"],
        "routed_mxfp4_s": best["mxfp4"],
        "speedup": best["dense"] / best["routed"],
        "mxfp4_speedup": best["dense"] / best["mxfp4"],
        "rel_err": err("routed"),
        "mxfp4_rel_err": err("mxfp4"),
        "backend": jax.default_backend(),
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(
            f"{t} tokens, {e} experts x {h}, top-{k} on {result['backend']}: dense "
            f"{best['dense']:.3f} s, routed {best['routed']:.3f} s, {result['speedup']:.2f}x "
            f"faster (rel err {result['rel_err']:.1e}); routed over MXFP4 experts "
            f"{best['mxfp4']:.3f} s, {result['mxfp4_speedup']:.2f}x (rel err "
            f"{result['mxfp4_rel_err']:.1e})"
        )


def _best(fns: dict, repeats: int) -> dict:
    """Best seconds of each call over `repeats` interleaved rounds, after one untimed round."""
    for fn in fns.values():  # compiles
        jax.block_until_ready(fn())
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):  # interleaved
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def weights_bound(a) -> None:
    """One [block, H] x [H, 2H] product per expert four ways (see the module's docstring)."""
    e, h = a.experts, a.hidden
    block = ex.block_rows(a.tokens * a.top_k, e)
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(e, h, 2 * h)) * 0.02, jnp.float32)
    separate = [w[i] for i in range(e)]  # E buffers of their own, made once
    x = jnp.asarray(rng.normal(size=(e * block, h)), jnp.float32)
    order = jnp.arange(e, dtype=jnp.int32)

    def loop(x, pick):
        def body(b, out):
            rows = jax.lax.dynamic_slice_in_dim(x, b * block, block)
            return jax.lax.dynamic_update_slice_in_dim(out, pick(b, rows), b * block, 0)

        return jax.lax.fori_loop(0, e, body, jnp.zeros((e * block, 2 * h), jnp.float32))

    @jax.jit
    def stacked(x, w, order):
        return loop(x, lambda b, rows: rows @ w[order[b]])

    @jax.jit
    def chunked(x, w, order):
        return loop(x, lambda b, rows: ex.expert_product(rows, w, order[b]))

    @jax.jit
    def switched(x, ws, order):
        branches = [lambda rows, i=i: rows @ ws[i] for i in range(e)]
        return loop(x, lambda b, rows: jax.lax.switch(order[b], branches, rows))

    one = jax.jit(lambda x, w: x @ w[0])
    best = _best(
        dict(
            stacked=lambda: stacked(x, w, order),
            chunked=lambda: chunked(x, w, order),
            separate=lambda: switched(x, separate, order),
            one=lambda: one(x, w),
        ),
        a.repeats,
    )
    print(
        f"{e} blocks of {block} rows x [{h}, {2 * h}] on {jax.default_backend()}: stacked "
        f"weights whole {best['stacked']:.3f} s, in chunks {best['chunked']:.3f} s, separate "
        f"buffers {best['separate']:.3f} s, one "
        f"product of all rows {best['one']:.3f} s"
    )


if __name__ == "__main__":
    main()
