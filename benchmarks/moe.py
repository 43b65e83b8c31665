"""Routed experts vs every expert on every token, GPT-OSS-shaped MoE block, CPU.

    python benchmarks/moe.py [--json] [--tokens 256] [--hidden 2880] [--repeats 3]

gpt-oss-20b's block: 32 experts of width 2880, top-4, hidden 2880, float32; 256 tokens (a
prefill chunk). Both paths run jitted, interleaved, best of `--repeats`; the outputs are compared
(same routing, relative error printed). A third row runs the routed path over the same experts
kept as MXFP4 blocks (GPT-OSS as published), dequantizing each routed block's expert inside the
jit. The ratios are the numbers to read: these machines are noisy.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args(argv)
    if a.smoke:
        a.tokens, a.hidden, a.experts, a.top_k, a.repeats = 16, 64, 8, 2, 1
    t, h, e, k = a.tokens, a.hidden, a.experts, a.top_k
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(t, h)), jnp.float32)

    def mxfp4(din, dout):  # random codes, scales 2^-6: values within +-0.09
        blocks = rng.integers(0, 256, (e, dout, din // 32, 16), dtype=np.uint8)
        scales = np.full((e, dout, din // 32), 127 - 6, np.uint8)
        return quantized.Mxfp4(jnp.asarray(blocks), jnp.asarray(scales), "float32")

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
    times = {name: [] for name, _, _ in runs}
    outs = {}
    for _ in range(a.repeats + 1):  # the first round compiles
        for name, fn, w in runs:
            start = time.perf_counter()
            outs[name] = jax.block_until_ready(fn(x, w))
            times[name].append(time.perf_counter() - start)
    best = {name: min(ts[1:]) for name, ts in times.items()}

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
        print(f"{t} tokens, {e} experts x {h}, top-{k} on {result['backend']}: dense "
              f"{best['dense']:.3f} s, routed {best['routed']:.3f} s, {result['speedup']:.2f}x "
              f"faster (rel err {result['rel_err']:.1e}); routed over MXFP4 experts "
              f"{best['mxfp4']:.3f} s, {result['mxfp4_speedup']:.2f}x (rel err "
              f"{result['mxfp4_rel_err']:.1e})")  # fmt: skip


if __name__ == "__main__":
    main()
