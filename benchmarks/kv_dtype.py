"""What an FP8 KV cache costs in accuracy, per fixture family, against float32 KV.

    python benchmarks/kv_dtype.py [--families gpt_oss,qwen3] [--json]

Each family's tiny transformers-made fixture (tests/fixtures) runs through the engine (paged
pools, chunked prefill, eviction every step) on its 24-token prompt plus 8 greedy tokens, with
float32 parameters and the KV pools in fp32, bf16, fp8_e4m3 and fp8_e5m2. Printed per KV dtype:
the largest logit error over the prompt positions relative to the largest fp32 logit, and how
many of the 8 greedy tokens equal the fp32 run's. The fixtures carry random weights, whose
near-flat distributions make greedy ties common: read agreement as a lower bound.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np

from swajax import sizing
from swajax.api import engine_for
from swajax.models import HybridLM, load_decoder
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
FAMILIES = (
    "gpt_oss",
    "mimo_v2_flash",
    "llama4",
    "gemma3",
    "qwen3",
    "mistral",
    "qwen2",
    "olmo3",
    "exaone4",
    "cohere2",
    "gemma4",
    "gemma4_e",
    "step3p7",
)
KV = ("fp32", "bf16", "fp8_e4m3", "fp8_e5m2")


def run(path: Path, kv: str) -> tuple[np.ndarray, list[int]]:
    model = HybridLM(load_decoder(path), dtype=kv)
    sizes = sizing.solve_pool_sizes(model.spec.hybrid, 256, ratio=0.5, page_size=4)
    options = EngineOptions(max_running=4, max_context=64, chunk_size=8, eviction_interval=1)
    engine = engine_for(model.spec.hybrid, model, sizes, options)
    prompt = json.loads((path / "greedy.json").read_text())["prompt"]
    rid = engine.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=8), keep_logits=True
    )
    engine.run()
    req = engine.requests[rid]
    # Each run compiles its own programs: dropping them keeps a long sweep under the
    # process's memory-map limit (LLVM fails past ~65k mappings).
    jax.clear_caches()
    return np.stack(req.logits[: len(prompt)]), req.output


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args(argv)
    rows = []
    kinds = KV[2:3] if a.smoke else KV[1:]
    for family in ["qwen3"] if a.smoke else a.families.split(","):
        ref, ref_out = run(FIXTURES / family, "fp32")
        row = {"family": family}
        for kv in kinds:
            logits, out = run(FIXTURES / family, kv)
            err = float(np.max(np.abs(logits - ref)) / np.max(np.abs(ref)))
            row[kv] = dict(rel_err=err, greedy=sum(x == y for x, y in zip(out, ref_out)))
        rows.append(row)
        if not a.json:
            cells = "  ".join(f"{row[kv]['rel_err']:8.4f} {row[kv]['greedy']}/8" for kv in kinds)
            print(f"{family:14s}  {cells}", flush=True)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
