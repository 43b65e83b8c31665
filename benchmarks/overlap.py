"""Overlap scheduling on vs off: the embedded demo model, same run, alternating repeats.

    python benchmarks/overlap.py [--requests 8] [--prompt-len 32] [--new 128] [--repeats 3]
        [--decode-steps 1,8]

Greedy generation of `--requests` prompts (decode-heavy, where overlap applies); compiled
beforehand. For each multi-step setting (1: plain steps; 8: rounds of 8, the default) and
mode: output tokens per second (best of the repeats), and per step the host time (scheduling,
planning, packing, taking results) and the time the host waited for the device. Without overlap
a step costs host + wait; with it the host plans step n + 1 while step n runs, so a step should
cost about max(host, device).
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
        for obj, name in (
            (sched, "schedule"),
            (sched, "plan_ahead"),
            (sched, "postprocess"),
            (runner, "_prepare"),
        ):
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


def run(decoder, prompts, new: int, overlap: bool, steps: int = 1):
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg, sizing.gib_to_bytes(0.05), ratio=0.5, page_size=16, dtype="fp32"
    )
    options = EngineOptions(
        max_running=len(prompts), max_context=2048, overlap=overlap, decode_steps=steps
    )
    engine = engine_for(cfg, HybridLM(decoder, dtype="fp32"), sizes, options)
    clock = Clock(engine)
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=new))
    t0 = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - t0
    steps = len(engine.metrics)
    tokens = sum(len(r.output) for r in engine.requests.values())
    outputs = [r.output for r in engine.requests.values()]
    return dict(
        tokens_per_s=tokens / seconds,
        step_ms=1e3 * seconds / steps,
        host_ms=1e3 * clock.host / steps,
        wait_ms=1e3 * clock.wait / steps,
        ahead=engine.launched_ahead,
        steps=steps,
        outputs=outputs,
    )


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", default="1,8", help="multi-step settings to run")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.new, args.repeats = 2, 8, 1
    # float32, as its figures in benchmarks/README.md were measured (the demo is bfloat16)
    decoder = demo_decoder(dtype="float32")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(32, 127, args.prompt_len).tolist() for _ in range(args.requests)]
    modes = [(n, overlap) for n in map(int, args.decode_steps.split(",")) for overlap in (0, 1)]
    for n, overlap in modes:  # compile every mode's programs first
        run(decoder, prompts, args.new, bool(overlap), n)
    best = {}
    for _ in range(args.repeats):
        for mode in modes:
            r = run(decoder, prompts, args.new, bool(mode[1]), mode[0])
            if mode not in best or r["tokens_per_s"] > best[mode]["tokens_per_s"]:
                best[mode] = r
    print(f"{args.requests} requests x {args.new} new tokens, demo model, best of {args.repeats}")
    print(f"{'decode steps':16}" + "".join(f"{n:>14}" for n, _ in modes))
    print(f"{'overlap':16}" + "".join(f"{'on' if o else 'off':>14}" for _, o in modes))
    for key in ("tokens_per_s", "step_ms", "host_ms", "wait_ms", "steps", "ahead"):
        row = [best[m][key] for m in modes]
        fmt = "{:>14.2f}" if isinstance(row[0], float) else "{:>14,}"
        print(f"{key:16}" + "".join(fmt.format(v) for v in row))
    same = all(best[m]["outputs"] == best[modes[0]]["outputs"] for m in modes)
    for n in dict(modes):
        ratio = best[n, 1]["tokens_per_s"] / best[n, 0]["tokens_per_s"]
        print(f"decode steps {n}: tokens / s on / off {ratio:.2f}x")
    print(f"outputs identical: {same}")


if __name__ == "__main__":
    main()
