"""End-to-end generation: swajax's engine against transformers' generate, same model, same run.

    python benchmarks/end_to_end.py [--json] [--hf-python PATH]

The GPT-OSS fixture family (4 layers, alternating sliding / full, sinks, MoE), 256-token
prompts, 64 generated tokens each, greedy, at batch 16 and at batch 1. swajax runs the prompts
together through the engine (XLA attention, hybrid pools); transformers runs `generate` on the
same batch in the fixtures environment (torch + transformers, see tools/make_fixtures.py), which
is skipped with a message if absent. Prints tokens / s for both, the ratio and how many of the
outputs are identical.
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
FIXTURE = ROOT / "tests" / "fixtures" / "gpt_oss"
N_PROMPTS, PROMPT_LEN, NEW = 16, 256, 64

HF_SCRIPT = """
import sys, time, json, torch, transformers as tf
path, prompts, new = sys.argv[1], json.loads(sys.stdin.read()), int(sys.argv[2])
torch.set_num_threads(2)
model = tf.AutoModelForCausalLM.from_pretrained(
    path, dtype=torch.float32, attn_implementation="eager").eval()
ids = torch.tensor(prompts)
with torch.no_grad():
    model.generate(ids[:2, :16], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm up
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "tokens": out[:, ids.shape[1]:].tolist()}))
"""


def prompts(n: int):
    rng = np.random.default_rng(0)
    return rng.integers(3, 128, (n, PROMPT_LEN)).tolist()


def run_swajax(batch):
    from swajax.cli.generate import Setup, generate, make_engine
    from swajax.models import load_decoder
    from swajax.serving.request import SamplingParams

    setup = Setup(
        kv_budget_gib=0.05,
        page_size=16,
        chunk_size=None,
        max_running=N_PROMPTS,
        max_context=PROMPT_LEN + NEW + 16,
    )
    decoder = load_decoder(FIXTURE)
    warm = make_engine(decoder, setup)  # compile every program the run needs
    generate(warm, batch, SamplingParams(max_new_tokens=NEW))
    engine = make_engine(decoder, setup)
    t0 = time.perf_counter()
    reqs, _ = generate(engine, batch, SamplingParams(max_new_tokens=NEW))
    return time.perf_counter() - t0, [r.output for r in reqs]


def run_transformers(batch, python):
    if not python or not Path(python).exists():
        return None
    out = subprocess.run(
        [python, "-c", HF_SCRIPT, str(FIXTURE), str(NEW)],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(n: int, hf_python: str) -> dict:
    batch = prompts(n)
    seconds, outputs = run_swajax(batch)
    generated = n * NEW
    result = dict(batch=n, swajax_tokens_per_s=generated / seconds, swajax_seconds=seconds)
    hf = run_transformers(batch, hf_python)
    if hf is None:
        result["transformers"] = f"skipped: no fixtures environment at {hf_python}"
    else:
        result.update(
            transformers_tokens_per_s=generated / hf["seconds"],
            transformers_seconds=hf["seconds"],
            ratio=hf["seconds"] / seconds,
            same_tokens=f"{sum(a == b for a, b in zip(outputs, hf['tokens']))}/{n}",
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--hf-python", default=os.environ.get("SWAJAX_HF_PYTHON", str(ROOT / ".hfenv/bin/python"))
    )
    args = parser.parse_args()
    results = [compare(n, args.hf_python) for n in (N_PROMPTS, 1)]
    if args.json:
        print(json.dumps(results))
        return
    for result in results:
        for key, value in result.items():
            print(f"{key:26} {value:.2f}" if isinstance(value, float) else f"{key:26} {value}")
        print()


if __name__ == "__main__":
    sys.exit(main())
