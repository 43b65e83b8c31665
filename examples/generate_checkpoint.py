"""Generate with a Hugging Face checkpoint directory through the engine.

    python examples/generate_checkpoint.py [DIR]      # default: the GPT-OSS test fixture

Loads config.json + *.safetensors (no torch), sizes hybrid pools for a small budget, and runs a
two-turn conversation: the second turn extends the first (prompt + reply) and hits the prefix
cache.
"""

import sys
from pathlib import Path

from swajax.api import EngineSpec, generate, make_engine
from swajax.models import load_decoder
from swajax.serving.request import SamplingParams

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpt_oss"


def main(path=DEFAULT):
    setup = EngineSpec.of(kv_budget_gib=0.001, page_size=4, eviction_interval=128)
    engine = make_engine(load_decoder(path), setup)
    prompt = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27]
    first, _ = generate(engine, [prompt], SamplingParams(max_new_tokens=8))
    turn2 = prompt + first[0].output + [9, 10]
    second, summary = generate(engine, [turn2], SamplingParams(max_new_tokens=8))
    print("first:", first[0].output, "second:", second[0].output)
    print("memory:", summary)
    return first[0].output, second[0].output, summary


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
