"""End-to-end generation: swajax's engine against transformers' generate, same model, same run.

    python benchmarks/end_to_end.py [--json] [--hf-python PATH] [--family qwen3]
        [--prompt-len 40] [--new 32] [--batches 8,1] [--repeats 3] [--decode-steps 1] [--floor]

A fixture model (default the Qwen 3 one: 3 layers, sliding + full; `--family mimo-dense`: a
random MiMo-V2-Flash of the demo's shape), random prompts, greedy, at each batch size. swajax
runs the prompts together through the engine (XLA attention, hybrid pools, compiled
beforehand); transformers runs `generate` on the same batch in the fixtures environment (torch +
transformers, see tools/make_fixtures.py; skipped with a message if absent). Both take the best
of `--repeats` timed runs. Prints tokens / s for both, the ratio and how many of the outputs
are identical.

`--floor` (MiMo-V2-Flash with dense MLPs: `mimo-dense`): the same model as `floor.py`'s bare
jitted decode loop, at one step per program and at `--decode-steps` per program, timed in the
same run, so floor / transformers says how far any engine of this model could get past
transformers on this machine.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _floor_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_floor", Path(__file__).with_name("floor.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def folder(family: str) -> Path:
    """A fixture's folder, or `mimo-dense`: a random MiMo-V2-Flash checkpoint of the demo's
    shape in the layout transformers reads (its SWA layers have twice the full layers' KV heads,
    as the published model does, and `sliding_window` is W + 1), written once per process."""
    if family != "mimo-dense":
        return FIXTURES / family
    config = json.loads((ROOT / "swajax" / "demo" / "config.json").read_text())
    config.update(
        swa_num_key_value_heads=2 * config["num_key_value_heads"],
        sliding_window=config["sliding_window_size"] + 1,
    )
    path = Path(tempfile.mkdtemp(prefix="swajax_e2e_"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)  # ours: gone when the run ends
    _floor_module().random_checkpoint(config, path)
    return path


HF_SCRIPT = """
import sys, time, json, torch, transformers as tf
path, prompts = sys.argv[1], json.loads(sys.stdin.read())
new, repeats = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
model = tf.AutoModelForCausalLM.from_pretrained(
    path, dtype=torch.float32, attn_implementation="eager").eval()
ids = torch.tensor(prompts)
with torch.no_grad():
    model.generate(ids[:2, :16], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm up
    seconds = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        seconds = min(seconds, time.perf_counter() - t0)
print(json.dumps({"seconds": seconds, "tokens": out[:, ids.shape[1]:].tolist()}))
"""


def prompts(n: int, length: int):
    rng = np.random.default_rng(0)
    return rng.integers(3, 128, (n, length)).tolist()


def run_swajax(batch, a):
    from swajax.api import EngineSpec, generate, make_engine
    from swajax.models import load_decoder
    from swajax.serving.sampling_params import SamplingParams

    setup = EngineSpec.of(
        kv_budget_gib=0.05,
        page_size=16,
        chunk_size=None,
        max_running=len(batch),
        max_context=a.prompt_len + a.new + 16,
        decode_steps=a.decode_steps,
    )
    decoder = load_decoder(folder(a.family), dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=a.new)
    generate(make_engine(decoder, setup), batch, params)  # compile every program the run needs
    best = float("inf")
    for _ in range(a.repeats):
        engine = make_engine(decoder, setup)
        t0 = time.perf_counter()
        reqs, _ = generate(engine, batch, params)
        best = min(best, time.perf_counter() - t0)
    return best, [r.output for r in reqs]


def run_transformers(batch, a):
    python = a.hf_python
    if not python or not Path(python).exists():
        return None
    out = subprocess.run(
        [python, "-c", HF_SCRIPT, str(folder(a.family)), str(a.new), str(a.repeats)],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_floor(batch, a):
    """`floor.py`'s bare jitted loop on the same model, best of repeats: (seconds at one step
    per program, its tokens, seconds at `--decode-steps` per program)."""
    floor = _floor_module()
    from swajax.models import load_decoder

    config = json.loads((folder(a.family) / "config.json").read_text())
    if config.get("model_type") != "mimo_v2_flash" or set(
        config.get("mlp_layer_types") or ["dense"]
    ) != {"dense"}:
        raise SystemExit(
            f"--floor: the floor is written for MiMo-V2-Flash with dense MLPs, "
            f"not {folder(a.family)}"
        )
    w = floor.weights_of(load_decoder(folder(a.family), dtype="float32"))
    ids = np.asarray(batch)
    model = floor.Floor(config, len(batch), ids.shape[1] + a.new)
    tokens = floor.run_floor(model, w, ids, a.new)[1]  # compiles
    if not (floor.run_floor(model, w, ids, a.new, a.decode_steps)[1] == tokens).all():
        raise SystemExit(f"the floor at {a.decode_steps} steps per program differs from one")
    best = {1: float("inf"), a.decode_steps: float("inf")}
    for _ in range(a.repeats):
        for steps in best:
            best[steps] = min(best[steps], floor.run_floor(model, w, ids, a.new, steps)[0])
    return best[1], tokens.tolist(), best[a.decode_steps]


def compare(n: int, a) -> dict:
    batch = prompts(n, a.prompt_len)
    seconds, outputs = run_swajax(batch, a)
    generated = n * a.new
    result = dict(batch=n, swajax_tokens_per_s=generated / seconds, swajax_seconds=seconds)
    if a.floor:
        floor_s, floor_tokens, same_steps_s = run_floor(batch, a)
        result.update(
            floor_tokens_per_s=generated / floor_s,
            swajax_over_floor=floor_s / seconds,
            floor_same_steps_tokens_per_s=generated / same_steps_s,
            swajax_over_floor_same_steps=same_steps_s / seconds,
            floor_same_tokens=f"{sum(a == b for a, b in zip(outputs, floor_tokens))}/{n}",
        )
    hf = run_transformers(batch, a)
    if hf is None:
        result["transformers"] = f"skipped: no fixtures environment at {a.hf_python}"
    else:
        result.update(
            transformers_tokens_per_s=generated / hf["seconds"],
            transformers_seconds=hf["seconds"],
            ratio=hf["seconds"] / seconds,
            same_tokens=f"{sum(a == b for a, b in zip(outputs, hf['tokens']))}/{n}",
        )
        if a.floor:
            result["floor_over_transformers"] = hf["seconds"] / floor_s
            result["floor_same_steps_over_transformers"] = hf["seconds"] / same_steps_s
    return result


def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--hf-python", default=os.environ.get("SWAJAX_HF_PYTHON", str(ROOT / ".hfenv/bin/python"))
    )
    parser.add_argument("--family", default="qwen3", help="a folder of tests/fixtures")
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batches", default="8,1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--decode-steps",
        type=int,
        default=1,
        help="swajax's multi-step decode: up to N steps per program",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time floor.py's bare jitted loop of the same model",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompt_len, args.new, args.batches, args.repeats = 8, 4, "2", 1
        args.family, args.floor = "mimo-dense", True
    results = [compare(int(n), args) for n in args.batches.split(",")]
    if args.json:
        print(json.dumps(results))
        return
    for result in results:
        for key, value in result.items():
            print(f"{key:36} {value:.2f}" if isinstance(value, float) else f"{key:36} {value}")
        print()


if __name__ == "__main__":
    sys.exit(main())
