"""Build tests/fixtures/sampling/processors.npz: transformers' logits processors applied to
fixed random logits, the oracle of swajax's sampler (tests/models/test_sampling.py).

Run in the fixture environment (see tools/make_fixtures.py for how to make it):

    .hfenv/bin/python tools/make_sampling_fixtures.py

Each case applies, in the order `generate` chains them, the repetition penalty (over the prompt
and output tokens of each row) and the temperature / top-k / top-p / min-p warpers to the same
logits, and stores the processed scores (-inf where a token is filtered out).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sampling"
ROWS, PROMPT, OUTPUT = 6, 10, 6

# (name, vocab, repetition_penalty, temperature, top_k, top_p, min_p); None: processor absent.
CASES = [
    ("repetition_up", 40, 1.3, None, None, None, None),
    ("repetition_down", 40, 0.7, None, None, None, None),
    ("temperature", 40, None, 0.7, None, None, None),
    ("top_k", 40, None, 1.0, 5, None, None),
    ("top_k_over_vocab", 40, None, 1.0, 64, None, None),
    ("top_p", 40, None, 0.8, None, 0.6, None),
    ("min_p", 40, None, 1.2, None, None, 0.15),
    ("chain", 40, 1.2, 0.9, 12, 0.85, 0.05),
    ("chain_small_vocab", 8, 1.5, 0.8, 6, 0.95, 0.02),
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    arrays, meta = {}, []
    for name, vocab, rep, temp, top_k, top_p, min_p in CASES:
        logits = (rng.normal(size=(ROWS, vocab)) * 2.0).astype(np.float32)
        ids = rng.integers(0, vocab, size=(ROWS, PROMPT + OUTPUT)).astype(np.int64)
        chain = LogitsProcessorList()
        if rep is not None:
            chain.append(RepetitionPenaltyLogitsProcessor(rep))
        if temp is not None:
            chain.append(TemperatureLogitsWarper(temp))
        if top_k is not None:
            chain.append(TopKLogitsWarper(top_k))
        if top_p is not None:
            chain.append(TopPLogitsWarper(top_p))
        if min_p is not None:
            chain.append(MinPLogitsWarper(min_p))
        out = chain(torch.from_numpy(ids), torch.from_numpy(logits.copy())).numpy()
        arrays[f"{name}.logits"], arrays[f"{name}.ids"], arrays[f"{name}.out"] = logits, ids, out
        meta.append(
            dict(
                name=name,
                vocab=vocab,
                repetition_penalty=rep,
                temperature=temp,
                top_k=top_k,
                top_p=top_p,
                min_p=min_p,
            )
        )
    np.savez_compressed(OUT / "processors.npz", **arrays)
    (OUT / "cases.json").write_text(json.dumps(dict(prompt=PROMPT, cases=meta), indent=1) + "\n")
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()
