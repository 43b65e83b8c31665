"""Trace and compile time against depth: layers unrolled (each traced on its own) or scanned by
their repeating pattern (`swajax.models.layer_stack`), with the same logits.

    python benchmarks/scan_layers.py [--depths 6,12,24,48] [--json] [--smoke]

The model is the demo's family (MiMo-V2-Flash, dense MLPs, the demo's widths) with its pattern
S S F repeated to each depth and random weights. Each run is one engine from an empty in-process
cache (`jax.clear_caches()`, no persistent cache) serving one 40-token prompt (three prefill
chunks) and 4 decode steps: every program the engine needs is traced, lowered and compiled
once. Seconds per phase come from JAX's own log of each program (`jax_log_compiles`), split
into the programs that hold the model (the fused steps) and the rest (the allocator's and the
engine's small programs, which do not depend on depth). Teacher-forced logits
and greedy tokens of the two forms must agree (1e-5 relative; scanning changes XLA's fusion,
not the arithmetic).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path

os.environ.setdefault("SWAJAX_COMPILE_CACHE", "off")

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "swajax" / "demo"


def random_decoder(depth: int, seed: int = 0):
    from flax import nnx

    from swajax.models.decoder import Decoder
    from swajax.models.loading import decoder_spec

    config = json.loads((DEMO / "config.json").read_text())
    kinds = ["sliding_attention", "sliding_attention", "full_attention"]
    config = dict(
        config,
        num_hidden_layers=depth,
        layer_types=(kinds * depth)[:depth],
        mlp_layer_types=["dense"] * depth,
    )
    decoder = Decoder(decoder_spec(config))
    rng = np.random.default_rng(seed)

    def rand(x):
        if x.ndim < 2:  # norms and sinks
            return (1 + 0.1 * rng.standard_normal(x.shape)).astype(x.dtype)
        return (rng.standard_normal(x.shape) * x.shape[-2] ** -0.5).astype(x.dtype)

    nnx.update(decoder, jax.tree.map(rand, nnx.state(decoder, nnx.Param)))
    return decoder


PHASES = {
    "trace": re.compile(r"Finished tracing (\S+) for jit in ([\d.]+) sec"),
    "lower": re.compile(r"Finished jaxpr to MLIR module conversion (\S+) in ([\d.]+) sec"),
    "compile": re.compile(r"Finished XLA compilation of (\S+) in ([\d.]+) sec"),
}
MODEL_PROGRAMS = re.compile(r"fused|forward")  # the runner's step programs, or the model's own


@contextlib.contextmanager
def program_log():
    """Collects (phase, program, seconds) of every program made inside the block."""
    found = []

    class Collect(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            for phase, pattern in PHASES.items():
                if m := pattern.search(message):
                    found.append((phase, m.group(1), float(m.group(2))))

    logger, handler = logging.getLogger("jax"), Collect()
    jax.config.update("jax_log_compiles", True)
    logger.addHandler(handler)
    old = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old[0])
        logger.propagate = old[1]
        jax.config.update("jax_log_compiles", False)


def run(decoder, scan: bool, prompt: list[int], new: int) -> dict:

    jax.clear_caches()
    with program_log() as log:
        wall, logits, tokens = _serve(decoder, scan, prompt, new)
    seconds = {f"{part}_{phase}_s": 0.0 for part in ("model", "rest") for phase in PHASES}
    for phase, name, secs in log:
        seconds[f"{'model' if MODEL_PROGRAMS.search(name) else 'rest'}_{phase}_s"] += secs
    programs = sorted({name for _, name, _ in log if MODEL_PROGRAMS.search(name)})
    return dict(wall_s=wall, **seconds, model_programs=programs, logits=logits, tokens=tokens)


def _serve(decoder, scan, prompt, new):
    from swajax import sizing
    from swajax.api import engine_for
    from swajax.models.decoder import HybridLM
    from swajax.serving.options import EngineOptions
    from swajax.serving.sampling_params import SamplingParams

    t0 = time.perf_counter()
    model = HybridLM(decoder, dtype="fp32", scan_layers=scan)
    cfg = model.spec.hybrid
    sizes = sizing.solve_pool_sizes(cfg, 1024, ratio=0.5, page_size=16)
    options = EngineOptions(max_running=2, max_context=128, chunk_size=16)
    engine = engine_for(cfg, model, sizes, options)
    rid = engine.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=new), keep_logits=True
    )
    engine.run()
    wall = time.perf_counter() - t0
    req = engine.requests[rid]
    return wall, np.stack(req.logits[: len(prompt)]), list(req.output)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="6,12,24,48")
    p.add_argument("--new", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    depths = [6] if a.smoke else [int(d) for d in a.depths.split(",")]
    prompt = [int(t) for t in np.random.default_rng(1).integers(1, 250, 40)]
    rows = []
    for depth in depths:
        decoder = random_decoder(depth)
        unrolled, scanned = run(decoder, False, prompt, a.new), run(decoder, True, prompt, a.new)
        ref = unrolled.pop("logits")
        err = float(np.max(np.abs(scanned.pop("logits") - ref)) / np.max(np.abs(ref)))
        if err > 1e-5 or scanned["tokens"] != unrolled["tokens"]:
            raise SystemExit(f"depth {depth}: scanned and unrolled differ (logits {err:.2e})")
        for r in (unrolled, scanned):
            r["model_s"] = sum(r[f"model_{phase}_s"] for phase in PHASES)
            r["rest_s"] = sum(r[f"rest_{phase}_s"] for phase in PHASES)
        rows.append(
            dict(
                depth=depth,
                unrolled=unrolled,
                scanned=scanned,
                logits_rel_err=err,
                model_ratio=unrolled["model_s"] / scanned["model_s"],
            )
        )
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        "seconds to make the model's programs (trace / lower / compile), the other programs', "
        "and the whole run"
    )
    print(
        f"{'depth':>5} {'form':>9} {'trace':>6} {'lower':>6} {'compile':>8} {'model':>6} "
        f"{'rest':>6} {'wall':>6} {'unrolled/scanned':>17}"
    )
    for r in rows:
        for form in ("unrolled", "scanned"):
            x = r[form]
            ratio = f"{r['model_ratio']:17.2f}" if form == "scanned" else ""
            print(
                f"{r['depth']:>5} {form:>9} {x['model_trace_s']:6.2f} {x['model_lower_s']:6.2f} "
                f"{x['model_compile_s']:8.2f} {x['model_s']:6.2f} {x['rest_s']:6.2f} "
                f"{x['wall_s']:6.2f} {ratio}"
            )
    print("programs holding the model:", ", ".join(rows[-1]["scanned"]["model_programs"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
