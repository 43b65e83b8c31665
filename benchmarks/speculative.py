"""Speculative decoding with the target as its own draft (every proposal accepted) vs without:
the embedded demo model, same run.

    python benchmarks/speculative.py [--requests 4] [--new 96] [--ks 1,3,5]

Greedy generation, compiled beforehand. For each k: output tokens per target (decode) step,
output tokens per second, and whether the outputs equal plain decoding's. With acceptance 1 a
round yields k + 1 tokens; its cost is k + 1 draft forwards and one target extend of k + 1 rows,
so on a CPU, where the demo's target costs what its draft costs, tokens per second need not
rise: the figure that carries over is tokens per target step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from swajax import sizing
from swajax.api import engine_for
from swajax.demo import demo_decoder
from swajax.models.decoder import HybridLM
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams


def run(decoder, prompts, new: int, k: int):
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(0.05),
        ratio=0.5,
        page_size=16,
        dtype="fp32",
        draft=cfg if k else None,
    )
    model = HybridLM(decoder, dtype="fp32")
    # Against plain steps (decode_steps=1): what one verify round buys over one decode step.
    options = EngineOptions(
        max_running=len(prompts), max_context=2048, num_speculative_tokens=k, decode_steps=1
    )
    engine = engine_for(cfg, model, sizes, options, draft=model if k else None)
    rids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=new)) for p in prompts]
    t0 = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - t0
    decode_steps = sum(1 for m in engine.metrics if m.kind == "decode")
    outputs = [engine.requests[r].output for r in rids]
    tokens = sum(len(o) for o in outputs)
    per_step = (tokens - len(prompts)) / max(decode_steps, 1) / len(prompts)
    return dict(tokens_per_step=per_step, tokens_per_s=tokens / seconds, outputs=outputs)


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--ks", default="1,3,5")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.new, args.ks = 1, 8, "2"
    # float32, as its figures in benchmarks/README.md were measured (the demo is bfloat16)
    decoder = demo_decoder(dtype="float32")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(32, 127, args.prompt_len).tolist() for _ in range(args.requests)]
    ks = [0] + [int(k) for k in args.ks.split(",")]
    for k in ks:  # compile
        run(decoder, prompts, 8, k)
    rows = {k: run(decoder, prompts, args.new, k) for k in ks}
    print(f"{args.requests} requests x {args.new} new tokens, demo model as its own draft")
    print(f"{'k':>4}{'tokens/request/step':>22}{'tokens/s':>12}{'same outputs':>14}")
    for k, r in rows.items():
        same = r["outputs"] == rows[0]["outputs"]
        print(f"{k:>4}{r['tokens_per_step']:>22.2f}{r['tokens_per_s']:>12.1f}{same!s:>14}")


if __name__ == "__main__":
    main()
