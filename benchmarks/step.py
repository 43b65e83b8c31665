"""Host cost of an engine step: wall time and device->host reads per decode step, null model.

    python benchmarks/step.py [--json] [--steps N]

64 and 256 running requests of the tiny-hybrid preset (page size 16, eviction every 128
tokens) decode together; after warm-up N decode steps are timed one by one (median), and
the explicit `jax.device_get` calls counted (the runner's one read per step; on CPU, implicit
reads through numpy's buffer protocol cannot be counted, so the older engine, which read
through `np.asarray` / `int`, shows 0 there: the issue that asked for this counted 11). The
script only uses the engine's public surface, so it runs unchanged against an older checkout
for a side-by-side ratio: `PYTHONPATH=/path/to/old/checkout python benchmarks/step.py --json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

try:  # this layout
    from swajax.api import engine_for
    from swajax.serving.null_model import NullModel
    from swajax.serving.options import EngineOptions
    from swajax.serving.sampling_params import SamplingParams
except ImportError:  # the flat layout before the layered one (engines built their own runner)
    from swajax.engine import Engine as engine_for, EngineOptions  # noqa: F401
    from swajax.null_model import NullModel
    from swajax.request import SamplingParams
from swajax import sizing
from swajax.presets import load_preset


def measure(running: int, steps: int) -> dict:
    cfg = load_preset("tiny-hybrid")
    prompt, new = 32, 64 + steps
    sizes = sizing.solve_pool_sizes(cfg, running * (prompt + new + 32), ratio=0.5, page_size=16)
    options = EngineOptions(max_running=running, max_context=prompt + new + 16)
    engine = engine_for(cfg, NullModel(), sizes, options)
    for i in range(running):
        engine.add_request(
            [(i + j) % 1000 for j in range(prompt)], SamplingParams(temperature=0.0, max_tokens=new)
        )
    for _ in range(40):  # prefill and the first decode steps compile every program
        engine.step()
    explicit = [0]
    get = jax.device_get

    def counted_get(*args, **kwargs):
        explicit[0] += 1
        return get(*args, **kwargs)

    jax.device_get = counted_get
    times = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
    finally:
        jax.device_get = get
    return dict(
        running=running,
        # The median: a step that compiles a new bucket (an eviction's first big free) is
        # compile time, not step time; the mean is reported beside it.
        ms_per_step=1e3 * float(np.median(times)),
        mean_ms_per_step=1e3 * float(np.mean(times)),
        device_gets_per_step=explicit[0] / steps,
    )


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    runs = [(8, 3)] if args.smoke else [(64, args.steps), (256, args.steps)]
    rows = [measure(n, steps) for n, steps in runs]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(
            f"{row['running']:4} running: {row['ms_per_step']:7.2f} ms / step (median; mean "
            f"{row['mean_ms_per_step']:.2f}), "
            f"{row['device_gets_per_step']:.1f} device_get / step"
        )


if __name__ == "__main__":
    sys.exit(main())
