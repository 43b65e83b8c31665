"""Overlap scheduling on vs off: the embedded demo model, same run, alternating repeats.

    python benchmarks/overlap.py [--requests 8] [--prompt-len 32] [--new 128] [--repeats 3]

Greedy generation of `--requests` prompts (decode-heavy, where overlap applies); compiled
beforehand. For each mode: output tokens per second (best of the repeats), and per step the
host time (scheduling, planning, packing, taking results) and the time the host waited for the
device. Without overlap a step costs host + wait; with it the host plans step n + 1 while step
n runs, so a step should cost about max(host, device).
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


class Clock:
    """Wall time spent inside wrapped host methods, and inside the runner's reads."""

    def __init__(self, engine):
        self.host = self.wait = 0.0
        sched, runner = engine.scheduler, engine.runner
        for obj, name in ((sched, "schedule"), (sched, "plan_ahead"), (sched, "postprocess"),
                          (runner, "_prepare")):  # fmt: skip
            setattr(obj, name, self._timed(getattr(obj, name), "host"))
        runner.collect = self._timed(runner.collect, "wait")

    def _timed(self, fn, field):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t0)

        return call


def run(decoder, prompts, new: int, overlap: bool):
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(cfg, sizing.gib_to_bytes(0.05), ratio=0.5, page_size=16,
                               dtype="fp32")  # fmt: skip
    # Plain steps (decode_steps=1): overlap plans a plain step while the one before runs.
    options = EngineOptions(max_running=len(prompts), max_context=2048, overlap=overlap,
                            decode_steps=1)  # fmt: skip
    engine = engine_for(cfg, HybridLM(decoder, dtype="fp32"), sizes, options)
    clock = Clock(engine)
    for p in prompts:
        engine.add_request(p, SamplingParams(max_new_tokens=new))
    t0 = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - t0
    steps = len(engine.metrics)
    tokens = sum(len(r.output) for r in engine.requests.values())
    outputs = [r.output for r in engine.requests.values()]
    return dict(tokens_per_s=tokens / seconds, step_ms=1e3 * seconds / steps,
                host_ms=1e3 * clock.host / steps, wait_ms=1e3 * clock.wait / steps,
                ahead=engine.launched_ahead, steps=steps, outputs=outputs)  # fmt: skip


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.new, args.repeats = 2, 8, 1
    decoder = demo_decoder()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(32, 127, args.prompt_len).tolist() for _ in range(args.requests)]
    for overlap in (False, True):  # compile both modes' programs first
        run(decoder, prompts, 8, overlap)
    best = {}
    for _ in range(args.repeats):
        for overlap in (False, True):
            r = run(decoder, prompts, args.new, overlap)
            if overlap not in best or r["tokens_per_s"] > best[overlap]["tokens_per_s"]:
                best[overlap] = r
    off, on = best[False], best[True]
    print(f"{args.requests} requests x {args.new} new tokens, demo model, best of {args.repeats}")
    print(f"{'':16}{'overlap off':>14}{'overlap on':>14}")
    for key in ("tokens_per_s", "step_ms", "host_ms", "wait_ms", "steps", "ahead"):
        fmt = "{:>14.2f}" if isinstance(off[key], float) else "{:>14,}"
        print(f"{key:16}" + fmt.format(off[key]) + fmt.format(on[key]))
    print(f"tokens / s on / off: {on['tokens_per_s'] / off['tokens_per_s']:.2f}x; outputs "
          f"identical: {on['outputs'] == off['outputs']}")  # fmt: skip


if __name__ == "__main__":
    main()
