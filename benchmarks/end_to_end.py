"""End-to-end generation: swajax's engine against transformers' generate, same model, same run.

    python benchmarks/end_to_end.py [--json] [--hf-python PATH] [--family qwen3]
        [--prompt-len 40] [--new 32] [--batches 8,1] [--repeats 3] [--decode-steps 1]

A fixture model (default the Qwen 3 one: 3 layers, sliding + full), random prompts, greedy, at
each batch size. swajax runs the prompts together through the engine (XLA attention, hybrid
pools, compiled beforehand); transformers runs `generate` on the same batch in the fixtures
environment (torch + transformers, see tools/make_fixtures.py; skipped with a message if
absent). Both take the best of `--repeats` timed runs. Prints tokens / s for both, the ratio and
how many of the outputs are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

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
    decoder = load_decoder(FIXTURES / a.family)
    params = SamplingParams(max_new_tokens=a.new)
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
        [python, "-c", HF_SCRIPT, str(FIXTURES / a.family), str(a.new), str(a.repeats)],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(n: int, a) -> dict:
    batch = prompts(n, a.prompt_len)
    seconds, outputs = run_swajax(batch, a)
    generated = n * a.new
    result = dict(batch=n, swajax_tokens_per_s=generated / seconds, swajax_seconds=seconds)
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
    parser.add_argument("--decode-steps", type=int, default=1,
                        help="swajax's multi-step decode: up to N steps per program")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompt_len, args.new, args.batches, args.repeats = 8, 4, "2", 1
    results = [compare(int(n), args) for n in args.batches.split(",")]
    if args.json:
        print(json.dumps(results))
        return
    for result in results:
        for key, value in result.items():
            print(f"{key:26} {value:.2f}" if isinstance(value, float) else f"{key:26} {value}")
        print()


if __name__ == "__main__":
    sys.exit(main())
