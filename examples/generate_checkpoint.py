"""Generate with a Hugging Face checkpoint directory through the public API.

    python examples/generate_checkpoint.py [DIR]      # default: the GPT-OSS test fixture

Loads config.json + *.safetensors (no torch), sizes hybrid pools for a small budget, and runs a
two-turn conversation: the second turn extends the first (prompt + reply) and hits the prefix
cache.
"""

import sys
from pathlib import Path

import swajax

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpt_oss"


def main(path=DEFAULT):
    llm = swajax.LLM(str(path), kv_budget_gib=0.001, page_size=4, eviction_interval=128)
    params = swajax.SamplingParams(temperature=0.0, max_tokens=8)
    prompt = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27]
    (first,) = llm.generate([prompt], params)[0].outputs
    (result,) = llm.generate([prompt + first.token_ids + [9, 10]], params)
    second = result.outputs[0]
    summary = llm.summary()
    reused = result.num_cached_tokens
    print("first:", first.token_ids, "second:", second.token_ids, "reused:", reused)
    print("memory:", summary)
    return first.token_ids, second.token_ids, summary


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
